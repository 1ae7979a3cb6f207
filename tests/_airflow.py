"""Apache Airflow in a virtualenv of its own, for the scheduling-example tests.

:func:`ensure_venv` builds ``~/.cache/recordprep/airflow-venv`` (``$XDG_CACHE_HOME``
honoured) with pip from the package registry, every package pinned by
``examples/schedule/airflow-requirements.txt``; it is rebuilt only when that
file (or the Python version) changes, so later runs reuse it, fresh clones of
the repository included (a registry that refuses some requests for a while
then costs one build, not every clone's). Airflow never
enters the project's ``.venv``: the DAGs' tasks run ``.venv/bin/recordprep``
as a command. :func:`deployment` makes an ``AIRFLOW_HOME`` (SQLite database,
DAGs folder) in a temp dir and returns the environment Airflow's CLI needs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "examples" / "schedule" / "airflow-requirements.txt"
VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recordprep" / "airflow-venv"
STAMP = VENV / ".stamp.json"
#: pip's whole install, generously: well under a minute with a warm registry, a few on a slow one.
INSTALL_TIMEOUT_S = 900
#: Pauses before pip runs again after a failure: a registry proxy that refuses some requests for a
#: while (HTTP 403 on the tunnel) makes pip give up on one package; a later attempt usually goes through.
INSTALL_RETRY_PAUSES_S = (15, 45)
#: Variables an Airflow process must not inherit from the test's (the project's virtualenv).
_DROP = ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV", "PYTHONHOME")


class AirflowUnavailable(Exception):
    """Airflow's virtualenv cannot be built or run; the message says why."""


def _key() -> str:
    h = hashlib.sha256(REQUIREMENTS.read_bytes())
    h.update(sys.version.encode())
    return h.hexdigest()[:16]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith("AIRFLOW")}


def airflow_bin() -> Path:
    return VENV / "bin" / "airflow"


def ensure_venv() -> dict:
    """Build the virtualenv unless an up-to-date one is there; return its stamp (version,
    install seconds). Raises :class:`AirflowUnavailable` with pip's last lines on failure."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "airflow-venv.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # two test processes never build it at once
        try:
            stamp = json.loads(STAMP.read_text())
            if stamp.get("key") == _key() and airflow_bin().exists():
                return stamp
        except (OSError, ValueError):
            pass
        return _build()


def _build() -> dict:
    shutil.rmtree(VENV, ignore_errors=True)
    log_path = VENV.parent / "airflow-venv-install.log"
    python = VENV / "bin" / "python"
    requirements = REQUIREMENTS.relative_to(ROOT)
    steps = {f"python -m venv {VENV}": [sys.executable, "-m", "venv", str(VENV)],
             f"pip install -r {requirements}": [str(python), "-m", "pip", "install", "--quiet", "--retries", "5",
                                                 "--timeout", "30", "-r", str(REQUIREMENTS)]}
    t0 = time.perf_counter()
    with open(log_path, "w") as out:
        for step, cmd in steps.items():
            for pause in (*INSTALL_RETRY_PAUSES_S, None):
                rc = _run_step(cmd, out)
                if rc == 0 or pause is None or time.perf_counter() - t0 > INSTALL_TIMEOUT_S:
                    break
                out.write(f"-- `{step}` exited {rc}; again in {pause} s\n")
                out.flush()
                time.sleep(pause)
            if rc != 0:
                out.flush()
                shutil.rmtree(VENV, ignore_errors=True)
                tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
                raise AirflowUnavailable(
                    f"could not build Airflow's virtualenv (`{step}` exited {rc}; is the package "
                    f"registry reachable?): {tail} (full log: {log_path})")
    seconds = time.perf_counter() - t0
    try:
        version = subprocess.run([str(airflow_bin()), "version"], capture_output=True, text=True, check=True,
                                 env={**_clean_env(), "AIRFLOW_HOME": str(VENV / "home")}, timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise AirflowUnavailable(f"Airflow's virtualenv was built but `airflow version` fails: {e}") from e
    stamp = {"key": _key(), "install_seconds": round(seconds, 1), "airflow": version.strip().splitlines()[-1]}
    STAMP.write_text(json.dumps(stamp) + "\n")
    return stamp


def _run_step(cmd: list[str], out: Any) -> int:
    try:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=_clean_env(),
                              timeout=INSTALL_TIMEOUT_S).returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        out.write(f"{type(e).__name__}: {e}\n")
        return -1


def migrated_db(directory: Path) -> Path:
    """An empty Airflow database (``airflow db migrate``) to copy into each deployment."""
    home = directory / "template"
    home.mkdir(parents=True, exist_ok=True)
    env = deployment_env(home)
    r = subprocess.run([str(airflow_bin()), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AirflowUnavailable(f"`airflow db migrate` failed: {(r.stdout + r.stderr)[-2000:]}")
    return home / "airflow.db"


def deployment_env(home: Path) -> dict[str, str]:
    """The environment of one Airflow deployment at ``home`` (SQLite, no examples, DAGs in home/dags).

    Its ``bin`` leads PATH: a backfill starts ``airflow tasks run`` by name.
    """
    return {
        **_clean_env(),
        "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }


def deployment(home: Path, db: Path, dag_file: Path) -> dict[str, str]:
    """An Airflow home holding a copy of ``db`` and of ``dag_file``; its environment."""
    (home / "dags").mkdir(parents=True, exist_ok=True)
    shutil.copy(db, home / "airflow.db")
    shutil.copy(dag_file, home / "dags" / dag_file.name)
    return deployment_env(home)
