# Two commands for a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-integration test-all test-reference test-torch test-torch-latest bench lint docs typecheck clean

setup: $(STAMP)

# torch is pinned and installed first: an unpinned torch would pull a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m unit_scaling demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --timeout 900 -q

# End-to-end checks marked `integration` (whole Trainer / Accelerate runs, the
# batch law over the zoo; see tests/conftest.py): minutes, so CI runs them
# after the default suite.
test-integration: $(STAMP)
	$(PY) -m pytest -n 2 --timeout 900 -q -m integration

test-all: $(STAMP)
	$(PY) -m pytest -n 2 -q -m ""

# The test suite of unit-scaling 0.3.5, the library this one replaces, run
# against this package (its wheel is downloaded to ~/.cache, never installed).
test-reference: $(STAMP)
	$(PY) -m tools.reference_suite

# The suite on another torch, before a release (not in CI): a venv of its own,
# .venvs/torch-VERSION/, with that torch from the registry (past any local cap on
# torch's version), then this package with torch held there. VERSION=latest (or
# test-torch-latest) takes the newest torch, what `pip install` gets.
TORCH_VENV = .venvs/torch-$(VERSION)
TORCH_PY = $(TORCH_VENV)/bin/python
TORCH_TEST_FLAGS = -n 2 --timeout 900 -q

test-torch-latest:
	$(MAKE) test-torch VERSION=latest

test-torch:
	@test -n "$(VERSION)" || { echo "usage: make test-torch VERSION=2.11.0 (or latest)" >&2; exit 2; }
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=/dev/null $(TORCH_PY) -m pip install --quiet --upgrade \
		"torch$(if $(filter latest,$(VERSION)),,==$(VERSION))"
	$(TORCH_PY) -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $(TORCH_VENV)/torch.txt
	PIP_CONSTRAINT=$(TORCH_VENV)/torch.txt $(TORCH_PY) -m pip install --quiet -e ".[dev]"
	$(TORCH_PY) -m pytest $(TORCH_TEST_FLAGS)

bench: $(STAMP)
	$(PY) -m benchmarks

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks experiments examples tools
	$(PY) -m ruff format --check src tests benchmarks experiments examples tools
	$(PY) -m mypy

# The documentation site (MkDocs + mkdocstrings), warnings as errors.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .venvs out site .pytest_cache .mypy_cache .ruff_cache
