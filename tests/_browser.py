"""Headless Chromium for the HTML report's tests: the binary (installed from Debian
when allowed, else the test skips saying why) and a DevTools Protocol page session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Why this session's install of Chromium failed: later tests skip at once instead of
#: retrying it. Kept per session, not on disk: a registry that was down may be back next run.
_install_failed: list[str] = []


def _chromium() -> str:
    """The Chromium binary; installs Debian's package when allowed, else skips saying why."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium on PATH and no rights to `apt-get install -y chromium`: install it to run this test")
    if _install_failed:
        pytest.skip(_install_failed[0])
    log = Path(tempfile.gettempdir()) / "recordprep-chromium-install.failed"
    # A new machine's package lists may be missing or name versions the mirror no longer has
    # (404): the lists are refreshed first, as Debian's own instructions do.
    u = subprocess.run(["apt-get", "update"], capture_output=True, text=True, timeout=600)
    r = subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, text=True, timeout=900)
    if r.returncode != 0 or not shutil.which("chromium"):
        log.write_text(u.stdout[-2000:] + u.stderr[-2000:] + r.stdout[-4000:] + r.stderr[-4000:])
        _install_failed.append(f"`apt-get install -y chromium` failed (exit {r.returncode}); output kept in {log}")
        pytest.skip(_install_failed[0])
    return shutil.which("chromium")  # type: ignore[return-value]


class _Page:
    """One Chrome DevTools Protocol session on a page target (websockets client)."""

    def __init__(self, ws):
        self.ws, self.n, self.events = ws, 0, []

    async def call(self, method: str, **params):
        self.n += 1
        my = self.n
        await self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    async def wait_for(self, method: str, timeout: float = 30):
        for e in self.events:
            if e.get("method") == method:
                return e
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
            self.events.append(msg)
            if msg.get("method") == method:
                return msg

    async def eval(self, expr: str):
        r = await self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")




@contextlib.contextmanager
def devtools_page(chromium: str, profile: Path) -> Iterator[str]:
    """A headless Chromium on 127.0.0.1 (stopped by its pid on exit, in bounded time): its page target's DevTools URL."""
    proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,2000",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
            if "DevTools listening on" in line:
                port = int(line.split("ws://127.0.0.1:")[1].split("/")[0])
                break
        assert port, "chromium did not open its DevTools port"
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        yield next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
