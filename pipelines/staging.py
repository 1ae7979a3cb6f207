"""Ship this package to remote Beam workers without a setup.py.

Remote runners (Dataflow, a Flink/Spark job server with Docker workers)
unpickle our DoFns on machines that have Beam but not recordprep. Beam's way
to ship code is ``--extra_package``: a wheel its stager uploads and the
worker's boot process pip-installs. We build that wheel here, from the
modules this process actually imported, so it works the same for an editable
checkout and for an installed release.

The wheel is written by hand rather than by ``pip wheel``/``build``: those
need a build backend, possibly network access and the source tree, none of
which a launcher (an Airflow task, a container) reliably has; a pure-Python
wheel is a zip with three metadata files. Its ``Requires-Dist`` lists only the
base dependencies, never the ``tf`` extra, so workers do not install
TensorFlow.

The wheel is tagged ``py3-none-any`` and also carries the compiled modules
this interpreter loads (``convert._tokens``, ``_example``, ``_tfrecord``), under
their full extension file names (``_tokens.cpython-311-x86_64-linux-gnu.so``).
Python imports an extension only by its own platform's and version's name, so
a worker like the launcher (Dataflow's default workers for a Linux x86_64
launcher) loads them, and any other worker cannot see them and runs the Python
paths, which give the same output.
"""

from __future__ import annotations

import atexit
import base64
import hashlib
import io
import os
import shutil
import sysconfig
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

DIST_NAME = "recordprep"
PACKAGES = ("convert", "pipelines", "readers", "stores")

#: Runners that execute in this process or on this machine's Python: the
#: package is already importable there.
LOCAL_RUNNERS = frozenset({
    "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
    "InteractiveRunner", "PrismRunner",
})

#: Flags by which a user ships code themselves; we then leave staging to them.
_USER_STAGING_FLAGS = ("--setup_file", "--extra_package", "--extra_packages", "--sdk_location")


def _version() -> str:
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _base_requirements() -> list[str]:
    try:
        reqs = metadata.requires(DIST_NAME) or []
    except metadata.PackageNotFoundError:
        return []
    return [r for r in reqs if "extra ==" not in r.replace("extra==", "extra ==")]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _package_files() -> list[tuple[str, Path]]:
    """The packages' sources and compiled modules, as (name in the wheel, path)."""
    # Only the full platform suffix: a bare ``.so`` or ``.abi3.so`` would be importable elsewhere.
    ext = sysconfig.get_config_var("EXT_SUFFIX") or ".invalid"
    files: list[tuple[str, Path]] = []
    for pkg in PACKAGES:
        mod = __import__(pkg)
        root = Path(mod.__file__).resolve().parent
        for path in sorted([*root.rglob("*.py"), *root.rglob(f"*{ext}")]):
            if "__pycache__" in path.parts:
                continue
            files.append((f"{pkg}/{path.relative_to(root).as_posix()}", path))
    return files


def build_wheel(dest_dir: str | os.PathLike[str]) -> str:
    """Write ``recordprep-<version>-py3-none-any.whl`` into ``dest_dir``; return its path.

    Deterministic: the same sources give the same bytes (fixed timestamps,
    sorted entries), so Beam's stager, which keys uploads on content, does
    not upload it again for every job.
    """
    version = _version()
    safe_version = version.replace("-", "_")
    dist_info = f"{DIST_NAME}-{safe_version}.dist-info"
    entries: list[tuple[str, bytes]] = [(name, path.read_bytes()) for name, path in _package_files()]
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {DIST_NAME}",
        f"Version: {version}",
        "Summary: recordprep conversion code staged for Beam workers (no TensorFlow)",
        "Requires-Python: >=3.11",
        *(f"Requires-Dist: {r}" for r in _base_requirements()),
    ]
    entries.append((f"{dist_info}/METADATA", ("\n".join(meta) + "\n").encode()))
    entries.append((f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: recordprep.staging\n"
                                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    entries.append((f"{dist_info}/top_level.txt", ("\n".join(PACKAGES) + "\n").encode()))
    record = "\n".join(_record_line(n, d) for n, d in entries) + f"\n{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode()))

    path = Path(dest_dir) / f"{DIST_NAME}-{safe_version}-py3-none-any.whl"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    path.write_bytes(buf.getvalue())
    return str(path)


def needs_staging(runner: str | None, beam_args: tuple[str, ...] | list[str]) -> bool:
    """True for remote runners unless the user ships code themselves.

    Portable runners with EXTERNAL/LOOPBACK/PROCESS environments run workers
    from a Python the user set up (the package is importable there);
    the default DOCKER environment and Dataflow need the wheel.
    """
    if runner is None or runner.split(".")[-1] in LOCAL_RUNNERS:
        return False
    from pipelines.options import beam_flag

    if any(beam_flag(beam_args, f) is not None for f in _USER_STAGING_FLAGS):
        return False
    env = beam_flag(beam_args, "--environment_type")
    return not (env and env.upper() in ("EXTERNAL", "LOOPBACK", "PROCESS", "EMBEDDED"))


def staging_args(runner: str | None, beam_args: tuple[str, ...] | list[str]) -> list[str]:
    """Beam flags that ship this package (``[]`` when not needed)."""
    if not needs_staging(runner, beam_args):
        return []
    tmp = tempfile.mkdtemp(prefix="recordprep-stage-")
    atexit.register(shutil.rmtree, tmp, True)  # the wheel is needed until submission
    wheel = build_wheel(tmp)
    return ["--extra_package", wheel]
