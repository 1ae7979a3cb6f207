"""Stragglers on emulated gs://: the latency proxy's straggler mode (tests/_remote.py), and what
``train_dataset``'s default interleave does while one shard stalls (issue 23).

No timing: the straggler is *held* by an event in the proxy, so "while it stalls" is exact.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import _readers_fixtures as fx
import pytest

from bench import remote as bench_remote

pytestmark = pytest.mark.slow

SHARDS = (40,) * 8  # 320 records; shard 0 straggles
WINDOW, BATCH = 40, 10
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def gs_output(remote_stack, tmp_path_factory):
    out = fx.write_output(tmp_path_factory.mktemp("stragglers") / "out", {"train": SHARDS})
    url = remote_stack.upload_dir(out.root, "stragglers/out")
    return out, url


def _proxy_get(stack, obj: str) -> bytes:
    """One object read through the proxy the way TensorFlow reads it (CONNECT, TLS, GET)."""
    import http.client
    import ssl

    ctx = ssl.create_default_context(cafile=str(stack.certs["ca"]))
    conn = http.client.HTTPSConnection("127.0.0.1", stack.proxy.port, context=ctx, timeout=60)
    conn.set_tunnel("storage.googleapis.com", 443)
    try:
        conn.request("GET", f"/{stack.bucket}/{obj}", headers={"Authorization": "Bearer x"})
        return conn.getresponse().read()
    finally:
        conn.close()


def test_proxy_holds_only_the_straggler_and_can_be_changed_while_running(remote_stack, gs_output):
    out, _ = gs_output
    first, second = (out.info.splits["train"].shards[i].file for i in (0, 1))
    remote_stack.proxy_stats(reset=True)
    try:
        config = remote_stack.set_straggler(first, hold=True)
        assert config["straggler"] == {"name": first, "every": None, "factor": 10.0, "hold": True}
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(_proxy_get(remote_stack, f"stragglers/out/{first}")),
                                  daemon=True)
        reader.start()
        # Another object answers while the straggler is held.
        assert _proxy_get(remote_stack, f"stragglers/out/{second}") == (out.root / second).read_bytes()
        deadline = time.monotonic() + DEADLINE_S
        while remote_stack.proxy_stats()["counts"].get("straggler requests held", 0) < 1:
            assert time.monotonic() < deadline, "the straggler's read never reached the proxy"
            time.sleep(0.05)
        assert not got
        remote_stack.set_straggler(first, hold=False)
        reader.join(DEADLINE_S)
        assert got == [(out.root / first).read_bytes()]
        # One shard in N, by the shard number in its name: shard 0 of 8 with every=4, and shard 4.
        config = remote_stack.set_straggler(every=4, factor=3)
        assert config["straggler"] == {"name": None, "every": 4, "factor": 3.0, "hold": False}
        remote_stack.proxy_stats(reset=True)
        for i in range(8):
            _proxy_get(remote_stack, f"stragglers/out/{out.info.splits['train'].shards[i].file}")
        assert remote_stack.proxy_stats()["counts"]["straggler requests"] == 2
    finally:
        remote_stack.set_straggler(None)
    assert remote_stack.proxy_stats()["straggler"]["name"] is None


def test_default_interleave_keeps_yielding_while_a_shard_stalls_and_every_record_arrives_once(
        remote_stack, gs_output):
    """While shard 0's reads are held, ``train_dataset``'s defaults (non-deterministic interleave)
    deliver every record of the 7 other shards that fits in complete windows; after the release,
    the epoch holds every record of the split exactly once."""
    import readers

    out, url = gs_output
    straggler = out.info.splits["train"].shards[0].file
    others = [i for shard in out.ids["train"][1:] for i in shard]
    got: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()
    remote_stack.proxy_stats(reset=True)
    remote_stack.set_straggler(straggler, hold=True)
    try:
        ds = readers.train_dataset(f"{url}/train-*", BATCH, num_epochs=1, seed=3, drop_remainder=False,
                                   shuffle_buffer=WINDOW)

        def consume() -> None:
            try:
                for features, _ in ds:
                    got.extend(int(v) for v in features["count"].numpy()[:, 0])
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                errors.append(e)
            finally:
                done.set()

        threading.Thread(target=consume, daemon=True).start()
        # Every complete window of the other shards' records can be delivered; only the last
        # window, which waits for the straggler's records, may be missing.
        want = len(others) - WINDOW
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < want:
            assert not errors, errors
            assert time.monotonic() < deadline, (
                f"while the straggler was held the pipeline delivered only {len(got)} of the {want} "
                f"records it could have: the other shards were stalled behind it")
            time.sleep(0.05)
        assert remote_stack.proxy_stats()["counts"].get("straggler requests held", 0) >= 1
        assert not done.is_set()  # the epoch is not over without the straggler
        assert set(got) <= set(others)  # nothing of the held shard yet
    finally:
        remote_stack.set_straggler(None)  # releases the held reads
    assert done.wait(DEADLINE_S), "the epoch did not finish after the straggler was released"
    assert not errors, errors
    assert Counter(got) == Counter(out.all_ids("train"))


def test_straggler_ratios_compare_each_reader_with_its_own_no_straggler_rate():
    rows = {
        "gzip:straggler:train_dataset": {"ok": True, "examples_per_s": 90.0},
        "gzip:gs:train_dataset": {"ok": True, "examples_per_s": 100.0},
        "gzip:straggler:deterministic": {"ok": True, "examples_per_s": 30.0},
        "gzip:straggler:deterministic:base": {"ok": True, "examples_per_s": 100.0},
        "gzip:straggler:mbfd": {"ok": True, "examples_per_s": 50.0},
        "gzip:gs:mbfd": {"ok": False},
    }
    kept = bench_remote.straggler_ratios({"rows": rows}, "gzip")
    assert kept == {"train_dataset": pytest.approx(0.9), "deterministic": pytest.approx(0.3), "mbfd": None}
    lines = "\n".join(bench_remote.straggler_markdown({"rows": rows, "compressions": ["gzip"],
                                                       "straggler": {"factor": 10, "shards": 16, "file": "x"}}))
    assert "90%" in lines and "MET" in lines and "NOT MET" not in lines
    rows["gzip:straggler:train_dataset"]["examples_per_s"] = 70.0
    lines = "\n".join(bench_remote.straggler_markdown({"rows": rows, "compressions": ["gzip"],
                                                       "straggler": {"factor": 10, "shards": 16, "file": "x"}}))
    assert "NOT MET" in lines



def test_service_rows_report_the_trainer_cpu_against_in_process():
    from bench.reader_bench import service_markdown

    def row(case, rate, cpu, ok=True):
        return {"label": case, "case": case, "ok": ok, "runs": 1, "examples_per_s": rate, "cpu_us_per_example": cpu,
                "cpu_cores_used": 0.5, "workers_cores": 1.5, "error": None if ok else "boom"}

    table = {"dir": "out", "rows": {"in-process": row("in-process", 100.0, 4.0), "service:1": row("service:1", 50.0, 1.0),
                                    "service:2": row("service:2", 0, 0, ok=False)}}
    lines = service_markdown(table)
    assert "| service:1 | 50 | 0.50x | 1.00 | 0.50 | 1.50 | 1 |" in lines
    assert "| in-process | 100 | 1.00x | 4.00 | 0.50 | — | 1 |" in lines
    assert any(line.startswith("| service:2 | FAILED: boom") for line in lines)
    assert service_markdown(None) == ["_tf.data service rows not run_"]
