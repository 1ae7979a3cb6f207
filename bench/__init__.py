"""Benchmarks for recordprep against the peers a user would pick instead.

Entry point: ``python -m bench.run --size small|default|large`` (``make bench``).
One module per concern:

- ``make_data``      seeded generator of the standard dataset (AVRO + JSON Lines)
- ``naive``          the "usual" Beam pipeline recordprep is compared with
- ``measure``        subprocess runner sampling RSS/CPU of the process tree
- ``convert_bench``  conversion rows (recordprep, naive, decode limits)
- ``reader_bench``   tf.data reader rows (readers, make_batched_features_dataset, limits)
- ``tft``            TF Transform as the TFX peer: its own virtualenv, its rows beside recordprep's
- ``tft_worker``     the TF Transform rows themselves, run with the peer virtualenv's interpreter
- ``report``         Markdown tables, ratios and targets
- ``run``            orchestration: data, measurements, results files

See ``docs/benchmarks.md`` for what each row means and the current results.
"""
