"""Local (and NFS-like POSIX) paths: plain ``os`` calls, no Beam; the lock by ``O_CREAT | O_EXCL``."""

from __future__ import annotations

import contextlib
import glob
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from stores.base import Store


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


class LocalLock:
    """A lock file on a local (or NFS-like POSIX) file system.

    Created atomically (``O_CREAT | O_EXCL``); replaced by writing aside and
    renaming; removed by renaming it aside first and putting it back if it
    turns out to be another run's fresh lock.
    """

    conditional = False
    atomic_create = True

    def __init__(self, path: str):
        self.path = _local(path)

    def create(self, data: bytes) -> bool:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def created_state(self, data: bytes) -> Any:
        return data

    def read(self) -> tuple[bytes, Any, float] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            return data, data, os.path.getmtime(self.path)
        except FileNotFoundError:
            return None

    def replace(self, data: bytes, held: Any) -> Any:
        tmp = f"{self.path}.{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except BaseException:  # a full disk: leave no partial copy in the output
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return data

    def remove_if(self, state: Any) -> bool:
        """Remove the lock if it still is ``state`` (what was read); False if another run's."""
        aside = f"{self.path}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True  # gone already: whoever removed it, creating is the next step
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != state:  # another run took it over in between: put its lock back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
            os.unlink(aside)
            return False
        os.unlink(aside)
        return True


class LocalStore(Store):
    """Local paths and ``file://`` URLs."""

    scheme = ""
    name = "the local disk"

    def parse(self, url: str) -> tuple[str]:
        """``(path,)``: the local path, ``file://`` removed."""
        return (_local(url),)

    def stat(self, url: str) -> tuple[int, float | None] | None:
        try:
            st = os.stat(_local(url))
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime

    def read(self, url: str) -> bytes | None:
        try:
            with open(_local(url), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def list(self, root: str, pattern: str) -> list[str]:
        root = _local(root)
        return sorted(p for p in glob.glob(os.path.join(glob.escape(root), pattern)) if os.path.isfile(p))

    @contextlib.contextmanager
    def ranged_reader(self, url: str) -> Iterator[Callable[[int, int], bytes]]:
        with open(_local(url), "rb") as f:
            def read_file(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(size)
            yield read_file

    def lock_object(self, path: str, client: Any = None) -> LocalLock:
        return LocalLock(path)


STORE = LocalStore()
