# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# The virtualenv is keyed on the dependency files: it is rebuilt only when
# pyproject.toml or constraints.txt change, or the C modules (setup.py, convert/*.c),
# which the editable install compiles in place.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SIZE   ?= default
PYTEST_ARGS ?=

.PHONY: install demo test test-fast test-latest lint bench fuzz clean

$(STAMP): pyproject.toml constraints.txt setup.py $(wildcard convert/*.c)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# setuptools' "Editable installation" notice is a warning block on every install: filtered by its message.
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

## Convert the bundled example data (AVRO and JSON Lines) on the local runner,
## train a small Keras model from readers.train_dataset, export it with the
## converter's transforms inside, and score raw JSON lines with the export.
## TensorFlow's start-up banners (oneDNN, log lines) are turned off for the demo.
DEMO_ENV := TF_CPP_MIN_LOG_LEVEL=2 TF_ENABLE_ONEDNN_OPTS=0
demo: $(STAMP)
	$(BIN)/recordprep convert --input 'examples/data/*.avro' --config examples/features.yaml --output demo-out/avro --overwrite
	$(BIN)/recordprep convert --input 'examples/data/*.jsonl' --config examples/features.yaml --output demo-out/json --overwrite --max-error-fraction 0.01
	$(BIN)/recordprep inspect demo-out/avro --examples 1
	rm -rf demo-out/model
	$(DEMO_ENV) $(BIN)/python examples/train.py demo-out/avro --steps 300 --export demo-out/model
	$(DEMO_ENV) $(BIN)/python examples/predict.py demo-out/model examples/data/clicks-1.jsonl -n 5

## The whole test suite (slow end-to-end tests included).
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

## The upgrade leg: the newest Beam, TensorFlow, fastavro and polars that pyproject.toml's ranges allow
## (no constraints.txt, --upgrade every time) in a second virtualenv, then the fast tests there, so
## the ranges stay true. Not part of `make test` (it downloads and installs): make test-latest [PYTEST_ARGS=...]
LATEST_VENV ?= .cache/latest-venv
LATEST_BIN  := $(LATEST_VENV)/bin
LATEST_PKGS := apache-beam tensorflow-cpu fastavro polars pyarrow numpy grpcio protobuf
test-latest:
	@test -x $(LATEST_BIN)/python || $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(LATEST_BIN)/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	@$(LATEST_BIN)/python -c "import importlib.metadata as m, sys; [print(f'test-latest: {p} {m.version(p)}') for p in sys.argv[1:]]" $(LATEST_PKGS)
	$(LATEST_BIN)/python -m pytest -m "not slow" -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check convert readers pipelines stores tests bench examples

## The docs site (docs/, mkdocs.yml) into site/, offline; --strict fails on a broken link or reference.
## (Not --quiet: it hides the warnings --strict counts.) tests/test_docs.py builds it too; open site/index.html.
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## Benchmarks against peers measured in the same run: make bench [SIZE=small|default|large]
bench: $(STAMP)
	$(BIN)/python -m bench.run --size $(SIZE)

## Fuzz the record -> features -> Example path (hypothesis) for a while:
## make fuzz [FUZZ_SECONDS=300] [FUZZ_EXAMPLES=300] [FUZZ_ARGS="--target avro-bytes --seed 1"]
FUZZ_SECONDS  ?= 300
FUZZ_EXAMPLES ?= 300
FUZZ_ARGS     ?=
fuzz: $(STAMP)
	$(BIN)/python tests/fuzz_records.py --seconds $(FUZZ_SECONDS) --examples-per-round $(FUZZ_EXAMPLES) $(FUZZ_ARGS)

clean:
	rm -rf $(VENV) demo-out .pytest_cache build convert/_*.*.so
