"""Conversion workers must not need TensorFlow; readers must not need Beam."""

import subprocess
import sys

_NO_TF = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked in this test")
sys.meta_path.insert(0, _Block())
"""

BLOCK_TF = _NO_TF + """
import convert.config, convert.example, convert.sources, convert.splits, convert.spec, convert.tfrecord, convert.vectorize
import pipelines.cli, pipelines.job, pipelines.convert_pass, pipelines.commit, pipelines.cli.inspect, pipelines.plan
assert "tensorflow" not in sys.modules
print("ok")
"""


def test_convert_and_pipelines_import_without_tensorflow():
    r = subprocess.run([sys.executable, "-c", BLOCK_TF], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


WAIT_WITHOUT_TF = _NO_TF + """
from pipelines.cli import app
try:
    app(sys.argv[1:])
except SystemExit as e:
    assert "tensorflow" not in sys.modules
    raise
"""


def test_wait_needs_no_tensorflow(tmp_path):
    from _pipelines_data import make_records, write_dataset

    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    paths = write_dataset(tmp_path / "d", make_records(40))
    out = tmp_path / "out"
    run_convert(ConvertOptions(inputs=(str(tmp_path / "d" / "*.avro"),), config=str(paths["config"]), output=str(out)))
    done = subprocess.run([sys.executable, "-c", WAIT_WITHOUT_TF, "wait", str(out), "--timeout", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "is complete" in done.stdout, done.stderr
    missing = subprocess.run([sys.executable, "-c", WAIT_WITHOUT_TF, "wait", str(tmp_path / "none"), "--timeout", "0"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "still incomplete" in missing.stderr, missing.stderr
