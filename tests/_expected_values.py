"""An independent reference for what a converted record must look like.

Written from the documented rules (docs/feature-config.md; not from convert/vectorize.py), so
tests can compare what the job wrote, read back through ``readers``, with what
the documentation promises: numeric fill/scaling, vocabulary ids (0 = missing,
1 = OOV, then terms by descending training-split frequency, ties by term),
FarmHash Fingerprint64 hash buckets, text tokens (ASCII-only lowercasing; runs of
ASCII letters, digits, ``_`` and non-ASCII characters), bytes passthrough.

Also reads records the way the converter does: Avro with logical types left
raw (integers, strings, bytes), JSON Lines with the stdlib parser.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
from farmhash import Fingerprint64

F32_MAX = float(np.finfo(np.float32).max)


# ------------------------------------------------------------------ reading


def _strip_logical(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_logical(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical(s) for s in schema]
    return schema


def raw_avro_records(path: str | Path) -> list[Any]:
    """Every record with logical types undecoded (timestamps as ints, decimals as bytes)."""
    with open(path, "rb") as f:
        blocks = fastavro.block_reader(f)
        schema = fastavro.parse_schema(_strip_logical(blocks.writer_schema))
        out = []
        for block in blocks:
            data = block.bytes_ if hasattr(block.bytes_, "read") else io.BytesIO(block.bytes_)
            out.extend(fastavro.schemaless_reader(data, schema, None) for _ in range(block.num_records))
    return out


def json_lines(path: str | Path) -> list[Any]:
    """Objects of the lines that parse (the rest goes to the error output)."""
    out = []
    for line in Path(path).read_bytes().removeprefix(b"\xef\xbb\xbf").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


# --------------------------------------------------------------- the rules


_EACH, _KEYS, _ENTRIES = "[]", "[keys]", "[entries]"


def _steps(path: str) -> list[Any]:
    """README's source paths: dotted keys, ``[]`` (each item), ``[n]``, ``["key"]``/``['key']``, ``[keys]``."""
    if "[" not in path:
        return path.split(".")
    out: list[Any] = []
    for m in re.finditer(r"""\[\]|\[keys\]|\[entries\]|\[(-?\d+)\]|\[("(?:[^"\\]|\\.)*")\]|\['([^']*)'\]|([^.\[\]]+)""", path):
        tok, idx, dq, sq, key = m.group(0), m.group(1), m.group(2), m.group(3), m.group(4)
        out.append(tok if tok in (_EACH, _KEYS, _ENTRIES) else int(idx) if idx is not None else json.loads(dq) if dq is not None
                   else sq if sq is not None else key)
    return out


def _walk(v: Any, steps: list[Any]) -> Any:
    """The value at ``steps``; ``[]`` gives a list (nested ``[]`` concatenated, a null list adding nothing)."""
    for i, s in enumerate(steps):
        if s == _EACH:
            if v is None:
                return None
            items = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else [v]
            rest = steps[i + 1:]
            if _EACH in rest or _KEYS in rest or _ENTRIES in rest:
                return [y for x in items for y in (_walk(x, rest) or [])]
            return [_walk(x, rest) for x in items]
        if s == _KEYS:
            return list(v) if isinstance(v, dict) else None
        if s == _ENTRIES:  # README: key/value pairs as terms key + "\x1f" + value; a null value is a null item
            return [x if x is None or isinstance(x, dict | list) else f"{k}\x1f{term(x)}" for k, x in v.items()] \
                if isinstance(v, dict) else None
        if isinstance(s, int):
            v = v[s] if isinstance(v, list) and -len(v) <= s < len(v) else None
        else:
            v = v.get(s) if isinstance(v, dict) else None
    return v


def get(record: Any, path: str) -> Any:
    return _walk(record, _steps(path))


def _text_of(v: Any) -> Any:
    """A ``text`` source's value: a list's strings joined (their tokens in order)."""
    if isinstance(v, list) and all(isinstance(x, str) or x is None for x in v):
        return " ".join(x for x in v if x is not None)
    return v


def term(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "backslashreplace")
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def stable_hash(s: str) -> int:
    """FarmHash Fingerprint64 of the UTF-8 term: TensorFlow's to_hash_bucket_fast (checked
    against TensorFlow in tests/test_convert_serving_parity.py)."""
    return Fingerprint64(s.encode("utf-8", "surrogatepass"))


def tokens(text: str, lowercase: bool = True) -> list[str]:
    """Character by character: a token character is an ASCII letter, digit or ``_``,
    or any non-ASCII character; lowercasing maps ``A-Z`` only."""
    out: list[str] = []
    cur: list[str] = []
    for c in text:
        if ord(c) >= 128 or c == "_" or "0" <= c <= "9" or "a" <= c <= "z" or "A" <= c <= "Z":
            cur.append(chr(ord(c) + 32) if lowercase and "A" <= c <= "Z" else c)
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    return out


def _items(v: Any) -> list[Any]:
    if v is None:
        return []
    return list(v) if isinstance(v, list | tuple) else [v]


def expected_vocabulary(records: Sequence[Any], source: str, transform: str, params: dict) -> list[str]:
    """Terms in id order, counted over ``records`` (the training split)."""
    c: Counter = Counter()
    for r in records:
        v = get(r, source)
        if transform == "text":
            v = _text_of(v)
            if isinstance(v, str):
                c.update(tokens(v, params.get("lowercase", True)))
        elif params.get("max_len"):
            items = _items(v)
            if not any(isinstance(x, dict | list) for x in items):
                c.update(term(x) for x in items if x is not None)
        elif v is not None and not isinstance(v, dict | list):
            c[term(v)] += 1
    items = [(t, n) for t, n in c.items() if n >= params.get("min_frequency", 1)]
    items.sort(key=lambda tn: (-tn[1], tn[0]))
    if params.get("top_k"):
        items = items[: params["top_k"]]
    return [t for t, _ in items]


def expected_stats(records: Sequence[Any], source: str, multi: bool) -> dict[str, float | None]:
    xs = []
    for r in records:
        for x in (_items(get(r, source)) if multi else [get(r, source)]):
            if isinstance(x, int | float) and x is not None:
                try:
                    fx = float(x)
                except OverflowError:
                    continue
                if abs(fx) <= F32_MAX:
                    xs.append(fx)
    if not xs:
        return {"mean": 0.0, "std": 0.0, "min": None, "max": None, "count": 0}
    a = np.asarray(xs, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max()), "count": len(xs)}


def _numeric_one(x: float, transform: str, params: dict) -> float:
    stats = params.get("stats") or {}
    if transform == "zscore":
        return (x - (stats.get("mean") or 0.0)) / (stats.get("std") or 1.0)
    if transform == "minmax":
        lo, hi = stats.get("min"), stats.get("max")
        return (x - lo) / (hi - lo) if lo is not None and hi is not None and hi > lo else 0.0
    if transform == "log1p":
        return math.log1p(x)
    if transform == "clip":
        lo = params.get("clip_min")
        hi = params.get("clip_max")
        return min(max(x, -math.inf if lo is None else lo), math.inf if hi is None else hi)
    return x


def _timestamp_seconds(v: Any, unit: str) -> int:
    """A timestamp's epoch seconds. Independent of convert/derive.py: datetime-free integer
    arithmetic spelled out per unit, floor towards -inf; ISO 8601 strings from their fields."""
    if isinstance(v, str):  # ISO 8601: seconds from the date and time fields; no offset = UTC
        import datetime as dt

        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        day = dt.date(t.year, t.month, t.day).toordinal() - dt.date(1970, 1, 1).toordinal()
        off = t.utcoffset() or dt.timedelta(0)
        return day * 86400 + t.hour * 3600 + t.minute * 60 + t.second - int(off.total_seconds())
    per = {"s": 1, "ms": 1000, "us": 10**6, "ns": 10**9}
    return v * 86400 if unit == "days" else v // per[unit]


def _count_base(record: Any, feature: dict) -> float:
    """A count feature's base value: the items its source holds (0 for null or absent)."""
    v = get(record, feature["source"])
    if "[" not in feature["source"] or not feature["source"].endswith(("[]", "[keys]")):
        v = get(record, feature["source"] + "[]") if v is not None else None
    return float(0 if v is None else len(v))


def expected_scaled_stats(records: Sequence[Any], feature: dict) -> dict[str, float]:
    """Mean and population std of a ``timestamp``'s seconds (over records that have one) or a
    ``count``'s items (over every record) in ``records`` (the training split)."""
    if feature["transform"] == "count":
        xs = [_count_base(r, feature) for r in records]
    else:
        unit = feature["params"].get("unit", "s")
        xs = [float(_timestamp_seconds(v, unit)) for v in (get(r, feature["source"]) for r in records) if v is not None]
    if not xs:
        return {"mean": 0.0, "std": 0.0}
    a = np.asarray(xs, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std())}


def _scaled(x: float, params: dict) -> float:
    """A timestamp's seconds or a count's items, less its training mean, over its training std."""
    stats = params.get("stats") or {}
    return (x - (stats.get("mean") or 0.0)) / (stats.get("std") or 1.0)


def _to_float(x: Any) -> float:
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _month(days: int) -> int:
    """Month of a day count since 1970-01-01: datetime where it reaches, else by 400-year cycles."""
    import datetime as dt

    days_400y = 146_097  # the Gregorian calendar repeats every 400 years
    shift = 0
    if not -719_162 <= days <= 2_932_896:
        shift = (days // days_400y) * days_400y
    return (dt.date(1970, 1, 1) + dt.timedelta(days=days - shift)).month


def expected_row(record: Any, feature: dict, vocab: list[str] | None) -> dict[str, Any]:
    """Output features of one *accepted* record for one feature spec (``dataset_info.json`` entry)."""
    name, transform, params = feature["name"], feature["transform"], feature["params"]
    v = get(record, feature["source"])
    n = feature["shape"][0]
    out: dict[str, Any] = {}
    if transform == "count":
        out[name] = np.asarray([_scaled(_count_base(record, feature), params)], dtype=np.float32)
        return out
    if transform == "text":
        v = _text_of(v)
    if transform == "timestamp":
        secs = 0 if v is None else _timestamp_seconds(v, params["unit"])
        out[name] = np.asarray([0.0 if v is None else _scaled(float(secs), params)], dtype=np.float32)
        days, rem = divmod(secs, 86400)
        for part in params.get("parts") or ():
            val = {"hour": rem // 3600, "day_of_week": (days + 3) % 7}.get(part)
            if part == "month":
                val = _month(days)
            out[f"{name}_{part}"] = np.asarray([0 if v is None else val], dtype=np.int64)
        if params.get("missing_indicator"):
            out[f"{name}_missing"] = np.asarray([int(v is None)], dtype=np.int64)
        return out
    if feature["dtype"] == "float32" and transform != "label":
        stats = params.get("stats") or {}
        fill = stats.get("mean") if params.get("fill") == "mean" else params.get("fill", 0.0)
        fill = 0.0 if fill is None else float(fill)

        def one(x: Any) -> float:
            if x is None:
                return _numeric_one(fill, transform, params)
            fx = _to_float(x)
            if not abs(fx) <= F32_MAX and params.get("on_nan") == "fill":
                fx = fill
            return _numeric_one(fx, transform, params)

        with np.errstate(over="ignore"):  # on_nan: keep writes beyond-float32 values as +-inf
            if params.get("max_len"):
                items = _items(v)[:n]
                vals = [one(x) for x in items] + [0.0] * (n - len(items))
                out[name] = np.asarray(vals, dtype=np.float32)
                out[f"{name}_len"] = np.asarray([len(items)], dtype=np.int64)
            else:
                out[name] = np.asarray([one(v)], dtype=np.float32)
        if params.get("missing_indicator"):
            out[f"{name}_missing"] = np.asarray([int(v is None)], dtype=np.int64)
        return out
    if transform == "bytes":
        b = b"" if v is None else bytes(v) if isinstance(v, bytes | bytearray) else v.encode("utf-8", "surrogatepass")
        out[name] = np.asarray([b], dtype=object)
        return out
    if transform == "label":
        out[name] = np.asarray([v], dtype=np.int64 if feature["dtype"] == "int64" else np.float32)
        return out
    if transform == "hash":
        def to_id(t: str) -> int:
            return 1 + stable_hash(t) % params["buckets"]
    else:
        assert vocab is not None
        ids = {t: 1 + params.get("num_oov_buckets", 1) + i for i, t in enumerate(vocab)}
        assert params.get("num_oov_buckets", 1) == 1, "reference supports one OOV bucket"

        def to_id(t: str) -> int:
            return ids.get(t, 1)
    if transform == "text":
        toks = tokens(v, params.get("lowercase", True))[:n] if isinstance(v, str) else []
        out[name] = np.asarray([to_id(t) for t in toks] + [0] * (n - len(toks)), dtype=np.int64)
        out[f"{name}_len"] = np.asarray([len(toks)], dtype=np.int64)
    elif params.get("max_len"):
        items = [x for x in _items(v) if x is not None][:n]
        out[name] = np.asarray([to_id(term(x)) for x in items] + [0] * (n - len(items)), dtype=np.int64)
        out[f"{name}_len"] = np.asarray([len(items)], dtype=np.int64)
    else:
        out[name] = np.asarray([0 if v is None else to_id(term(v))], dtype=np.int64)
    return out


def expected_columns(records: Sequence[Any], features: Sequence[dict], vocabs: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """Stacked expected features for ``records`` (all accepted), keyed by output name."""
    cols: dict[str, list[Any]] = {}
    for r in records:
        for f in features:
            if f.get("role", "feature") != "feature" and f["transform"] != "label":
                continue  # _len / _missing come with their feature
            for k, val in expected_row(r, f, vocabs.get(f["name"])).items():
                cols.setdefault(k, []).append(val)
    stacked = {k: np.stack(v) for k, v in cols.items()}
    for f in features:  # a list's length left out (length: false) or shared (length_of): no <name>_len
        p = f.get("params") or {}
        if p.get("length") is False or p.get("length_of"):
            mine = stacked.pop(f"{f['name']}_len", None)
            if p.get("length_of") and mine is not None:
                assert np.array_equal(mine, stacked[f"{p['length_of']}_len"]), (f["name"], p["length_of"])
    return stacked


# ------------------------------------------------------------- reading back


def read_split(out: str | Path, split: str) -> dict[str, np.ndarray]:
    """Every feature (label included) of one split, via ``readers.eval_dataset``."""
    import readers

    info = json.loads((Path(out) / "dataset_info.json").read_text())
    n = info["splits"][split]["num_records"]
    ds = readers.eval_dataset(str(out), batch_size=max(1, n), split=split, label_key=None,
                              features=[f["name"] for f in info["features"]])
    cols: dict[str, list[np.ndarray]] = {}
    for batch in ds:
        for k, t in batch.items():
            cols.setdefault(k, []).append(t.numpy())
    return {k: np.concatenate(v) for k, v in cols.items()}


def assert_columns_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str) -> None:
    assert set(want) <= set(got), f"{where}: features missing from the output: {sorted(set(want) - set(got))}"
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape, f"{where}: {k}: shape {g.shape}, expected {w.shape}"
        if w.dtype == object:
            assert g.tolist() == w.tolist(), f"{where}: {k}: {g.tolist()[:5]} != {w.tolist()[:5]}"
        elif w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{where}: {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{where}: {k}")
