# Two commands for a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all test-reference bench lint docs typecheck clean

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

test-all: $(STAMP)
	$(PY) -m pytest -n 2 -q -m ""

# The test suite of unit-scaling 0.3.5, the library this one replaces, run
# against this package (its wheel is downloaded to ~/.cache, never installed).
test-reference: $(STAMP)
	$(PY) -m tools.reference_suite

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
	rm -rf $(VENV) out site .pytest_cache .mypy_cache .ruff_cache
