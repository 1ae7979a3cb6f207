"""Small file-system layer: local paths via ``os``, the stores the readers stage (``hdfs://``, ``s3://``,
``azfs://``: TensorFlow 2.21 reads none of them) through their :mod:`stores` module, the rest via
``tf.io.gfile``.

Local paths never import TensorFlow, so :func:`readers.load_info` and
:func:`readers.wait_for_dataset` work in environments without it (for example
the ``recordprep wait`` command on a conversion host).
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from readers.options import path_scheme
from stores import other_scheme_hint, store_for


def strip_file_scheme(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def is_staged(path: str) -> bool:
    """Read by copying to local disk first (:mod:`stores.staging`): ``hdfs://``, ``s3://``, ``azfs://``."""
    return store_for(path).staged


def join(root: str, name: str) -> str:
    """``root/name`` for local paths and URLs alike (no backslashes on URLs)."""
    if path_scheme(root):
        return root.rstrip("/") + "/" + name.lstrip("/")
    return os.path.join(root, name)


def split(path: str) -> tuple[str, str]:
    """``(dirname, basename)`` of a local path or a URL."""
    if path_scheme(path):
        scheme, _, rest = path.partition("://")
        head, tail = posixpath.split(rest)
        return f"{scheme}://{head}", tail
    return os.path.split(path)


#: Bytes per read of a remote file read whole (metadata, reports).
_READ_CHUNK = 8 << 20


def _gfile() -> Any:
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - TF is installed in dev
        raise RuntimeError(
            "reading remote paths needs TensorFlow's file systems, and TensorFlow is not "
            "installed here; install it (pip install 'recordprep[tf]') or use a local path"
        ) from e
    return tf.io.gfile


def _unsupported_scheme(path: str, err: Exception) -> RuntimeError:
    scheme = path_scheme(path)
    hint = other_scheme_hint(path)
    return RuntimeError(
        f"TensorFlow here cannot open {scheme}:// paths ({err}). TensorFlow 2.21 ships only local, "
        f"ram:// and gs:// file systems; hdfs://, s3:// and azfs:// (Azure) are handled by recordprep "
        f"itself (it stages shards locally). " + (hint or
        "For another store, copy the output directory to local disk or gs:// first.")
    )


def _call_gfile(path: str, fn_name: str, *args: Any) -> Any:
    gfile = _gfile()
    import tensorflow as tf

    try:
        return getattr(gfile, fn_name)(path, *args)
    except tf.errors.UnimplementedError as e:
        raise _unsupported_scheme(path, e) from e


def exists(path: str) -> bool:
    if is_staged(path):
        return store_for(path).stat(path) is not None
    if not path_scheme(path) or path.startswith("file://"):
        return os.path.exists(strip_file_scheme(path))
    return bool(_call_gfile(path, "exists"))


def size(path: str) -> int | None:
    """File size in bytes, or ``None`` if it does not exist."""
    if is_staged(path):
        st = store_for(path).stat(path)
        return None if st is None else st[0]
    if not path_scheme(path) or path.startswith("file://"):
        try:
            return os.stat(strip_file_scheme(path)).st_size
        except FileNotFoundError:
            return None
    import tensorflow as tf

    try:
        return int(_call_gfile(path, "stat").length)
    except tf.errors.NotFoundError:
        return None


def isdir(path: str) -> bool:
    if is_staged(path):
        return True  # only used for messages; a stat of a directory is not needed
    if not path_scheme(path) or path.startswith("file://"):
        return os.path.isdir(strip_file_scheme(path))
    return bool(_call_gfile(path, "isdir"))


def _read_to_end(f: Any) -> bytes:
    """Read in chunks until a short read, never ``GFile.read()``: that reads as many bytes as
    the file system's stat says, and TensorFlow's GCS stat cache (5 s by default) can hold the
    size of an object another process has since replaced, which cut the new one short."""
    chunks = []
    while chunk := f.read(_READ_CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def read_bytes(path: str) -> bytes | None:
    """The whole file, or ``None`` if it does not exist."""
    if is_staged(path):
        return store_for(path).read(path)
    if not path_scheme(path) or path.startswith("file://"):
        try:
            with open(strip_file_scheme(path), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    import tensorflow as tf

    gfile = _gfile()
    try:
        with gfile.GFile(path, "rb") as f:
            return _read_to_end(f)
    except tf.errors.NotFoundError:
        return None
    except tf.errors.UnimplementedError as e:
        raise _unsupported_scheme(path, e) from e
