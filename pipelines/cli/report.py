"""``recordprep report``: an output's statistics (``stats.json``) as a terminal
summary, a self-contained HTML page or JSON, with the drift/skew checks of
``convert.drift``. Reads the metadata and the statistics only, never a shard.

The HTML page needs no network: its CSS, script and SVG charts are inline
(``report_template.html`` holds the CSS and script). Tables sort on a click on
their header and filter with the search box; ``#q=WORD`` in the page's
address fills the box when the page opens.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from apache_beam.io.filesystems import FileSystems

from convert import drift as _drift
from convert.spec import check_name
from convert.stats import (
    MAX_COUNTED_BUCKETS,
    STATS_FILENAME,
    StatsFormatError,
    ValueSketch,
    load_stats,
)
from convert.stats_checks import problems_message, stats_metadata_problems
from pipelines.cli.inspect import InspectError, load
from pipelines.cli.terminal import text, visible

#: Terms shown per feature and split in the HTML page and the terminal.
TERMS_SHOWN = 20
#: Bars of a numeric histogram.
HIST_BINS = 30
#: A vocabulary's out-of-vocabulary share of a split other than the training one above which the
#: report flags it (``--oov-threshold``): ids a model never saw a label for.
DEFAULT_OOV_THRESHOLD = 0.05


class ReportError(RuntimeError):
    """The output cannot be reported on (the message says why and what to do)."""


def load_output(output: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metadata (as JSON) and the statistics document of ``output``, its counts checked
    (``load_stats``) and checked against the metadata's (``stats_metadata_problems``)."""
    try:
        info = load(output)
    except InspectError as e:
        raise ReportError(str(e)) from e
    extra = info.extra
    name = extra.get("stats_file")
    if name is None:
        raise ReportError(f"{output} has no statistics ({STATS_FILENAME}): it was written by a recordprep older than "
                          f"`recordprep report`. Re-convert it with this recordprep (`recordprep convert ... --force`) "
                          f"to report on it")
    path = FileSystems.join(output, check_name(name, f"{output}: stats_file"))
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            doc = load_stats(json.loads(f.read()), where=path)
    except (OSError, ValueError) as e:
        if isinstance(e, StatsFormatError):
            raise ReportError(str(e)) from e
        raise ReportError(f"{path}: cannot be read as statistics ({e}); re-run the conversion") from e
    problems = stats_metadata_problems(doc, info, path)
    if problems:
        raise ReportError(problems_message(problems))
    return info.to_json(), doc


def oov_checks(features: Mapping[str, Any], splits: Sequence[str], threshold: float) -> list[dict[str, Any]]:
    """Each vocabulary's out-of-vocabulary share (items without an id of their own) on every
    split but the training one (``train``, else the first), ``over`` when above ``threshold``."""
    base = "train" if "train" in splits else (splits[0] if splits else None)
    out = []
    for name, feat in features.items():
        for s in splits:
            d = feat["splits"].get(s) or {}
            if s != base and "oov" in d and d.get("items"):
                share = d["oov"] / d["items"]
                out.append({"feature": name, "split": s, "oov": d["oov"], "items": d["items"], "share": share,
                            "threshold": threshold, "over": share > threshold})
    return out


def bucket_use(items: int, used: int | None, buckets: int | None) -> dict[str, Any] | None:
    """How crowded a hash feature's buckets are on one split: ``used`` of ``buckets`` (exact, from
    ``stats.json``), ``items`` (ids written) per used bucket, and two estimates that assume the
    ids spread uniformly (as a fingerprint's do): the distinct values (linear counting:
    ``D = -B ln(1 - U/B)``, the D whose expected used buckets are U; None when every bucket is used)
    and the share of distinct values that share their bucket with another (``(U - 1) / (B - 1)``:
    ``1 - (1 - 1/B)^(D - 1)`` at that D). None where the used buckets were not counted."""
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (items, used, buckets)):
        return None  # not counted, or not a document this recordprep wrote
    assert isinstance(used, int) and isinstance(buckets, int)
    if not 0 <= used <= buckets or buckets < 1:
        return None
    return {"used_buckets": used, "buckets": buckets, "used_share": used / buckets,
            "items_per_used_bucket": items / used if used else None,
            "distinct_estimate": round(-buckets * math.log1p(-used / buckets)) if used < buckets else None,
            "colliding_share_estimate": (used - 1) / (buckets - 1) if used and buckets > 1 else None}


def _with_bucket_use(feat: Mapping[str, Any]) -> dict[str, Any]:
    """A hash feature's splits with their ``bucket_use`` (``bucket_use``); other features as they are."""
    if feat.get("kind") != "hash":
        return dict(feat)
    splits = {}
    for s, d in (feat.get("splits") or {}).items():
        if not isinstance(d, Mapping):
            splits[s] = d
            continue
        use = bucket_use(d.get("items") or 0, d.get("used_buckets"), d.get("buckets"))
        splits[s] = {**d, "bucket_use": use} if use is not None else d
    return {**feat, "splits": splits}


def build_report(output: str, against: str | None = None,
                 overrides: Mapping[str, float] | None = None,
                 oov_threshold: float = DEFAULT_OOV_THRESHOLD) -> dict[str, Any]:
    """The report as JSON: the output's statistics, its skew (training split
    against each other split), each vocabulary's OOV share off the training split
    (``oov_checks``) and, with ``against``, its drift from that output."""
    info, doc = load_output(output)
    limits = _drift.thresholds(info.get("config"), overrides)
    skew = [c.to_json() for c in _drift.skew(doc, limits)]
    drift = []
    if against is not None:
        _, old = load_output(against)
        drift = [c.to_json() for c in _drift.drift(doc, old, limits, new_name=output, old_name=against)]
    over = sorted({f for c in skew + drift for f in c["features_over"]})
    specs = {f["name"]: f for f in info.get("features", [])}
    features = {name: {**_with_bucket_use(feat), "params": (specs.get(name) or {}).get("params", {})}
                for name, feat in doc["features"].items()}
    return {
        "output": output, "against": against,
        "created": info.get("created"), "tool": info.get("tool"), "layout": info.get("layout", "features"),
        "format_version": info.get("format_version"), "order": (info.get("shuffle") or {}).get("order", "input"),
        "splits": doc.get("splits", {}), "files": doc.get("files", []), "rejections": doc.get("rejections", {}),
        "features": features,
        "thresholds": limits, "skew": skew, "drift": drift, "features_over": over,
        "oov_threshold": oov_threshold, "oov": oov_checks(features, list(doc.get("splits", {})), oov_threshold),
    }


# ------------------------------------------------------------------ helpers


def _pct(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "—"
    return f"{100 * part / whole:.1f}%"


def _num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}" if math.isfinite(x) else str(x)
    return f"{x:,}" if isinstance(x, int) else str(x)


def _seconds(feat: Mapping[str, Any]) -> tuple[float, float] | None:
    """``(mean, std)`` that turn a timestamp's written value back into epoch seconds (``x * std + mean``):
    its training statistics when it is written scaled; ``(0, 1)`` when written as seconds (older
    outputs); None when it is no timestamp."""
    if feat.get("kind") != "timestamp":
        return None
    st = (feat.get("params") or {}).get("stats")
    if not isinstance(st, Mapping):
        return 0.0, 1.0
    return float(st.get("mean") or 0.0), float(st.get("std") or 1.0)


def _date(secs: float) -> str:
    """Epoch seconds as a UTC date and time (to the nearest second: a scaled value is float32, so
    its seconds come back a few milliseconds off); a number where no calendar date reaches."""
    try:
        return _dt.datetime.fromtimestamp(round(secs), _dt.UTC).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return _num(secs)


def _span(seconds: float) -> str:
    """A length of time in its largest fitting unit."""
    for unit, n in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if abs(seconds) >= n:
            return f"{seconds / n:.3g} {unit}"
    return f"{seconds:.3g} s"


def _value(feat: Mapping[str, Any]) -> Any:
    """How a feature's sketch values are shown: dates for timestamps, else numbers."""
    back = _seconds(feat)
    if back is None:
        return lambda x: x
    mean, std = back
    return lambda x: "—" if x is None else _date(x * std + mean)


def _summary(feat: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    """One cell: a split's distribution in a few words."""
    if "terms" in s:
        top = ", ".join(t for t, _ in s["terms"][:3])
        oov = f", OOV {_pct(s.get('oov'), s.get('items'))}" if "oov" in s else ""
        return f"{_num(s.get('distinct'))} distinct{oov}; top: {top}"
    sk = s.get("before") or s.get("after")
    back = _seconds(feat)
    if sk and sk.get("count") and back is not None:
        return f"mean {_date(sk['mean'] * back[1] + back[0])} ± {_span(sk['std'] * back[1])}, " \
               f"[{_date(sk['min'] * back[1] + back[0])}, {_date(sk['max'] * back[1] + back[0])}] UTC"
    if sk and sk.get("count"):
        return f"mean {_num(sk['mean'])} ± {_num(sk['std'])}, [{_num(sk['min'])}, {_num(sk['max'])}]"
    if "items" in s:
        return _hash_summary(feat, s)
    return ""


def _hash_summary(feat: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    """A hash feature's split: its values, the buckets they used and how crowded those are."""
    buckets = s.get("buckets") or (feat.get("params") or {}).get("buckets")
    head = f"{_num(s['items'])} values hashed"
    use = s.get("bucket_use")
    if use is None:
        if "used_buckets" in s and buckets:  # counted up to MAX_COUNTED_BUCKETS only
            return f"{head} into {_num(buckets)} buckets (used buckets not counted above {_num(MAX_COUNTED_BUCKETS)})"
        return head + (f" into {_num(buckets)} buckets" if buckets else "")
    out = f"{head} into {_num(use['used_buckets'])} of {_num(buckets)} buckets ({_pct(use['used_buckets'], buckets)} used"
    if use["items_per_used_bucket"] is not None:
        out += f", {use['items_per_used_bucket']:.3g} values per used bucket"
    if use["colliding_share_estimate"] is not None:
        distinct = use["distinct_estimate"]
        out += (f"; est. {_num(distinct) if distinct is not None else 'more than ' + _num(buckets)} distinct, "
                f"{100 * use['colliding_share_estimate']:.1f}% of them share a bucket")
    return out + ")"


# ---------------------------------------------------------------- terminal


def render_terminal(report: Mapping[str, Any], console: Any) -> None:
    """A rich summary: splits, features, checks over threshold, rejections, files.

    Every string from the data (terms, names, paths, reasons) is a ``rich.text.Text``
    (``_terminal.text``): no markup parsed, control characters shown, never acted on."""
    from rich.table import Table
    from rich.text import Text

    t_ = text

    def n_(x: Any) -> Any:
        return text(_num(x))

    def p_(part: Any, whole: Any) -> Any:
        return text(_pct(part, whole))

    splits = list(report["splits"])
    console.print(Text.assemble((visible(report["output"]), "bold"), visible(
        f"  layout {report['layout']}, order {report['order']}, format {report['format_version']}, "
        f"created {report.get('created') or '?'}")))
    t = Table(title="splits")
    for col in ("split", "records", "bytes", "shards"):
        t.add_column(col, justify="left" if col == "split" else "right")
    for s, d in report["splits"].items():
        t.add_row(t_(s), n_(d["records"]), n_(d["bytes"]), n_(d["shards"]))
    console.print(t)
    t = Table(title="features")
    t.add_column("feature")
    t.add_column("transform")
    for s in splits:
        t.add_column(t_(f"{s} missing"), justify="right")
        t.add_column(t_(s))
    for name, feat in report["features"].items():
        row = [t_(name), t_(feat["transform"])]
        for s in splits:
            d = feat["splits"].get(s) or {}
            row += [p_(d.get("missing"), d.get("rows")), t_(_summary(feat, d))]
        t.add_row(*row)
    console.print(t)
    _print_oov(report, console)
    for kind in ("skew", "drift"):
        for c in report[kind]:
            over = [f for f in c["findings"] if f["over"]]
            title = visible(f"{kind}: {c['base']} -> {c['other']}")
            if not over:
                console.print(Text.assemble(f"{title}: ", ("no measure over its threshold", "green"),
                                            f" ({len(c['findings'])} checked)"))
                continue
            t = Table(title=Text(title))
            for col in ("feature", "measure", "value", "threshold"):
                t.add_column(col)
            for f in over:
                t.add_row(t_(f["feature"]), t_(f["measure"]), n_(f["value"]), n_(f["threshold"]), style="red")
            console.print(t)
    rej = report["rejections"]
    if rej.get("count"):
        t = Table(title=t_(f"rejected records: {_num(rej['count'])}"))
        for col in ("count", "field", "reason", "example"):
            t.add_column(col)
        for g in rej["groups"][:10]:
            ex = g["examples"][0] if g["examples"] else {}
            where = str(ex.get("file", "")) + (f":{ex['line']}" if "line" in ex else "")
            t.add_row(n_(g["count"]), t_(g["field"]), t_(g["reason"]), t_(where))
        console.print(t)
    t = Table(title="input files")
    for col in ("file", "read", *splits, "rejected"):
        t.add_column(t_(col), justify="left" if col == "file" else "right")
    for f in report["files"][:20]:
        t.add_row(t_(f["path"]), n_(f["read"]), *(n_(f["written"].get(s)) for s in splits), n_(f["rejected"]))
    if len(report["files"]) > 20:
        t.caption = f"... and {len(report['files']) - 20} more (--html or --json lists them all)"
    console.print(t)


def _print_oov(report: Mapping[str, Any], console: Any) -> None:
    """The OOV shares off the training split, those over ``--oov-threshold`` in red."""
    from rich.table import Table
    from rich.text import Text

    checks = report.get("oov") or []
    if not checks:
        return
    over = [c for c in checks if c["over"]]
    limit = _pct(report["oov_threshold"] * 1_000_000, 1_000_000)
    if not over:
        console.print(Text.assemble("out-of-vocabulary shares: ", ("none over", "green"), f" {limit} "
                                    f"({len(checks)} checked)"))
        return
    t = Table(title=f"out-of-vocabulary shares over {limit} (--oov-threshold)")
    for col in ("feature", "split", "OOV items", "share"):
        t.add_column(col)
    for c in over:
        t.add_row(text(c["feature"]), text(c["split"]), text(f"{_num(c['oov'])} of {_num(c['items'])}"),
                  text(_pct(c["oov"], c["items"])), style="red")
    console.print(t)


# -------------------------------------------------------------------- HTML

_COLORS = ("#3b6fb6", "#e07b39", "#5a9e4b", "#a05195", "#7f7f7f")


def _esc(x: Any) -> str:
    """``x`` as HTML text or a quoted attribute value; control characters shown as escapes, as in the terminal."""
    return html.escape(visible(str(x)), quote=True)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "", tid: str = "",
           row_attrs: Sequence[str] | None = None) -> str:
    """A sortable table (cells are escaped unless wrapped in ``_Raw``); ``data-v`` carries numbers to sort by."""
    id_attr = f' id="{_esc(tid)}"' if tid else ""
    out = [f'<table class="sortable {_esc(cls)}"{id_attr}><thead><tr>']
    out += [f"<th>{_esc(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        attrs = row_attrs[i] if row_attrs else ""
        out.append(f"<tr{attrs}>")
        for c in row:
            if isinstance(c, _Raw):
                out.append(f"<td>{c.html}</td>")
            elif isinstance(c, int | float) and not isinstance(c, bool):
                out.append(f'<td class="n" data-v="{c!r}">{_esc(_num(c))}</td>')
            else:
                out.append(f"<td>{_esc('—' if c is None else c)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


class _Raw:
    __slots__ = ("html",)

    def __init__(self, h: str):
        self.html = h


def _bars_svg(labels: Sequence[str], series: Sequence[tuple[str, Sequence[float]]], title: str) -> str:
    """Grouped bars (one colour per series), values as shares of their series' total; a title per bar."""
    n = len(labels)
    if not n or not series:
        return ""
    w, h, pad = 560, 160, 24
    totals = [sum(v) or 1 for _, v in series]
    shares = [[x / t for x in v] for (_, v), t in zip(series, totals, strict=True)]
    top = max((max(s) for s in shares if s), default=0) or 1
    slot = (w - 2 * pad) / n
    bw = max(slot / (len(series) + 0.5), 0.5)
    parts = [f'<svg class="chart" viewBox="0 0 {w} {h + 30}" width="{w}" height="{h + 30}" role="img" '
             f'aria-label="{_esc(title)}"><title>{_esc(title)}</title>',
             f'<line x1="{pad}" y1="{h}" x2="{w - pad}" y2="{h}" stroke="#999"/>']
    for k, (name, _) in enumerate(series):
        for i, share in enumerate(shares[k]):
            bh = (h - 10) * share / top
            x = pad + i * slot + k * bw
            parts.append(f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bw:.1f}" height="{bh:.1f}" '
                         f'fill="{_COLORS[k % len(_COLORS)]}"><title>{_esc(name)} {_esc(labels[i])}: '
                         f'{100 * share:.2f}%</title></rect>')
    for i in (0, n - 1) if n > 1 else (0,):
        parts.append(f'<text x="{pad + i * slot:.1f}" y="{h + 14}" font-size="10">{_esc(labels[i])}</text>')
    for k, (name, _) in enumerate(series):
        parts.append(f'<rect x="{pad + k * 90}" y="{h + 19}" width="9" height="9" fill="{_COLORS[k % len(_COLORS)]}"/>'
                     f'<text x="{pad + k * 90 + 12}" y="{h + 27}" font-size="10">{_esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _histograms(feat: Mapping[str, Any], splits: Sequence[str], which: str) -> str:
    """The ``which`` (before/after) sketches of every split on common bins: the
    first split's 0.5..99.5% range, cut in ``HIST_BINS``; values beyond fall in the end bins."""
    sketches = []
    for s in splits:
        raw = (feat["splits"].get(s) or {}).get(which)
        if raw and raw.get("count"):
            sketches.append((s, ValueSketch.from_json(raw)))
    if not sketches:
        return ""
    lo, hi = sketches[0][1].quantiles([0.005, 0.995])
    assert lo is not None and hi is not None
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    step = (hi - lo) / HIST_BINS
    edges = [-math.inf, *(lo + step * i for i in range(1, HIST_BINS)), math.inf]
    series = [(s, sk.histogram(edges)) for s, sk in sketches]
    labels = [f"{lo + step * i:.4g}..{lo + step * (i + 1):.4g}" for i in range(HIST_BINS)]
    return _bars_svg(labels, series, f"{which} the transform")


def _feature_section(name: str, feat: Mapping[str, Any], splits: Sequence[str], report: Mapping[str, Any]) -> str:
    parts = [f'<section class="feature" id="feature-{_esc(name)}" data-feature="{_esc(name)}">',
             f"<h3>{_esc(name)} <small>{_esc(feat['transform'])} of {_esc(feat.get('source'))} · {_esc(feat['kind'])}"
             f"</small></h3>"]
    over = [f for c in report["skew"] + report["drift"] for f in c["findings"] if f["feature"] == name and f["over"]]
    if over:
        parts.append('<p class="over">over threshold: ' + ", ".join(
            f"{_esc(f['measure'])} {_esc(_num(f['value']))} &gt; {_esc(_num(f['threshold']))}" for f in over) + "</p>")
    params = feat.get("params") or {}
    if params.get("boundaries"):
        parts.append(f"<p>bucket boundaries: {_esc(', '.join(_num(b) for b in params['boundaries']))}</p>")
    if params.get("missing_indicator"):
        shares = ", ".join(f"{_esc(s)} {_pct((feat['splits'].get(s) or {}).get('missing'), (feat['splits'].get(s) or {}).get('rows'))}"
                           for s in splits)
        parts.append(f"<p><code>{_esc(name)}_missing</code> is 1 on the missing rows: {shares}</p>")
    if params.get("vocab_size") is not None:
        parts.append(f"<p>vocab_size {_esc(_num(params['vocab_size']))}</p>")
    if feat.get("kind") == "hash":
        parts += [f"<p>{_esc(s)}: {_esc(_hash_summary(feat, d))}</p>"
                  for s in splits if "items" in (d := feat["splits"].get(s) or {})]
    for c in report.get("oov") or []:
        if c["feature"] == name:
            parts.append(f'<p class="{"over" if c["over"] else "ok"}">out-of-vocabulary on {_esc(c["split"])}: '
                         f'{_esc(_pct(c["oov"], c["items"]))} of {_esc(_num(c["items"]))} items'
                         + (f' (over the threshold {_esc(_pct(c["threshold"] * 1_000_000, 1_000_000))})' if c["over"] else "")
                         + "</p>")
    rows = []
    shown, back = _value(feat), _seconds(feat)
    for s in splits:
        d = feat["splits"].get(s) or {}
        sk = d.get("before") or d.get("after") or {}
        std = _span(sk["std"] * back[1]) if back is not None and sk.get("std") is not None else sk.get("std")
        rows.append([s, d.get("rows"), d.get("missing"), _pct(d.get("missing"), d.get("rows")),
                     shown(sk.get("mean")), std, shown(sk.get("min")), shown(sk.get("max")),
                     d.get("distinct"), _pct(d.get("oov"), d.get("items")) if "oov" in d else None])
    parts.append(_table(["split", "rows", "missing", "missing %", "mean", "std", "min", "max", "distinct", "OOV"], rows))
    for which in ("before", "after"):
        svg = _histograms(feat, splits, which)
        if svg:
            parts.append(f'<div class="hist"><h4>{which} the transform</h4>{svg}</div>')
    qrows = []
    for s in splits:
        for which in ("before", "after"):
            sk = (feat["splits"].get(s) or {}).get(which)
            if sk and sk.get("count"):
                qrows.append([s, which, *(sk["quantiles"].get(k) for k in sk["quantiles"])])
    if qrows:
        first = next(sk for s in splits for w in ("before", "after")
                     if (sk := (feat["splits"].get(s) or {}).get(w)) and sk.get("count"))
        parts.append("<h4>quantiles</h4>" + _table(["split", "values", *(f"p{float(k) * 100:g}" for k in first["quantiles"])], qrows))
    lengths = [(s, (feat["splits"].get(s) or {}).get("lengths")) for s in splits]
    lengths = [(s, v) for s, v in lengths if v]
    if lengths:
        width = max(len(v) for _, v in lengths)
        parts.append("<h4>list lengths</h4>" + _bars_svg([str(i) for i in range(width)],
                                                          [(s, v + [0] * (width - len(v))) for s, v in lengths],
                                                          "list lengths"))
    if any("terms" in (feat["splits"].get(s) or {}) for s in splits):
        terms = [(s, (feat["splits"].get(s) or {})) for s in splits]
        top = [t for t, _ in (terms[0][1].get("terms") or [])[:TERMS_SHOWN]]
        for _, d in terms[1:]:
            top += [t for t, _ in (d.get("terms") or [])[:5] if t not in top]
        counts = {s: dict(d.get("terms") or []) for s, d in terms}
        items = {s: d.get("items") or 0 for s, d in terms}
        trows = [[t, *(x for s, _ in terms for x in (counts[s].get(t, 0), _pct(counts[s].get(t, 0), items[s])))] for t in top]
        parts.append("<h4>top terms</h4>" + _table(["term", *(h for s, _ in terms for h in (s, f"{s} %"))], trows))
        parts.append(_bars_svg(top, [(s, [counts[s].get(t, 0) for t in top]) for s, _ in terms], "term shares"))
    parts.append("</section>")
    return "".join(parts)


def render_html(report: Mapping[str, Any]) -> str:
    """The whole page: one string, no external resource."""
    template = resources.files("pipelines.cli").joinpath("report_template.html").read_text(encoding="utf-8")
    splits = list(report["splits"])
    body = [f"<h1>recordprep report: {_esc(report['output'])}</h1>",
            f"<p>layout {_esc(report['layout'])} · order {_esc(report['order'])} · format {_esc(report['format_version'])}"
            f" · created {_esc(report.get('created') or '?')}</p>"]
    over = report["features_over"]
    body.append(f'<p class="{"over" if over else "ok"}" id="gate">'
                + (f"drift/skew over threshold: {_esc(', '.join(over))}" if over else "no drift/skew over threshold")
                + "</p>")
    body.append('<input id="search" type="search" placeholder="filter tables (feature, term, reason, file)" autofocus>')
    body.append("<h2>splits</h2>" + _table(["split", "records", "bytes", "shards"],
                                           [[s, d["records"], d["bytes"], d["shards"]] for s, d in report["splits"].items()]))
    frows, attrs = [], []
    for name, feat in report["features"].items():
        row: list[Any] = [_Raw(f'<a href="#feature-{_esc(name)}">{_esc(name)}</a>'), feat["transform"], feat["kind"]]
        for s in splits:
            d = feat["splits"].get(s) or {}
            row += [_pct(d.get("missing"), d.get("rows")), _summary(feat, d)]
        frows.append(row)
        attrs.append(f' data-feature="{_esc(name)}"')
    body.append("<h2>features</h2>" + _table(["feature", "transform", "kind", *(h for s in splits for h in (f"{s} missing", s))],
                                             frows, tid="features-table", row_attrs=attrs))
    for kind in ("skew", "drift"):
        for c in report[kind]:
            rows = [[f["feature"], f["measure"], f["value"], f["threshold"], "OVER" if f["over"] else "ok"] for f in c["findings"]]
            body.append(f"<h2>{kind}: {_esc(c['base'])} → {_esc(c['other'])}</h2>"
                        + _table(["feature", "measure", "value", "threshold", "status"], rows, cls="checks",
                                 row_attrs=[' class="over"' if f["over"] else "" for f in c["findings"]]))
    body.append("<h2>features in detail</h2>")
    body += [_feature_section(name, feat, splits, report) for name, feat in report["features"].items()]
    rej = report["rejections"]
    body.append(f"<h2>rejected records: {_esc(_num(rej.get('count', 0)))}</h2>")
    if rej.get("groups"):
        rows = []
        for g in rej["groups"]:
            ex = "".join(f"<li><code>{_esc(e.get('file', ''))}{_esc(':' + str(e['line']) if 'line' in e else '')}</code> "
                         f"{_esc(e['reason'])}<br><code>{_esc(e['record'])}</code></li>" for e in g["examples"])
            rows.append([g["count"], g["field"], g["reason"], _Raw(f"<details><summary>{len(g['examples'])}</summary><ul>{ex}</ul></details>")])
        body.append(_table(["count", "field", "reason", "examples"], rows, tid="rejections-table"))
    body.append("<h2>input files</h2>" + _table(
        ["file", "read", *splits, "rejected"],
        [[f["path"], f["read"], *(f["written"].get(s) for s in splits), f["rejected"]] for f in report["files"]]))
    return _fill(template, title=_esc(f"recordprep report: {report['output']}"), body="\n".join(body),
                 data=_script_json({"output": report["output"], "features_over": over}))


#: The template's placeholders; each appears exactly once, in the place its escaping is for.
_PLACEHOLDER = re.compile(r"\{\{(title|body|data)\}\}")
#: What JSON text must not hold inside ``<script type="application/json">``: ``<``
#: (``</script>``, ``<!--``), ``>`` and ``&`` (for good measure), U+2028/U+2029
#: (line ends to JavaScript). All are inside strings there, where ``\\uXXXX`` means the same.
_SCRIPT_UNSAFE = str.maketrans({c: f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"})


def _script_json(value: Any) -> str:
    """``value`` as JSON text safe inside ``<script type="application/json">``; the page reads it with JSON.parse."""
    return json.dumps(value, allow_nan=False, default=str).translate(_SCRIPT_UNSAFE)


def _fill(template: str, **values: str) -> str:
    """One pass over the template: each placeholder replaced once by its (already escaped)
    value. The values are not scanned again, so data holding ``{{data}}`` stays text."""
    found = sorted(_PLACEHOLDER.findall(template))
    if found != sorted(values):
        raise AssertionError(f"report_template.html has placeholders {found}, expected one each of {sorted(values)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
