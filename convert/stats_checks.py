"""``stats.json`` checked as untrusted input where it is loaded (``convert.stats.load_stats``).

``recordprep report``, its drift and skew checks (``convert.drift``) and ``verify`` read
the document's counts: records per split, rejections, per-file counts, each feature's
rows, missing values, items, term counts, histogram counts, used buckets. An edited or
damaged count (NaN, infinity, a float, a bool, a negative number) would be shown as a
count, divided by, or turned into a share; so every count must be an exact non-negative
integer (``convert.spec.is_count``, the check of ``dataset_info.json``'s counts), each
sketch's moments pass ``convert.spec.statistics_problems`` (the check of the metadata's
and the analysis' statistics), and the counts that must add up do. Each problem names
the file, the feature and split, and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from convert.spec import DatasetInfo, is_count, short_repr, statistics_problems

#: Problems quoted in one error; the rest are counted.
MAX_SHOWN = 5
#: The moments of a value sketch ``statistics_problems`` checks.
_MOMENTS = ("count", "mean", "std", "min", "max")


def _not_count(where: str, key: str, value: Any) -> str:
    return f"{where}{key} must be a non-negative integer, found {short_repr(value)}"


def _counts(where: str, d: Mapping[str, Any], keys: Sequence[str], out: list[str], nullable: bool = False) -> None:
    """Each of ``keys`` present in ``d`` is an exact non-negative integer (or null when ``nullable``)."""
    for key in keys:
        if key in d and not is_count(d[key]) and not (nullable and d[key] is None):
            out.append(_not_count(where, repr(key), d[key]))


def _count_list(where: str, what: str, v: Any, out: list[str]) -> int | None:
    """The sum of ``v``, a list of counts (``what``: how the message names it); None (and a
    problem) when it is not one."""
    if not isinstance(v, list) or not all(map(is_count, v)):
        bad = next((x for x in v if not is_count(x)), None) if isinstance(v, list) else v
        out.append(f"{where}{what} must be non-negative integers, found {short_repr(bad)}")
        return None
    return sum(v)


def _sketch_problems(where: str, name: str, sk: Any, out: list[str]) -> None:
    """A value sketch (``ValueSketch.to_json``): its moments as the metadata's statistics,
    its counts exact, and its histogram's counts (``pos``, ``neg``, ``zero``) adding up to ``count``."""
    if sk is None:
        return
    if not isinstance(sk, Mapping):
        out.append(f"{where}must be an object or null, found {short_repr(sk)}")
        return
    count = sk.get("count")
    moments = {k: sk.get(k) for k in _MOMENTS} if is_count(count) and count else {"count": count}
    out.extend(f"{where}{p}" for p in statistics_problems(name, moments))
    _counts(where, sk, ("zero", "nonfinite"), out)
    total = sk.get("zero", 0) if is_count(sk.get("zero", 0)) else None
    for key in ("pos", "neg"):
        h = sk.get(key)
        if not (isinstance(h, list) and len(h) == 2 and isinstance(h[0], int) and not isinstance(h[0], bool)):
            out.append(f"{where}{key!r} must be [first bucket, [counts]], found {short_repr(h)}")
            return
        n = _count_list(where, f"the {key!r} counts", h[1], out)
        if n is None or total is None:
            return
        total += n
    if is_count(count) and total is not None and total != count:
        out.append(f"{where}its histogram holds {total} values ('zero', 'pos', 'neg'), but 'count' is {count}")


def _terms_problems(where: str, d: Mapping[str, Any], out: list[str]) -> None:
    """The top terms (``[term, count]`` pairs) and the counts they must stay within."""
    terms = d.get("terms")
    if "terms" not in d:
        return
    if not isinstance(terms, list) or not all(isinstance(t, list) and len(t) == 2 and isinstance(t[0], str)
                                              for t in terms):
        out.append(f"{where}'terms' must be a list of [term, count] pairs, found {short_repr(terms)}")
        return
    top = _count_list(where, "the terms' counts", [c for _, c in terms], out)
    items, distinct = d.get("items"), d.get("distinct")
    if top is not None and is_count(items) and top > items:
        out.append(f"{where}its top terms count {top} items, more than 'items' ({items})")
    if is_count(distinct) and len(terms) > distinct:
        out.append(f"{where}it lists {len(terms)} terms, more than 'distinct' ({distinct})")
    for small, big in (("once", "distinct"), ("oov", "items")):
        if is_count(d.get(small)) and is_count(d.get(big)) and d[small] > d[big]:
            out.append(f"{where}{small!r} ({d[small]}) is more than {big!r} ({d[big]})")


def _split_problems(where: str, name: str, d: Any, records: Any, out: list[str]) -> None:
    """One feature's statistics on one split; ``records``: the split's records (``splits``)."""
    if not isinstance(d, Mapping):
        out.append(f"{where}must be an object, found {short_repr(d)}")
        return
    _counts(where, d, ("rows", "items", "distinct", "once", "oov", "buckets"), out)
    _counts(where, d, ("missing", "used_buckets"), out, nullable=True)
    rows = d.get("rows")
    if is_count(rows) and is_count(records) and rows != records:
        out.append(f"{where}'rows' is {rows}, but the split has {records} records")
    if is_count(rows) and is_count(d.get("missing")) and d["missing"] > rows:
        out.append(f"{where}'missing' ({d['missing']}) is more than 'rows' ({rows})")
    if is_count(d.get("used_buckets")) and is_count(d.get("buckets")) and d["used_buckets"] > d["buckets"]:
        out.append(f"{where}'used_buckets' ({d['used_buckets']}) is more than 'buckets' ({d['buckets']})")
    if "lengths" in d:
        n = _count_list(where, "'lengths'", d["lengths"], out)
        if n is not None and is_count(rows) and n != rows:
            out.append(f"{where}'lengths' count {n} rows, but 'rows' is {rows}")
    for side in ("before", "after"):
        _sketch_problems(f"{where}{side!r}: ", name, d.get(side), out)
    _terms_problems(where, d, out)


def _totals_problems(where: str, doc: Mapping[str, Any], out: list[str]) -> None:
    """Records per split, the rejections (their groups add up to their count) and each
    input file's counts (read = rejected + written)."""
    splits = doc.get("splits", {})
    if not isinstance(splits, Mapping):
        out.append(f"{where}: 'splits' must be an object, found {short_repr(splits)}")
        splits = {}
    for s, sp in splits.items():
        if not isinstance(sp, Mapping):
            out.append(f"{where}: split {short_repr(s)} must be an object, found {short_repr(sp)}")
            continue
        _counts(f"{where}: split {short_repr(s)}: ", sp, ("records", "bytes", "shards"), out)
    rej = doc.get("rejections", {})
    groups = rej.get("groups", []) if isinstance(rej, Mapping) else None
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) for g in groups):
        out.append(f"{where}: 'rejections' must be an object with a list of groups, found {short_repr(rej)}")
    else:
        _counts(f"{where}: rejections: ", rej, ("count",), out)
        n = _count_list(f"{where}: rejections: ", "the groups' counts", [g.get("count") for g in groups], out)
        if n is not None and is_count(rej.get("count")) and n != rej["count"]:
            out.append(f"{where}: rejections: its groups hold {n} records, but 'count' is {rej['count']}")
    files = doc.get("files", [])
    for i, fc in enumerate(files if isinstance(files, list) else [files]):
        at = f"{where}: files[{i}]: "
        written = fc.get("written") if isinstance(fc, Mapping) else None
        if not isinstance(written, Mapping):
            out.append(f"{at}must be an object with 'written' per split, found {short_repr(fc)}")
            continue
        _counts(at, fc, ("read", "rejected"), out)
        total = _count_list(at, "the 'written' counts", list(written.values()), out)
        if total is not None and is_count(fc.get("read")) and is_count(fc.get("rejected")) \
                and fc["read"] != fc["rejected"] + total:
            out.append(f"{at}'read' is {fc['read']}, but {total} records were written and {fc['rejected']} rejected")


def stats_problems(doc: Mapping[str, Any], where: str) -> list[str]:
    """Every count of a ``stats.json`` document (its shape already checked by ``load_stats``:
    ``features`` an object of objects with ``splits``) that is not an exact non-negative
    integer, every sketch ``statistics_problems`` refuses, and every sum that does not agree."""
    out: list[str] = []
    _totals_problems(where, doc, out)
    splits = doc.get("splits") if isinstance(doc.get("splits"), Mapping) else {}
    for name, feat in doc["features"].items():
        for s, d in feat["splits"].items():
            records = (splits.get(s) or {}).get("records") if isinstance(splits.get(s), Mapping) else None
            _split_problems(f"{where}: feature {short_repr(name)}, split {short_repr(s)}: ", str(name), d, records, out)
    return out


def stats_metadata_problems(doc: Mapping[str, Any], info: DatasetInfo, where: str) -> list[str]:
    """Where a checked ``stats.json`` (``where``) contradicts the metadata it was committed
    with: each split's records, bytes and shards, and the records rejected."""
    out = []
    splits = doc.get("splits", {})
    if "splits" in doc and set(splits) != set(info.splits):
        return [f"{where}: its splits {sorted(map(str, splits))} are not the metadata's {sorted(info.splits)}"]
    for s, sp in info.splits.items():
        if s not in splits:
            continue
        for key, want in (("records", sp.num_records), ("bytes", sp.num_bytes), ("shards", len(sp.shards))):
            got = splits[s].get(key, want)
            if got != want:
                out.append(f"{where}: split {s!r}: {key!r} is {got}, but dataset_info.json says {want}")
    errors = (info.extra.get("counts") or {}).get("errors")
    rejected = (doc.get("rejections") or {}).get("count", errors)
    if errors is not None and rejected != errors:
        out.append(f"{where}: rejections: 'count' is {rejected}, but dataset_info.json says {errors} records "
                   f"were rejected")
    return out


def problems_message(problems: Sequence[str]) -> str:
    """``problems`` as one error message: the first ``MAX_SHOWN``, the rest counted, and what to do."""
    more = f" (and {len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
    return "; ".join(problems[:MAX_SHOWN]) + more + "; the statistics were edited or damaged: re-run the conversion"
