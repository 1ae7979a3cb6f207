"""The C token indexer of text columns (convert/_tokens.c); pyproject.toml holds the rest.

Here rather than in pyproject.toml, whose ``ext-modules`` table setuptools still
marks experimental. Optional: without a C compiler the install still succeeds
and convert/prepare.py runs its Python path (the same output, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("convert._tokens", ["convert/_tokens.c"], optional=True, extra_compile_args=["-O2"])])
