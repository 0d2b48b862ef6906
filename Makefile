# normprop: `make reproduce-all` and `make test` each set up the project on a fresh machine first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PRESET ?= quick
DATASET ?=
JOBS   ?= 1
DATASET_OPT := $(if $(DATASET),--dataset $(DATASET),)

.PHONY: install test lint reproduce-all bench gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Two worker processes (pytest-xdist), one thread each; a module whose tests share a trained sweep stays on one.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check normprop normprop_cli tests
	$(BIN)/ruff format --check normprop normprop_cli tests

# Every experiment of the paper, then the figures and the report.
# `make reproduce-all PRESET=paper DATASET=cifar10` runs the paper's protocol (meant for a CUDA GPU);
# `normprop reproduce-all --preset paper --dry-run` plans it first (plan.csv: runs, steps, hours, disk).
reproduce-all: $(STAMP)
	$(BIN)/normprop reproduce-all --preset $(PRESET) $(DATASET_OPT)

bench: $(STAMP)
	$(BIN)/normprop bench

# On a CUDA machine, in at most 5 minutes: the CUDA tests, every method's step (CUDA graph or eager), peak
# memory, host syncs, 5 steps against the CPU's, the paired bench of the steps runs take (default layout, CUDA
# graph, float32 and bfloat16, batch 1, 50 and 100, 3x32x32 and 1x32x32) with its targets, kernels per step,
# --deterministic repeated, NormProp's two folds, the paper and gpu presets' projected times from this GPU's step
# times, and a real CIFAR-10 run killed and resumed; results/bench/gpu/SUMMARY.md says pass or fail per item
# (exit status 0 when all pass). Without CUDA: one line, exit status 2.
gpu-check: $(STAMP)
	$(BIN)/normprop gpu-check

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
