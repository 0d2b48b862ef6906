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

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check normprop normprop_cli tests
	$(BIN)/ruff format --check normprop normprop_cli tests

# Every experiment of the paper, then the figures and the report.
# `make reproduce-all PRESET=paper DATASET=cifar10` runs the paper's protocol (meant for a CUDA GPU).
reproduce-all: $(STAMP)
	$(BIN)/normprop reproduce-all --preset $(PRESET) $(DATASET_OPT)

bench: $(STAMP)
	$(BIN)/normprop bench

# On a CUDA machine: the CUDA tests, every method benched (channels_last, bf16, CUDA graphs) and one
# CIFAR-10-protocol epoch timed, into results/bench/gpu/. Without CUDA: one line, exit status 2.
gpu-check: $(STAMP)
	$(BIN)/normprop gpu-check

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
