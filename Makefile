# agent-fsm: `make test` is the whole set-up and check; `make demo` runs the main job.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint unit e2e demo diagram bench mutants clean system-packages

# Debian packages the suite uses for real (graphviz renders the svg diagram). Installed when
# missing and when run as root (CI is); elsewhere the tests that need them say what is missing.
DEB_PACKAGES := graphviz

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

system-packages:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing $$missing"; \
		(apt-get install -y -q $$missing >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null)); \
	elif [ -n "$$missing" ]; then echo "not installed (tests that need them skip): $$missing"; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/agent-fsm diagram --check

test: lint system-packages
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

# Not part of `make test`: every one-step variant of states/agent-upgrade.toml must fail the
# suite (docs/reliability.md). The committed tree (HEAD), unit suite, both cores: ~40 minutes.
# MUTANTS_ARGS=--e2e runs the e2e suite on the unit suite's survivors too.
mutants: $(STAMP)
	$(PY) tools/mutants.py --rev HEAD --jobs 2 --output mutants-results.json $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
