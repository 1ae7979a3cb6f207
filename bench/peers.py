"""Peer virtualenvs under ``bench/.peers/`` (git-ignored), built from the package registry and cached.

Each peer (Ray Data, Petastorm) runs in its own virtualenv so its pins never
touch the project's ``.venv``: :class:`PeerVenv` names it, its requirements
and constraints files, and the distributions whose versions its stamp records.
It is re-created only when those files change (their hash is in the stamp);
when it cannot be built (no network, no wheel for this Python, a resolver
conflict) :meth:`PeerVenv.ensure` raises :class:`PeerUnavailable` whose
message is the row's skip reason. The TF Transform peer (:mod:`bench.tft`)
predates this module and keeps its own copy of the same steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"
#: pip's whole install, generously: a minute with a warm cache, several (pyspark is 450 MB) on a cold one.
INSTALL_TIMEOUT_S = 1800


class PeerUnavailable(Exception):
    """The peer virtualenv cannot be built or used; the message says why."""


def python311() -> str:
    """The interpreter the peers' venvs are made with (the project's Python)."""
    found = shutil.which("python3.11")
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise PeerUnavailable("python3.11 is not on PATH (the peers' pins are for Python 3.11)")


def clean_env() -> dict[str, str]:
    """This process's environment without what would point pip or Python at the project's venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}


@dataclasses.dataclass(frozen=True)
class PeerVenv:
    """One peer's virtualenv: ``bench/.peers/<name>``, built from ``requirements`` with ``constraints``."""

    name: str
    label: str
    requirements: Path
    constraints: Path
    dists: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.name.endswith("-venv") or "/" in self.name:
            raise ValueError(f"a peer virtualenv's name is a plain '<peer>-venv', found {self.name!r}")
        for p in (self.requirements, self.constraints):
            if not p.is_file():
                raise ValueError(f"{self.label}: {p} does not exist")

    @property
    def path(self) -> Path:
        return PEERS / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def stamp_path(self) -> Path:
        return self.path / ".bench-stamp.json"

    def requirements_hash(self) -> str:
        h = hashlib.sha256()
        for p in (self.requirements, self.constraints):
            h.update(p.read_bytes())
        return h.hexdigest()[:16]

    def read_stamp(self) -> dict[str, Any] | None:
        try:
            stamp = json.loads(self.stamp_path.read_text())
        except (OSError, ValueError):
            return None
        if stamp.get("requirements") != self.requirements_hash() or not self.python.exists():
            return None
        return stamp

    def ensure(self, log=print) -> dict[str, Any]:
        """Build the virtualenv unless an up-to-date one is there; return its stamp (versions,
        install seconds). Raises :class:`PeerUnavailable` with the reason."""
        stamp = self.read_stamp()
        if stamp is not None:
            return stamp
        shutil.rmtree(self.path, ignore_errors=True)
        PEERS.mkdir(parents=True, exist_ok=True)
        log_path = PEERS / f"{self.name}-install.log"
        log(f"{self.label}: building the peer virtualenv {self.path} (pip log: {log_path})")
        t0 = time.perf_counter()
        py = str(self.python)
        steps = [[python311(), "-m", "venv", str(self.path)],
                 [py, "-m", "pip", "install", "--upgrade", "pip"],
                 [py, "-m", "pip", "install", "-r", str(self.requirements), "-c", str(self.constraints)]]
        with open(log_path, "w") as out:
            for cmd in steps:
                try:
                    rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
                                        timeout=INSTALL_TIMEOUT_S).returncode
                except (OSError, subprocess.TimeoutExpired) as e:
                    rc = -1
                    out.write(f"{type(e).__name__}: {e}\n")
                if rc != 0:
                    shutil.rmtree(self.path, ignore_errors=True)
                    out.flush()
                    tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
                    raise PeerUnavailable(f"building the {self.label} virtualenv failed at `{' '.join(cmd[-4:])}` "
                                          f"(exit {rc}): {tail} (full log: {log_path})")
        seconds = time.perf_counter() - t0
        probe = ("import importlib.metadata as m, platform, json, sys; "
                 f"print(json.dumps({{d: m.version(d) for d in {list(self.dists)!r}}} | "
                 "{'python': platform.python_version()}))")
        try:
            versions = json.loads(subprocess.run([py, "-c", probe], capture_output=True, text=True,
                                                 env=clean_env(), timeout=120, check=True).stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            raise PeerUnavailable(f"the {self.label} virtualenv was built but does not run: {e}") from e
        stamp = {"requirements": self.requirements_hash(), "install_seconds": round(seconds, 1),
                 "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "versions": versions}
        self.stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
        log(f"{self.label}: peer virtualenv ready in {seconds:.0f} s: {versions}")
        return stamp

    def child_env(self) -> dict[str, str]:
        """What a measured child in this venv gets on top of the parent's environment: the repo root
        only on ``PYTHONPATH`` (for ``bench.*``), nothing of the project's environment."""
        return {"PYTHONPATH": str(HERE.parent), "VIRTUAL_ENV": str(self.path)}


def break_even_epochs(convert_s: float, examples_per_epoch: int, converted_rate: float, parquet_rate: float,
                      parquet_setup_s: float = 0.0) -> float | None:
    """Epochs after which "convert once, then read the shards" has cost less wall time than
    reading Parquet (and transforming in TensorFlow) every epoch.

    ``convert_s``: the conversion's wall time; ``converted_rate`` / ``parquet_rate``:
    examples/s fed to training from the converted shards / from Parquet;
    ``parquet_setup_s``: what the Parquet path pays once too (adapting its
    preprocessing layers on the training split). Solves
    ``convert_s + E * n / converted_rate = parquet_setup_s + E * n / parquet_rate``
    for ``E``; 0 when converting costs no more than that set-up, ``None`` when the
    converted shards feed no faster (the Parquet path then never costs more).
    """
    if examples_per_epoch <= 0 or converted_rate <= 0 or parquet_rate <= 0 or convert_s < 0 or parquet_setup_s < 0:
        raise ValueError("break_even_epochs needs positive rates and examples, and non-negative seconds; found "
                         f"convert_s={convert_s}, examples_per_epoch={examples_per_epoch}, converted_rate="
                         f"{converted_rate}, parquet_rate={parquet_rate}, parquet_setup_s={parquet_setup_s}")
    extra = convert_s - parquet_setup_s
    if extra <= 0:
        return 0.0
    saved_per_epoch = examples_per_epoch / parquet_rate - examples_per_epoch / converted_rate
    if saved_per_epoch <= 0:
        return None
    return extra / saved_per_epoch


def setup_main(venv: PeerVenv, module: str) -> None:
    """``python -m <module> --setup``: build (or check) ``venv`` and print its versions."""
    import sys

    if sys.argv[1:] != ["--setup"]:
        sys.exit(f"usage: python -m {module} --setup  (builds or checks bench/.peers/{venv.name})")
    try:
        stamp = venv.ensure()
    except PeerUnavailable as e:
        sys.exit(f"{venv.label} peer unavailable: {e}")
    print(f"{venv.path}: {stamp['versions']} (built {stamp['built']} in {stamp['install_seconds']} s)")
