"""Running a C module of convert/ built with AddressSanitizer and UBSan: for the
tests that feed those modules hostile input and compare them with their Python
paths (any finding aborts the run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import convert

#: Loads the sanitized build (``sys.argv[1]``) as ``mod`` before the script runs, and
#: gives it ``refused(errors, call, *args)``: whether the call raised one of ``errors``.
_PROLOGUE = """
import importlib.util, sys
_spec = importlib.util.spec_from_file_location("convert.{module}", sys.argv[1])
mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mod)

def refused(errors, call, *args):
    try:
        call(*args)
    except errors:
        return True
    return False
"""


def run_sanitized(module: str, script: str, tmp_path: Path, timeout: float = 300) -> None:
    """Build ``convert/<module>.c`` with ASan and UBSan into ``tmp_path``, then run
    ``script`` (Python source, with the built module as ``mod`` and ``refused``; it prints ``ok``
    when done) with the sanitizer runtimes preloaded, and assert it finished
    cleanly. Skips where there is no compiler or runtime."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    runtimes = [subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so")]
    if not all(Path(r).is_absolute() and Path(r).exists() for r in runtimes):
        pytest.skip(f"{cc} has no AddressSanitizer/UBSan runtime ({runtimes})")
    src = Path(convert.__file__).with_name(f"{module}.c")
    so = tmp_path / (module + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-fno-omit-frame-pointer", "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}",
                    str(src), "-o", str(so)], check=True, timeout=120)
    # PYTHONMALLOC=malloc: Python's own objects (the bytearrays written into) in memory ASan watches
    env = {**os.environ, "LD_PRELOAD": " ".join(runtimes), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1", "PYTHONMALLOC": "malloc"}
    out = subprocess.run([sys.executable, "-c", _PROLOGUE.format(module=module) + script, str(so)],
                         capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]

