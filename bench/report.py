"""Markdown tables, ratios and targets from one run's results.

Every ratio compares rows measured in the same run on the same machine (and
the same input); absolute numbers are printed for context, but on a shared
2-core machine they move with the load, ratios much less. The targets of the
issue are printed beside the measured values and marked MET / NOT MET as
measured, nothing rounded in their favour.
"""

from __future__ import annotations

from typing import Any

#: (key, description, comparison, threshold, unit, sizes it is defined for)
TARGETS = {
    "convert_vs_naive": ("recordprep / naive Beam, records/s on the same input", ">=", 15.0, "x", ("default",)),
    "convert_peak_rss": ("recordprep AVRO -> gzip peak RSS", "<=", 600.0, "MB", ("default",)),
    "convert_rate": ("recordprep AVRO -> gzip end-to-end", ">=", 27_000.0, "records/s", None),
    "json_input_vs_orjson": ("recordprep JSON input stage / plain orjson parse, records/s", ">=", 0.5, "x", None),
    "json_convert_vs_orjson": ("recordprep JSON -> gzip end-to-end / plain orjson parse, records/s", ">=", 0.5, "x", None),
    "reader_vs_mbfd_gzip": ("readers / make_batched_features_dataset (gzip shards)", ">=", 2.0, "x", None),
    "reader_vs_mbfd_none": ("readers / make_batched_features_dataset (uncompressed)", ">=", 2.0, "x", None),
    "reader_ttfb_gzip": ("readers time to first batch (gzip shards)", "<=", 0.5, "s", None),
    "reader_ttfb_none": ("readers time to first batch (uncompressed)", "<=", 0.5, "s", None),
    "remote_vs_mbfd_gzip": ("gs:// (emulated): readers / make_batched_features_dataset (gzip)", ">=", 4.0, "x", None),
    "remote_vs_mbfd_none": ("gs:// (emulated): readers / make_batched_features_dataset (uncompressed)", ">=", 4.0, "x", None),
    "remote_vs_local_gzip": ("gs:// (emulated): readers / readers on local disk (gzip)", ">=", 0.7, "x", None),
    "remote_vs_local_none": ("gs:// (emulated): readers / readers on local disk (uncompressed)", ">=", 0.7, "x", None),
    # The "if a packed layout ... is needed to get there" reading of the 4x target.
    "remote_packed_vs_mbfd_gzip": ("gs:// (emulated): readers on --layout packed shards / make_batched_features_dataset "
                                   "on the default layout's shards (gzip)", ">=", 4.0, "x", None),
    # TF Transform (bench/tft.py), the peer a TFX user would pick: ratios recordprep / TF Transform.
    "tft_convert_rate": ("recordprep / TF Transform AnalyzeAndTransformDataset, records/s (same input and run)",
                         ">=", 15.0, "x", None),
    "tft_convert_cpu": ("recordprep / TF Transform, CPU-s per record", "<=", 0.1, "x", None),
    "tft_convert_rss": ("recordprep / TF Transform, peak RSS", "<=", 0.25, "x", None),
    "tft_layer_batch": ("recordprep serving layer / TF Transform's transform_features_layer, records/s "
                        "(batches of 1,024)", ">=", 2.0, "x", None),
    "tft_layer_single": ("recordprep serving layer / TF Transform's layer, median latency of one record",
                         "<=", 0.5, "x", None),
    # The export runs the layer, then the model: what it adds to the model's batch latency, as a multiple of the
    # layer's own batch time measured in the same process (1.1: the layer's time + 10%), realistic model.
    "export_added_per_layer": ("serving export: batch latency added to the model / the layer's standalone batch "
                               "latency (model of realistic size, batches of 1,024)", "<=", 1.1, "x", None),
    # Ray Data and Petastorm (bench/parquet_peers.py, issue 48): the same Parquet twin, the same cores.
    "ray_convert_rate": ("recordprep / Ray Data conversion of the Parquet twin, records/s (same cores)",
                         ">=", 3.0, "x", None),
    "ray_convert_rss": ("recordprep / Ray Data conversion, peak RSS of the process tree", "<=", 1.0, "x", None),
    "petastorm_feed_rate": ("recordprep train_dataset / Petastorm on Parquet + Keras layers, examples/s into fit",
                            ">=", 5.0, "x", None),
    "ray_feed_rate": ("recordprep train_dataset / Ray Data iter_tf_batches + Keras layers, examples/s into fit",
                      ">=", 5.0, "x", None),
    "parquet_break_even": ("break-even: epochs after which converting once costs less wall time than reading "
                           "Parquet every epoch (the later of the two peers)", "<=", 2.0, "epochs", None),
    # Shuffle quality (bench/shuffle_quality.py, issue 18): readers.train_dataset with its defaults on the output
    # converted with recordprep's defaults, input sorted by `ts` across its files.
    "shuffle_spread": ("shuffle: spread of per-batch means of the sorted field / iid sampling (train_dataset, "
                       "recordprep's defaults)", "<=", 1.5, "x", None),
    "shuffle_files": ("shuffle: mean share of the input files a batch draws from (train_dataset, recordprep's "
                      "defaults)", ">=", 90.0, "%", None),
}



def _conversion_rows(rows: dict, keys) -> list[str]:
    """Table rows (records, records/s, CPU-s per 1k records, peak RSS, runs) of the conversion ``keys`` present."""
    lines = []
    for key in keys:
        r = rows.get(key)
        if not r:
            continue
        if not r["ok"]:
            lines.append(f"| {r['label']} | — | FAILED: {r.get('error')} | | | {r['runs']} |")
            continue
        lines.append(f"| {r['label']} | {r['records']:,} | {_num(r['records_per_s'])} | {_num(r['cpu_s_per_1k'], 3)} "
                     f"| {_num(r['peak_rss_mb'])} | {r['runs']} |")
    return lines

def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _row_get(rows: dict[str, Any], key: str, field: str) -> float | None:
    r = rows.get(key)
    if not r or not r.get("ok"):
        return None
    return r.get(field)


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured value and status (MET / NOT MET / NOT MEASURED)."""
    size = results["size"]
    conv = (results.get("conversion") or {}).get("rows", {})
    rd = (results.get("readers") or {}).get("rows", {})
    naive_peer = "recordprep_subset_gzip" if "recordprep_subset_gzip" in conv else "recordprep_avro_gzip"
    values = {
        "convert_vs_naive": _ratio(_row_get(conv, naive_peer, "records_per_s"), _row_get(conv, "naive", "records_per_s")),
        "convert_peak_rss": _row_get(conv, "recordprep_avro_gzip", "peak_rss_mb"),
        "convert_rate": _row_get(conv, "recordprep_avro_gzip", "records_per_s"),
        "json_input_vs_orjson": _ratio(_row_get(conv, "recordprep_json_read", "records_per_s"), _row_get(conv, "limit_json", "records_per_s")),
        "json_convert_vs_orjson": _ratio(_row_get(conv, "recordprep_json_gzip", "records_per_s"), _row_get(conv, "limit_json", "records_per_s")),
        "reader_vs_mbfd_gzip": _ratio(_row_get(rd, "train_dataset:gzip", "examples_per_s"), _row_get(rd, "mbfd:gzip", "examples_per_s")),
        "reader_vs_mbfd_none": _ratio(_row_get(rd, "train_dataset:none", "examples_per_s"), _row_get(rd, "mbfd:none", "examples_per_s")),
        "reader_ttfb_gzip": _row_get(rd, "train_dataset:gzip", "time_to_first_batch_s"),
        "reader_ttfb_none": _row_get(rd, "train_dataset:none", "time_to_first_batch_s"),
    }
    from bench import remote as _remote_table

    for comp in ("gzip", "none"):
        q = _remote_table.ratios(results.get("remote"), comp)
        values[f"remote_vs_mbfd_{comp}"] = q["remote_vs_mbfd"]
        values[f"remote_vs_local_{comp}"] = q["remote_vs_local"]
    values["remote_packed_vs_mbfd_gzip"] = _remote_table.ratios(results.get("remote"), "gzip")["packed_vs_mbfd"]
    values.update(tft_ratios(results.get("tft")))
    notes = tft_notes(results.get("tft"))
    from bench import parquet_peers

    values.update(parquet_peers.ratios(results.get("parquet_peers")))
    notes.update(parquet_peers.notes(results.get("parquet_peers")))
    shuffled = ((results.get("shuffle") or {}).get("rows") or {}).get("train_dataset:shuffled") or {}
    values["shuffle_spread"], values["shuffle_files"] = shuffled.get("spread"), shuffled.get("files")
    if not shuffled:
        why = ("shuffle-quality rows not run (--skip-shuffle)" if results.get("shuffle") is None
               else f"shuffle-quality rows failed: {results['shuffle'].get('error')}")
        notes.update(shuffle_spread=why, shuffle_files=why)
    out = []
    for key, (desc, op, thr, unit, sizes) in TARGETS.items():
        v = values[key]
        if v is None:
            status = "NOT MEASURED"
        else:
            met = v >= thr if op == ">=" else v <= thr
            status = "MET" if met else "NOT MET"
        note = ""
        if sizes and size not in sizes:
            note = f"target is defined at {'/'.join(sizes)} size; shown for information"
        if v is None and key in notes:
            note = notes[key]
        out.append({"key": key, "description": desc, "op": op, "threshold": thr, "unit": unit,
                    "value": v, "status": status, "note": note})
    return out


def tft_ratios(tft: dict[str, Any] | None) -> dict[str, float | None]:
    """recordprep / TF Transform for each TF Transform target (None where a row is missing)."""
    rows = (tft or {}).get("rows", {})
    g = lambda k, f: _row_get(rows, k, f)  # noqa: E731
    return {
        "tft_convert_rate": _ratio(g("recordprep_convert", "records_per_s"), g("tft_convert", "records_per_s")),
        "tft_convert_cpu": _ratio(g("recordprep_convert", "cpu_s_per_1k"), g("tft_convert", "cpu_s_per_1k")),
        "tft_convert_rss": _ratio(g("recordprep_convert", "peak_rss_mb"), g("tft_convert", "peak_rss_mb")),
        "tft_layer_batch": _ratio(g("recordprep_layer", "batch_records_per_s"), g("tft_layer", "batch_records_per_s")),
        "tft_layer_single": _ratio(g("recordprep_layer", "single_median_ms"), g("tft_layer", "single_median_ms")),
        "export_added_per_layer": g("recordprep_layer", "big_export_added_per_layer"),
    }


def tft_notes(tft: dict[str, Any] | None) -> dict[str, str]:
    """Why a TF Transform target has no value: the peer skipped, or recordprep's layer not there yet."""
    keys = ("tft_convert_rate", "tft_convert_cpu", "tft_convert_rss", "tft_layer_batch", "tft_layer_single",
            "export_added_per_layer")
    if tft is None:
        return dict.fromkeys(keys, "TF Transform rows not run (--skip-tft)")
    if tft.get("skipped"):
        return dict.fromkeys(keys, "TF Transform skipped: " + tft["skipped"])
    layer = tft.get("rows", {}).get("recordprep_layer") or {}
    if layer.get("unavailable"):
        return dict.fromkeys(keys[3:], "recordprep's serving layer: " + layer.get("error", "not available yet"))
    return {}


def tft_md(results: dict[str, Any]) -> list[str]:
    tft = results.get("tft")
    if tft is None:
        return ["_not run (--skip-tft)_"]
    if tft.get("skipped"):
        return [f"_skipped: {tft['skipped']}_"]
    v = tft["peer"]["versions"]
    rows = tft["rows"]
    lines = [f"Peer virtualenv `bench/.peers/tft-venv`: tensorflow-transform {v['tensorflow-transform']}, "
             f"TensorFlow {v['tensorflow']}, apache-beam {v['apache-beam']}, tfx-bsl {v['tfx-bsl']}, Python "
             f"{v['python']} (built {tft['peer']['built']} in {tft['peer']['install_seconds']:.0f} s). Conversion: "
             f"analysis on the train split of the same records, {tft['workers']} worker process(es) for both, "
             f"shards {tft.get('shards')}.", "",
             "| row | records | records/s | CPU-s / 1k records | peak RSS (MB) | runs |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += _conversion_rows(rows, ("recordprep_convert", "tft_convert"))
    lines += ["", "| serving layer | batch of 1,024: median ms | records/s | one record: median ms | p90 ms "
              "| peak RSS (MB) |", "|---|---:|---:|---:|---:|---:|"]
    for key in ("tft_layer", "recordprep_layer"):
        r = rows.get(key)
        if not r:
            continue
        if not r["ok"]:
            what = r.get("error") if r.get("unavailable") else f"FAILED: {r.get('error')}"
            lines.append(f"| {r['label']} | {what} | | | | |")
            continue
        lines.append(f"| {r['label']} | {r['batch_median_ms']:.2f} | {_num(r['batch_records_per_s'])} "
                     f"| {r['single_median_ms']:.2f} | {r['single_p90_ms']:.2f} | {_num(r['peak_rss_mb'])} |")
    q = tft_ratios(tft)
    lines += ["", "| ratio (recordprep / TF Transform) | measured |", "|---|---:|"]
    names = {"tft_convert_rate": "conversion records/s", "tft_convert_cpu": "conversion CPU-s per record",
             "tft_convert_rss": "conversion peak RSS", "tft_layer_batch": "serving layer records/s (batches of 1,024)",
             "tft_layer_single": "serving layer median latency (one record)",
             "export_added_per_layer": "serving export's added batch latency / the layer's own (not a TF Transform ratio)"}
    lines += [f"| {names[k]} | {_fmt_value(val, 'x')} |" for k, val in q.items()]
    return lines


def _fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "%":
        return f"{v:.1f}%"
    if unit == "epochs":
        return f"{v:.2f} epochs"
    if unit == "MB":
        return f"{v:,.0f} MB"
    return f"{v:,.0f} {unit}"


def _fmt_target(op: str, thr: float, unit: str) -> str:
    sym = "≥" if op == ">=" else "≤"
    return f"{sym} {_fmt_value(thr, unit)}"


def conversion_md(results: dict[str, Any]) -> list[str]:
    conv = results.get("conversion")
    if not conv:
        return ["_conversion table not run_"]
    rows = conv["rows"]
    order = ["recordprep_avro_gzip", "recordprep_avro_gzip_workers", "recordprep_avro_none", "recordprep_avro_gzip_packed",
             "recordprep_avro_gzip_fastavro", "recordprep_json_gzip", "recordprep_parquet_gzip", "recordprep_subset_gzip",
             "naive", "recordprep_json_read", "recordprep_parquet_read", "wide_auto", "wide_fastavro", "limit_avro",
             "limit_polars", "limit_json", "limit_parquet"]
    lines = ["| row | records | records/s | CPU-s / 1k records | peak RSS (MB) | runs |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += _conversion_rows(rows, order)
    lines.append("")
    naive_peer = "recordprep_subset_gzip" if "recordprep_subset_gzip" in rows else "recordprep_avro_gzip"
    g = lambda k, f: _row_get(rows, k, f)  # noqa: E731
    ratio_lines = [
        ("recordprep / naive Beam, records/s (same input)", _ratio(g(naive_peer, "records_per_s"), g("naive", "records_per_s"))),
        ("naive / recordprep, CPU-s per record (same input)", _ratio(g("naive", "cpu_s_per_1k"), g(naive_peer, "cpu_s_per_1k"))),
        ("naive / recordprep, peak RSS (same input)", _ratio(g("naive", "peak_rss_mb"), g(naive_peer, "peak_rss_mb"))),
        ("recordprep AVRO / limit fastavro decode, records/s", _ratio(g("recordprep_avro_gzip", "records_per_s"), g("limit_avro", "records_per_s"))),
        ("recordprep AVRO / limit polars decode, records/s", _ratio(g("recordprep_avro_gzip", "records_per_s"), g("limit_polars", "records_per_s"))),
        ("recordprep default / --avro-decoder fastavro, records/s", _ratio(g("recordprep_avro_gzip", "records_per_s"), g("recordprep_avro_gzip_fastavro", "records_per_s"))),
        ("recordprep JSON / limit JSON decode, records/s", _ratio(g("recordprep_json_gzip", "records_per_s"), g("limit_json", "records_per_s"))),
        ("recordprep JSON input stage / limit JSON decode, records/s", _ratio(g("recordprep_json_read", "records_per_s"), g("limit_json", "records_per_s"))),
        ("recordprep JSON / recordprep AVRO, records/s", _ratio(g("recordprep_json_gzip", "records_per_s"), g("recordprep_avro_gzip", "records_per_s"))),
        ("recordprep Parquet / recordprep AVRO (same records), records/s", _ratio(g("recordprep_parquet_gzip", "records_per_s"), g("recordprep_avro_gzip", "records_per_s"))),
        ("recordprep Parquet input stage / limit pyarrow Parquet decode, records/s", _ratio(g("recordprep_parquet_read", "records_per_s"), g("limit_parquet", "records_per_s"))),
        ("recordprep default / --workers 1 (in-process), records/s", _ratio(g("recordprep_avro_gzip", "records_per_s"), g("recordprep_avro_gzip_workers", "records_per_s"))),
        ("recordprep gzip / uncompressed, records/s", _ratio(g("recordprep_avro_gzip", "records_per_s"), g("recordprep_avro_none", "records_per_s"))),
        ("wide schema: --avro-decoder auto / fastavro, records/s", _ratio(g("wide_auto", "records_per_s"), g("wide_fastavro", "records_per_s"))),
    ]
    lines += ["| ratio | measured |", "|---|---:|"]
    lines += [f"| {name} | {_fmt_value(v, 'x')} |" for name, v in ratio_lines]
    lines.append("")
    if conv.get("naive_files") and conv["naive_files"] != conv["total_files"]:
        lines.append(f"The naive pipeline ran on {conv['naive_files']} of {conv['total_files']} input files "
                     f"({conv['naive_records']:,} records) and is compared per record with recordprep on exactly "
                     f"those files (the `same ... files as naive` row).")
    v = conv.get("verify")
    if v is not None:
        if v.get("ok"):
            lines.append(f"Same job check (`naive.verify`): the naive pipeline's vocabularies and statistics equal "
                         f"recordprep's Analyzer on the same {v.get('records_analyzed', 0):,} records, its split counts "
                         f"equal recordprep's split rule, and {v.get('records_compared', 0):,} Examples are identical "
                         f"feature by feature (floats within 1 ulp).")
        else:
            lines.append("Same job check (`naive.verify`) FAILED: " + "; ".join(v.get("problems", [])[:5]))
    return lines


def readers_md(results: dict[str, Any]) -> list[str]:
    rd = results.get("readers")
    if not rd:
        return ["_reader table not run_"]
    rows = rd["rows"]
    lines = [f"Batch {rd['batch']}; examples/s = median of {rd['windows']['count']} windows "
             f"(each ≥ {rd['windows']['seconds']} s) after ≥ {rd['warmup']['seconds']} s of warm-up; "
             "train split; fresh process per row.", "",
             "| row | shards | examples/s | time to first batch (s) | CPU-µs / example | cores busy | peak RSS (MB) | runs |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows.values():
        if r["step_ms"]:
            continue
        comp = r["compression"] if r["case"] not in ("parse", "avro_gen") else ("in memory" if r["case"] == "parse" else "input AVRO")
        if not r["ok"]:
            lines.append(f"| {r['label']} | {comp} | FAILED: {r.get('error')} | | | | | {r['runs']} |")
            continue
        ttfb = "—" if r["case"] == "parse" else f"{r['time_to_first_batch_s']:.2f}"
        lines.append(f"| {r['label']} | {comp} | {_num(r['examples_per_s'])} | {ttfb} | {r['cpu_us_per_example']:.1f} "
                     f"| {r['cpu_cores_used']:.2f} | {_num(r['peak_rss_mb'])} | {r['runs']} |")
    lines.append("")
    g = lambda k: _row_get(rows, k, "examples_per_s")  # noqa: E731
    c = lambda k: _row_get(rows, k, "cpu_us_per_example")  # noqa: E731
    ratio_lines = []
    for comp in ("gzip", "none"):
        if f"train_dataset:{comp}" not in rows:
            continue
        ratio_lines += [
            (f"readers / make_batched_features_dataset ({comp})", _ratio(g(f"train_dataset:{comp}"), g(f"mbfd:{comp}"))),
            (f"readers / naive per-record ({comp})", _ratio(g(f"train_dataset:{comp}"), g(f"naive:{comp}"))),
            (f"readers / limit raw read ({comp})", _ratio(g(f"train_dataset:{comp}"), g(f"raw:{comp}"))),
            # CPU per example is what load does not move (wall rates follow the cores each row got):
            # the peer's over the reader's, and the reader's cost over the raw read's.
            (f"CPU-µs per example: make_batched_features_dataset / readers ({comp})",
             _ratio(c(f"mbfd:{comp}"), c(f"train_dataset:{comp}"))),
            (f"CPU-µs per example: readers / limit raw read ({comp})",
             _ratio(c(f"train_dataset:{comp}"), c(f"raw:{comp}"))),
        ]
    if "train_dataset_buffer:gzip" in rows:
        ratio_lines += [
            ("readers with shuffle_mode=buffer / make_batched_features_dataset (gzip)",
             _ratio(g("train_dataset_buffer:gzip"), g("mbfd:gzip"))),
            ("readers: window shuffle / buffer shuffle (gzip)",
             _ratio(g("train_dataset:gzip"), g("train_dataset_buffer:gzip"))),
        ]
    if "train_dataset:gzip, packed" in rows:
        ratio_lines += [
            ("readers / make_batched_features_dataset (gzip, packed; both unpack)",
             _ratio(g("train_dataset:gzip, packed"), g("mbfd:gzip, packed"))),
            ("readers on packed / readers on one Feature per column (gzip)",
             _ratio(g("train_dataset:gzip, packed"), g("train_dataset:gzip"))),
            ("readers / limit raw read (gzip, packed)", _ratio(g("train_dataset:gzip, packed"), g("raw:gzip, packed"))),
        ]
    ratio_lines += [
        ("readers (none) / limit parse only", _ratio(g("train_dataset:none"), g("parse"))),
        ("readers (gzip) / AVRO via from_generator", _ratio(g("train_dataset:gzip"), g("avro_gen"))),
    ]
    lines += ["| ratio | measured |", "|---|---:|"]
    lines += [f"| {name} | {_fmt_value(v, 'x')} |" for name, v in ratio_lines]
    step_rows = [r for r in rows.values() if r["step_ms"]]
    if step_rows:
        lines += ["", f"Simulated training step: the loop sleeps {rd['step_ms']:g} ms after each batch "
                  f"(at most {rd['batch'] / rd['step_ms'] * 1000:,.0f} examples/s); input-wait fraction = "
                  "time blocked in `next()` / total (median window).", "",
                  "| row | shards | examples/s | input-wait fraction |", "|---|---|---:|---:|"]
        for r in step_rows:
            if not r["ok"]:
                lines.append(f"| {r['label']} | {r['compression']} | FAILED: {r.get('error')} | |")
                continue
            lines.append(f"| {r['label']} | {r['compression']} | {_num(r['examples_per_s'])} | {r['input_wait_fraction']:.0%} |")
    return lines


def shuffle_md(results: dict[str, Any]) -> list[str]:
    """The shuffle-quality rows (:mod:`bench.shuffle_quality`): one epoch of the train split per row."""
    sh = results.get("shuffle")
    if sh is None:
        return ["_not run (--skip-shuffle)_"]
    if not sh.get("rows"):
        return [f"_FAILED: {sh.get('error')}_"]
    lines = [f"Input sorted by `ts` across its {sh['input_files']} files; one epoch of the train split in batches of "
             f"{sh['batch']:,}. Spread: standard deviation of the per-batch means of `ts` / what iid batches give "
             "(1.0 ideal); files: mean share of the input files a batch draws from (100% ideal).", "",
             "| row | spread | files | batches |", "|---|---:|---:|---:|"]
    lines += [f"| {r['label']} | {r['spread']:.2f} | {r['files']:.1f}% | {r['batches']:,} |" for r in sh["rows"].values()]
    return lines


def scaling_md(results: dict[str, Any]) -> list[str]:
    sc = results.get("scaling")
    if not sc:
        return []
    a, b = (sc["rows"].get(s) for s in sc["sizes"])
    lines = ["| size | records | work time (s) | records/s | CPU-s / 1k records | peak RSS (MB) |",
             "|---|---:|---:|---:|---:|---:|"]
    for size, r in zip(sc["sizes"], (a, b), strict=True):
        if not r or not r.get("ok"):
            lines.append(f"| {size} | FAILED: {(r or {}).get('error')} | | | | |")
            continue
        lines.append(f"| {size} | {r['records']:,} | {r['work_wall_s']:.1f} | {_num(r['records_per_s'])} "
                     f"| {r['cpu_s_per_1k']:.3f} | {_num(r['peak_rss_mb'])} |")
    if a and b and a.get("ok") and b.get("ok"):
        n = b["records"] / a["records"]
        t = b["work_wall_s"] / a["work_wall_s"]
        m = b["peak_rss_mb"] / a["peak_rss_mb"]
        lines += ["", f"{n:.0f}x the records took {t:.2f}x the time (linear: {t / n:.2f} per record relative to "
                  f"{sc['sizes'][0]}; {'linear' if t / n <= 1.25 else 'SUPERLINEAR'}) and {m:.2f}x the peak memory "
                  f"({'flat' if m <= 1.25 else 'GROWS with input'})."]
    return lines


def targets_md(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | measured | target | status |", "|---|---:|---:|---|"]
    for t in targets:
        status = t["status"] + (f" ({t['note']})" if t["note"] else "")
        lines.append(f"| {t['description']} | {_fmt_value(t['value'], t['unit'])} | "
                     f"{_fmt_target(t['op'], t['threshold'], t['unit'])} | {status} |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    d = results["dataset"]
    lines = [f"# recordprep benchmarks: size `{results['size']}`", "",
             f"Measured {results['started']} → {results['finished']} on {m['nproc']} cores ({m['cpu_model']}), "
             f"{m['ram_gb']:.1f} GB RAM, load average {m['loadavg_start']} at start and {m['loadavg_end']} at end"
             + (f" (other processes used a median of {m['others_cores']['median']:.2f} cores while rows ran)"
                if m.get("others_cores") else "") + "; "
             f"Python {m['python']}, apache-beam {m['beam']}, TensorFlow {m['tensorflow']}, fastavro {m['fastavro']}; "
             f"commit {m['commit']}{' (with uncommitted changes)' if m.get('dirty') else ''}.", "",
             f"Dataset: {d['records']:,} records (generator v{d['generator_version']}), {d['files']} AVRO files "
             f"(deflate, {d['avro_mb']:.1f} MB) and the same records as JSON Lines ({d['json_mb']:.1f} MB); "
             f"config `bench/features.yaml`. Command: `{results['command']}`.", "",
             "## Targets", "", *targets_md(results["targets"]), "",
             "## Conversion", "", *conversion_md(results), "",
             "## TF Transform (the TFX peer)", "", *tft_md(results), ""]
    if "parquet_peers" in results:
        from bench import parquet_peers

        lines += ["## Ray Data and Petastorm (Parquet peers)", "", *parquet_peers.markdown(results["parquet_peers"]), ""]
    if results.get("scaling"):
        lines += ["## Scaling (recordprep AVRO -> gzip)", "", *scaling_md(results), ""]
    lines += ["## Readers", "", *readers_md(results), ""]
    if "shuffle" in results:
        lines += ["## Shuffle quality", "", *shuffle_md(results), ""]
    if results.get("remote"):
        from bench import remote as _remote_table

        lines += ["## Readers on emulated remote storage (gs://)", "", *_remote_table.markdown(results["remote"]), ""]
    if results.get("remote_s3"):
        from bench import remote_s3

        lines += ["## Readers on emulated s3:// (staged)", "", *remote_s3.markdown(results["remote_s3"]), ""]
    if results.get("remote_convert"):
        from bench import remote_convert

        rc = results["remote_convert"]
        lines += ["## Requests of a conversion on emulated gs://", "", *remote_convert.markdown(rc["rows"], rc["meta"]), ""]
    if results.get("remote_azure"):
        from bench import remote_s3

        lines += ["## Readers on emulated azfs:// (Azurite, staged)", "", *remote_s3.markdown(results["remote_azure"]), ""]
    if results.get("service"):
        from bench.reader_bench import service_markdown

        lines += ["## Reading through a tf.data service", "", *service_markdown(results["service"]), ""]
    if results.get("notes"):
        lines += ["## Notes", "", *[f"- {n}" for n in results["notes"]], ""]
    return "\n".join(lines)
