# agent-fsm: `make test` is the whole set-up and check; `make demo` runs the main job.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint unit e2e node257 demo diagram dist bench mutants modelcheck clean system-packages sanity test-clock test-future

# Debian packages the suite uses for real (graphviz renders the svg diagram; podman builds, loads
# and removes release images in a private store; faketime moves the clock for `test-clock`).
# Installed when missing and when run as root (CI is), waiting for another apt-get's lock;
# elsewhere the tests that need them say what is missing.
# openssh-client: ssh-keygen signs and verifies releases (tests/actions/test_signing.py).
# debootstrap: makes the Debian 13 node the e2e core also runs on (docs/systemd.md).
# nginx-light, docker-registry, skopeo: the real HTTPS server and OCI registry a fleet follows its
# channel from (tests/e2e/test_channel_servers.py).
# nodejs: a real runtime for the agent of a real size (tests/e2e/test_real_size.py), only where
# no `node` is on PATH (any node serves: the official build is one file, Debian's a small `node`
# with libnode, which the test ships beside it).
NODE_PACKAGE := $(if $(shell command -v node 2>/dev/null),,nodejs)
DEB_PACKAGES := graphviz podman openssh-client faketime debootstrap nginx-light docker-registry \
	skopeo $(NODE_PACKAGE)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

system-packages:
	@sh tools/system-packages.sh $(DEB_PACKAGES)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m agent_fsm_lab diagram

# The suite runs on four workers: most e2e time is systemd waiting (timeouts, restarts), so two
# cores carry four. A module whose tests share one costly module fixture (a guide walked in a
# booted sandbox, an upgraded node, a packed release, the README's commands) is one xdist_group
# (--dist loadgroup), so the fixture is made once, not once per worker.
PYTEST_PARALLEL ?= -n 4 --dist loadgroup

# Lint, the collection's sanity and the Debian 13 node's build (~70 s on a new machine) do not
# wait on one another: they run side by side, then the suite.
test: $(STAMP)
	@$(MAKE) --no-print-directory -j3 lint sanity node257
	$(VENV)/bin/pytest $(PYTEST_PARALLEL)
	@$(MAKE) --no-print-directory test-clock

# A test passes on any day: the tests that keep times (holds, known-bad marks, history, status,
# metrics, judgment) run again with the clock a year ahead, for this process and every child it
# starts (libfaketime; ~15 s). `make test-future` runs the whole unit suite so (~80 s). The e2e
# suite is left out: systemd does not pass the preload to its units, whose clock stays real.
FAKETIME ?= +365d
CLOCK_TESTS := tests/actions/test_hold.py tests/upgrade/test_known_bad.py \
	tests/upgrade/test_reasons.py tests/upgrade/test_outbox.py tests/agent/test_judge.py \
	tests/views/test_history.py tests/views/test_status.py tests/views/test_metrics.py \
	tests/views/test_status_reader.py
test-clock: $(STAMP)
	@if command -v faketime >/dev/null; then \
		echo "the clock moved $(FAKETIME): $(CLOCK_TESTS)"; \
		faketime -f "$(FAKETIME)" $(VENV)/bin/pytest $(PYTEST_PARALLEL) -q -m "not e2e" $(CLOCK_TESTS); \
	else echo "faketime is not installed: the run with the clock moved is skipped"; fi

test-future: $(STAMP) system-packages
	faketime -f "$(FAKETIME)" $(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not e2e"

# ansible-test sanity of the Ansible collection agent_fsm.fleet (docs/fleet.md), on this Python,
# without containers: ~7 s, ~90 s the first time (each test's requirements go into a venv cached
# under ~/.ansible/test). pylint is left out (its venv alone is ~25 s; ruff lints these files);
# `make sanity SANITY_ARGS=` runs it too.
SANITY_ARGS ?= --skip-test pylint
sanity: $(STAMP)
	sh ansible/sanity/run.sh $(VENV) $(SANITY_ARGS)

# The Debian 13 node (systemd 257) the e2e core also runs on: built once into
# /var/cache/agent-fsm-tests (~70 s, then nothing); where it cannot be built, says what is
# missing (the 257 tests skip, and fail under CI=true). docs/systemd.md, "The two systemds".
node257: $(STAMP) system-packages
	$(PY) -m agent_fsm_lab.rootfs --if-possible

unit: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not e2e"

e2e: $(STAMP) node257
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m e2e

demo: $(STAMP)
	$(PY) -m agent_fsm_lab demo

diagram: $(STAMP)
	$(PY) -m agent_fsm_lab diagram --write

# A user's install (README, "Set-up"): the wheel and the sdist into $(DIST)/, built by the venv's
# hatchling (offline once the venv has it; a user's venv gets hatchling alone, not the test
# extras); then `pipx install dist/agent_fsm-VERSION-py3-none-any.whl`. Earlier builds there are
# removed first, so that one wheel matches `dist/agent_fsm-*.whl`.
DIST ?= dist
dist:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c 'import hatchling' 2>/dev/null || $(PY) -m pip install -q 'hatchling>=1.25'
	rm -f $(DIST)/agent_fsm-*.whl $(DIST)/agent_fsm-*.tar.gz
	$(PY) -m hatchling build -d $(DIST)

# Not part of `make test`: figures, not assertions (docs/benchmarks.md). As root, ~5 minutes;
# prints the table, writes bench/results.json and the chart bench/ratios.svg (neither committed).
bench: $(STAMP)
	$(PY) -m bench.run

# Not part of `make test`: every one-step variant of states/agent-upgrade.toml must fail the
# suite (docs/reliability.md). The committed tree (HEAD), unit suite, both cores: ~40 minutes.
# MUTANTS_ARGS=--e2e runs the e2e suite on the unit suite's survivors too; MUTANTS_ARGS=
# --modelcheck-first lets the model check judge every variant first (~15 minutes on both cores):
# those it catches are killed without the suite, which then measures only the others.
mutants: $(STAMP)
	$(PY) -m agent_fsm_lab.mutants --rev HEAD --jobs 2 --output mutants-results.json $(MUTANTS_ARGS)

# The model check at its deep bound (docs/reliability.md, "The model check"): every interleaving
# of one node's processes, systemd's units and up to two faults, on the real code; 3-7 minutes;
# then its store bound (two operator commands: an upgrade beside release add and prune), 2-4;
# then its again bound (two upgrades, one after the other), under a minute; then its
# follow-deep bound (two follows of a signed channel, a fault anywhere), 1-3 minutes.
# Its small bound runs in `make test` (tests/reliability/test_modelcheck.py, ~20 s alone), and
# so does its follow bound (tests/reliability/test_modelcheck_follow.py).
modelcheck: $(STAMP)
	$(PY) -m agent_fsm_lab.modelcheck --bound deep
	$(PY) -m agent_fsm_lab.modelcheck --bound store
	$(PY) -m agent_fsm_lab.modelcheck --bound again
	$(PY) -m agent_fsm_lab.modelcheck --bound follow-deep

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache dist build
