"""What the stand-ins of one store behind the latency proxy share: the environment clients read,
the proxy's controls, and stopping every process by its pid.

A subclass starts its server and the proxy of ``tests/_remote.py`` in front of it, appending
each :class:`ServerProcess` to ``self.processes`` and setting ``self.endpoint`` to the proxy's
URL, and says in :meth:`env` what a user would set to reach the store.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from pathlib import Path
from typing import Any

from _remote import ServerProcess, _http_json


class ProxiedStack:
    """A store's server + the latency proxy; ``apply_env`` points this process's clients at it."""

    workdir: Path
    endpoint: str
    _own_workdir: bool
    processes: list[ServerProcess]

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def apply_env(self) -> None:
        env = self.env()
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

    def restore_env(self) -> None:
        for k, v in getattr(self, "_saved_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def set_latency(self, ttfb_ms: float, mbps: float) -> dict[str, Any]:
        return _http_json("POST", f"{self.endpoint}/_config?ttfb_ms={ttfb_ms}&mbps={mbps}")

    def set_straggler(self, name: str | None = None, *, every: int | None = None, factor: float = 10.0,
                      hold: bool = False) -> dict[str, Any]:
        q = urllib.parse.urlencode({"straggler": name or "", "straggler_every": every or 0,
                                    "straggler_factor": factor, "straggler_hold": int(hold)})
        return _http_json("POST", f"{self.endpoint}/_config?{q}")

    def proxy_stats(self, reset: bool = False) -> dict[str, Any]:
        return _http_json("POST" if reset else "GET", f"{self.endpoint}/_stats")

    def stop(self) -> None:
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - stop the others anyway
                pass
        self.processes = []
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
