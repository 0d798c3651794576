# agent-fsm: `make test` is the whole set-up and check; `make demo` runs the main job.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint unit e2e demo diagram bench mutants clean system-packages sanity

# Debian packages the suite uses for real (graphviz renders the svg diagram; podman builds, loads
# and removes release images in a private store). Installed when
# missing and when run as root (CI is); elsewhere the tests that need them say what is missing.
# openssh-client: ssh-keygen signs and verifies releases (tests/test_signing.py).
DEB_PACKAGES := graphviz podman openssh-client

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

# The suite runs on four workers: most e2e time is systemd waiting (timeouts, restarts), so two
# cores carry four. Tests that share a booted fleet are one xdist_group (--dist loadgroup).
PYTEST_PARALLEL ?= -n 4 --dist loadgroup

test: lint sanity system-packages
	$(VENV)/bin/pytest $(PYTEST_PARALLEL)

# ansible-test sanity of the Ansible collection agent_fsm.fleet (docs/fleet.md), on this Python,
# without containers: ~7 s, ~90 s the first time (each test's requirements go into a venv cached
# under ~/.ansible/test). pylint is left out (its venv alone is ~25 s; ruff lints these files);
# `make sanity SANITY_ARGS=` runs it too.
SANITY_ARGS ?= --skip-test pylint
sanity: $(STAMP)
	sh ansible/sanity/run.sh $(VENV) $(SANITY_ARGS)

unit: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not e2e"

e2e: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m e2e

demo: $(STAMP)
	$(VENV)/bin/agent-fsm demo

diagram: $(STAMP)
	$(VENV)/bin/agent-fsm diagram --write

# Not part of `make test`: figures, not assertions (docs/benchmarks.md). As root, ~5 minutes;
# prints the table, writes bench/results.json and the chart bench/ratios.svg (neither committed).
bench: $(STAMP)
	$(PY) -m bench.run

# Not part of `make test`: every one-step variant of states/agent-upgrade.toml must fail the
# suite (docs/reliability.md). The committed tree (HEAD), unit suite, both cores: ~40 minutes.
# MUTANTS_ARGS=--e2e runs the e2e suite on the unit suite's survivors too.
mutants: $(STAMP)
	$(PY) tools/mutants.py --rev HEAD --jobs 2 --output mutants-results.json $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
