# yeto development: `make quickstart` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt

DISTS := yeto_core plugins/yeto-s3 plugins/yeto-torch plugins/yeto-sglang plugins/yeto-vllm \
         yeto_miles yeto_modal yeto_sky yeto_nc \
         plugins/yeto-bench
STAMP := $(VENV)/.installed
DEPS := constraints.txt requirements-dev.txt $(foreach d,$(DISTS),$(d)/pyproject.toml) \
        examples/third_party_plugin/pyproject.toml

.PHONY: install test lint quickstart fuzz chaos soak clean

install: $(STAMP)

$(STAMP): $(DEPS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -r requirements-dev.txt $(foreach d,$(DISTS),-e ./$(d)) -e ./examples/third_party_plugin
	@touch $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

quickstart: install
	$(BIN)/yeto run up examples/quickstart/run.toml

# Long Hypothesis profile of the buffer -> reader -> backend -> ledger -> cut chain
# (YETO_FUZZ_EXAMPLES runs, default 2000, random seeds; YETO_FUZZ_STEPS steps per run).
fuzz: install
	@mkdir -p build
	YETO_FUZZ_EXAMPLES=$${YETO_FUZZ_EXAMPLES:-2000} YETO_FUZZ_RANDOM=$${YETO_FUZZ_RANDOM:-1} \
	  YETO_FUZZ_REPORT=$(CURDIR)/build/fuzz.txt \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests/core/test_fuzz_chain.py
	@cat build/fuzz.txt

# SIGKILL campaign: 50 kills of heads, samplers and trainers of real runs (docs/reliability.md).
chaos: install
	$(BIN)/yeto bench chaos --kills 50 --json

clean:
	rm -rf $(VENV) build .pytest_cache
