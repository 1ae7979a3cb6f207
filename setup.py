"""The C parts of convert/ (the token indexer of text columns, ``convert/_tokens.c``;
the Example encoder, ``convert/_example.c``; TFRecord framing, ``convert/_tfrecord.c``;
the Parquet footer's encryption-marker walk, ``convert/_footer.c``); pyproject.toml
holds the rest.

Here rather than in pyproject.toml, whose ``ext-modules`` table setuptools still
marks experimental. Optional: without a C compiler the install still succeeds
and convert/prepare.py, example.py, tfrecord.py and formats/parquet_footer.py run their
Python paths (the same output, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(f"convert.{name}", [f"convert/{name}.c"], optional=True, extra_compile_args=["-O2"])
                   for name in ("_tokens", "_example", "_tfrecord", "_footer")])
