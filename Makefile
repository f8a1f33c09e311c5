# One-command set-up: every target bootstraps .venv idempotently (stamp files), torch pinned first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
PIP     := $(BIN)/python -m pip
export VTK_DEFAULT_OPENGL_WINDOW ?= vtkEGLRenderWindow

.PHONY: all setup setup-dev setup-peers demo test test-peers test-fast lint bench gpu-check clean

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Base install: torch first (never unpinned: an unpinned torch pulls a multi-GB CUDA build).
$(VENV)/.stamp-base: pyproject.toml | $(BIN)/python
	$(PIP) install -q $(TORCH)
	$(PIP) install -q $(TORCH) -e .
	@touch $@

# Test/dev install: pytest, hypothesis, ruff, pymetis, warp-lang (all wheels: nothing compiles).
$(VENV)/.stamp-dev: $(VENV)/.stamp-base
	$(PIP) install -q $(TORCH) -e '.[dev]'
	@touch $@

# Opt-in peer: torch-cluster, compared against in the neighbour tests and benchmarks. It has no wheel for
# torch 2.13, so pip compiles it (~31 min on 2 cores with an empty pip cache; pip caches the wheel).
# `make test-peers` (or `make test PEERS=1`) builds it and runs the suite with its tests.
$(VENV)/.stamp-peers: $(VENV)/.stamp-dev
	MAX_JOBS=2 $(PIP) install -q --no-build-isolation $(TORCH) torch-cluster==1.6.3
	@touch $@

setup: $(VENV)/.stamp-base
setup-dev: $(VENV)/.stamp-dev
setup-peers: $(VENV)/.stamp-peers

demo: $(VENV)/.stamp-base
	$(BIN)/meshshard demo

# The suite on TEST_WORKERS pytest-xdist workers (0: in this process); tests/conftest.py groups the tests
# that must share a worker. A worker that dies (e.g. out of memory) fails the run rather than being replaced.
# Every run ends with its 25 slowest tests, so a test that grows shows.
PEERS ?=
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart 0 --durations=25 tests
test: $(VENV)/.stamp-dev $(if $(PEERS),$(VENV)/.stamp-peers)
	$(PYTEST)

test-peers: $(VENV)/.stamp-peers
	$(PYTEST)

lint: $(VENV)/.stamp-dev
	$(BIN)/ruff check meshshard tests benchmarks examples tools

bench: $(VENV)/.stamp-dev
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# The CUDA path in one command (README: "Checking the GPU path"). No .venv bootstrap: a lent GPU machine has
# no network, so this runs with whatever python is there and the project on PYTHONPATH. Dry mode on the CPU:
# make gpu-check GPU_CHECK_ARGS=--dry (automatic without CUDA; `make test` runs it too).
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m tools.gpu_check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
