# agent-fsm: `make test` is the whole set-up and check; `make demo` runs the main job.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint unit e2e demo diagram bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/agent-fsm diagram --check

test: lint
	$(VENV)/bin/pytest

unit: $(STAMP)
	$(VENV)/bin/pytest -m "not e2e"

e2e: $(STAMP)
	$(VENV)/bin/pytest -m e2e

demo: $(STAMP)
	$(VENV)/bin/agent-fsm demo

diagram: $(STAMP)
	$(VENV)/bin/agent-fsm diagram --write

# Not part of `make test`: figures, not assertions (docs/benchmarks.md). As root, ~4 minutes.
bench: $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
