"""Conversion workers must not need TensorFlow; readers must not need Beam."""

import subprocess
import sys

BLOCK_TF = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked in this test")
sys.meta_path.insert(0, _Block())
import convert.config, convert.example, convert.sources, convert.splits, convert.spec, convert.tfrecord, convert.vectorize
import pipelines.cli, pipelines.job, pipelines.transforms, pipelines.inspect, pipelines.plan
assert "tensorflow" not in sys.modules
print("ok")
"""


def test_convert_and_pipelines_import_without_tensorflow():
    r = subprocess.run([sys.executable, "-c", BLOCK_TF], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
