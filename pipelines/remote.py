"""Beam settings for remote paths of a conversion (``hdfs://``, ``azfs://``), set before planning.

Beam's ``HadoopFileSystem`` talks WebHDFS (through the ``hdfs`` package) and
needs ``--hdfs_host``, ``--hdfs_port`` (the NameNode's *HTTP* port, 9870 on
Hadoop 3, 50070 on Hadoop 2) and ``--hdfs_user``; without
``--hdfs_full_urls`` it also reads ``hdfs://nn:8020/data/out`` as the path
``/nn:8020/data/out``. recordprep always means ``hdfs://<namenode>[:port]/path``
(the Hadoop form, and what ``readers`` expects), so when an input, the output
or ``--analysis-from`` is on HDFS the missing flags are derived here the same
way the readers find WebHDFS:

* host/port: ``$RECORDPREP_WEBHDFS_URL`` (e.g. ``http://nn.example.com:9870``)
  if set, else the URL's host and port 9870;
* user: ``$HADOOP_USER_NAME``, else the login name;
* ``--hdfs_full_urls`` always.

Beam's Azure file system (``azfs://<account>/<container>/<path>``) takes its
client from ``--azure_connection_string``, else ``$AZURE_STORAGE_CONNECTION_STRING``,
else ``--blob_service_endpoint`` with ``DefaultAzureCredential``; that client
serves one account whatever account a path names. So the paths of a job must
name one account, the connection string's if there is one (checked here), and
without a connection string ``--blob_service_endpoint`` is derived from the
account (``https://<account>.blob.core.windows.net``). ``az://`` and
``abfs://`` paths are refused with the ``azfs://`` form to write.

Flags given after ``--`` win. The planner lists and stats inputs before the
pipeline exists, so a run hands the options to ``FileSystems`` itself, once,
for its whole length (:func:`filesystem_options`; a ``Pipeline`` would only
do it when built).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.options import beam_flag
from stores import other_scheme_hint
from stores.hdfs import DEFAULT_WEBHDFS_PORT, WEBHDFS_URL_ENV, is_hdfs, login_name, parse_hdfs_url


class RemotePathError(ValueError):
    """A path the run's file systems cannot serve as written (no NameNode to tell, another
    Azure account than the connection string's, two accounts in one job, ``az://``, a scheme no
    file system reads): a usage error, raised before anything is read or written."""


def _given(beam_args: Sequence[str], flag: str) -> bool:
    return beam_flag(beam_args, flag) is not None


def hdfs_beam_args(paths: Iterable[str | None], beam_args: Sequence[str]) -> list[str]:
    """The ``--hdfs_*`` flags missing from ``beam_args`` when any of ``paths`` is on HDFS."""
    hdfs_paths = [str(p) for p in paths if is_hdfs(p)]
    if not hdfs_paths:
        return []
    extra: list[str] = []
    if not (_given(beam_args, "--hdfs_host") and _given(beam_args, "--hdfs_port")):
        webhdfs = os.environ.get(WEBHDFS_URL_ENV, "").strip()
        if webhdfs:
            parsed = urllib.parse.urlparse(webhdfs)
            host, port = parsed.hostname or "", parsed.port or DEFAULT_WEBHDFS_PORT
        else:
            host, port = parse_hdfs_url(hdfs_paths[0])[0], DEFAULT_WEBHDFS_PORT
        if not host:
            raise RemotePathError(
                f"{hdfs_paths[0]}: cannot tell the NameNode; write hdfs://<namenode>[:port]/path, set "
                f"{WEBHDFS_URL_ENV}=http://<namenode>:9870, or pass -- --hdfs_host H --hdfs_port P"
            )
        if not _given(beam_args, "--hdfs_host"):
            extra += ["--hdfs_host", host]
        if not _given(beam_args, "--hdfs_port"):
            extra += ["--hdfs_port", str(port)]
    if not _given(beam_args, "--hdfs_user"):
        extra += ["--hdfs_user", os.environ.get("HADOOP_USER_NAME") or login_name()]
    if not _given(beam_args, "--hdfs_full_urls"):
        extra.append("--hdfs_full_urls")
    return extra


def azure_beam_args(paths: Iterable[str | None], beam_args: Sequence[str]) -> list[str]:
    """The ``--blob_service_endpoint`` flag missing from ``beam_args`` when any of ``paths`` is on
    ``azfs://``; raises :class:`RemotePathError` for paths Beam's one Azure client cannot serve."""
    from stores.azure import (
        CONNECTION_STRING_ENV,
        AzureAccountError,
        account_url,
        check_account,
        is_azure,
        parse_azfs_url,
    )

    paths = list(paths)
    for p in paths:
        hint = other_scheme_hint(str(p or ""))
        if hint:
            raise RemotePathError(hint)
    try:
        accounts = sorted({parse_azfs_url(str(p))[0] for p in paths if p and is_azure(str(p))})
    except ValueError as e:  # not azfs://<account>/<container>/<path>
        raise RemotePathError(str(e)) from None
    if not accounts:
        return []
    if len(accounts) > 1:
        raise RemotePathError(f"the paths of one conversion are on the Azure accounts {', '.join(accounts)}; Beam's "
                         f"Azure client serves one account per job: copy the inputs into one account first")
    conn = beam_flag(beam_args, "--azure_connection_string") or os.environ.get(CONNECTION_STRING_ENV, "")
    if conn:
        try:
            check_account(accounts[0], conn)
        except AzureAccountError as e:
            raise RemotePathError(str(e)) from None
        return []
    if _given(beam_args, "--blob_service_endpoint"):
        return []
    return ["--blob_service_endpoint", account_url(accounts[0])]


def beam_args_for(opts: Any) -> list[str]:
    """``opts.beam_args`` plus the derived remote-storage flags (``ConvertOptions`` in)."""
    args = list(opts.beam_args)
    paths = [*opts.inputs, opts.output, getattr(opts, "analysis_from", None)]
    return args + hdfs_beam_args(paths, args) + azure_beam_args(paths, args)


def check_paths(opts: Any, *more: str | None) -> None:
    """Raise :class:`RemotePathError` unless the paths of a run of ``opts`` (``ConvertOptions``) and
    ``more`` (read by the same process after it: ``--check-against``) can be served together, before
    the run starts, not after it committed."""
    args = list(opts.beam_args)
    paths = [*opts.inputs, opts.output, getattr(opts, "analysis_from", None), *more]
    check_schemes(paths)
    hdfs_beam_args(paths, args)
    azure_beam_args(paths, args)


def check_schemes(paths: Iterable[str | None]) -> None:
    """Raise :class:`RemotePathError` for a path whose URL scheme no file system of Beam's reads
    (``http://``, ``s3a://``; ``gs://`` without Beam's GCP extra): Beam would fail later, with a
    traceback, and a ``--dry-run`` would pass."""
    from apache_beam.io.filesystem import FileSystem
    from apache_beam.io.filesystems import FileSystems

    for p in paths:
        p = str(p or "")
        scheme = FileSystems.get_scheme(p)
        if scheme is None or other_scheme_hint_of(p):
            continue  # a local path, or one azure_beam_args names the right scheme for
        if scheme.lower() == "file":
            raise RemotePathError(f"{p}: write a local path without file:// ({p.split('://', 1)[1]})")
        if scheme not in {fs.scheme() for fs in FileSystem.get_all_subclasses()}:  # as get_filesystem looks it up
            raise RemotePathError(f"{p}: no file system reads {scheme}:// paths here; recordprep reads local "
                                  "paths, gs://, s3://, azfs:// and hdfs:// (gs:// needs apache-beam[gcp]): "
                                  "copy the data to one of them")


def other_scheme_hint_of(path: str) -> str | None:
    """``stores.other_scheme_hint``: what to write instead of ``az://``, ``abfs://``, ``wasb://``."""
    return other_scheme_hint(path)


def pipeline_options(opts: Any) -> PipelineOptions:
    """``PipelineOptions`` for ``opts`` (``ConvertOptions``): its Beam flags and the derived ones. Sets nothing."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(beam_args_for(opts))


@contextlib.contextmanager
def filesystem_options(opts: Any) -> Iterator[PipelineOptions]:
    """While open, ``FileSystems`` reads and writes with the options of a run of ``opts``; on
    close, the options it had before are back.

    Beam's file systems take their options (``--hdfs_*``, S3's and GCS's
    settings) from one process-wide place, which a ``Pipeline`` sets only when
    it is built; the launcher lists inputs, checks and clears the output
    before that, so a run sets them once, for its whole length.
    """
    from apache_beam.io.filesystems import FileSystems

    before = FileSystems._pipeline_options
    options = pipeline_options(opts)
    _azure_patch([*opts.inputs, opts.output, getattr(opts, "analysis_from", None)])
    FileSystems.set_options(options)
    try:
        yield options
    finally:
        FileSystems.set_options(before)


_AZURE_PATCH = contextlib.ExitStack()
atexit.register(_AZURE_PATCH.close)  # undone before the interpreter's teardown, not during it


def _azure_patch(paths: Iterable[str | None]) -> None:
    """Beam's ``exists`` fixed for the process once a path is on ``azfs://`` (``pipelines.local.patches.AzureExists``)."""
    if any(str(p or "").startswith("azfs://") for p in paths):
        from pipelines.local.patches import AZURE_EXISTS

        if not AZURE_EXISTS.active:
            _AZURE_PATCH.enter_context(AZURE_EXISTS.applied())


def use_paths(*paths: str | None) -> None:
    """Set ``FileSystems``' options for reading ``paths`` outside a pipeline (``inspect``, ``verify``).

    HDFS and Azure need their derived flags; Beam's S3 and Azure file systems
    need options to exist at all (empty ones: boto3 then finds the endpoint
    and credentials itself, in the environment, a profile or the instance
    role; Azure's client reads ``$AZURE_STORAGE_CONNECTION_STRING``). Other
    file systems need none here.
    """
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    check_schemes(paths)
    flags = hdfs_beam_args(paths, []) + azure_beam_args(paths, [])
    _azure_patch(paths)
    if flags:
        FileSystems.set_options(PipelineOptions(flags))
    elif (any(str(p or "").startswith(("s3://", "azfs://")) for p in paths)
          and FileSystems._pipeline_options is None):
        FileSystems.set_options(PipelineOptions([]))
