#!/bin/sh
# ansible-test sanity for the agent_fsm.fleet collection, run by `make test` (docs/fleet.md).
# Usage: ansible/sanity/run.sh VENV [ansible-test sanity options...]
# ansible-test runs from the collection's own directory (ansible_collections/agent_fsm/fleet), on
# the venv's Python 3.11 (`--python 3.11`), without containers (no --docker: none on CI) and
# without --requirements (nothing is installed into the venv itself). Each test that needs packages
# gets a virtual environment of its own, from PyPI, cached in the checkout (below); the pip
# bootstrap script ansible-test would download for that from ci-files.testing.ansible.com
# (unreachable here, like Galaxy) is get_pip.py.
# Every sanity test of ansible-core 2.19 runs unless options say otherwise (`make test` skips
# pylint, see the Makefile): validate-modules (documentation against argument specs, attributes,
# return values), ansible-doc, import and compile (modules import only the standard library and
# ansible.module_utils), action-plugin-docs, runtime-metadata, pep8, yamllint, shebang,
# use-argspec-type-path and the other file checks. Tests with nothing to check here skip (changelog:
# no changelogs/; pslint: no PowerShell; shellcheck: no shell in the collection).
# tests/sanity/ignore-2.19.txt lists the one accepted finding: the modules are MIT, not GPLv3.
set -eu
venv=$(cd "${1:?usage: run.sh VENV [options]}" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
collection=$(cd "$here/../ansible_collections/agent_fsm/fleet" && pwd)
pip_version=$("$venv/bin/python" - <<'PY'
import importlib.util, pathlib, re
root = pathlib.Path(importlib.util.find_spec("ansible_test").submodule_search_locations[0])
text = (root / "_internal" / "python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", text)[1])
PY
)
# ansible-test keeps its venvs under ~/.ansible/test and pip its cache under ~/.cache: both stay
# in the checkout (tests/output is ansible-test's own scratch directory, ignored by git).
HOME="$collection/tests/output/home"
export HOME
cache="$HOME/.ansible/test/cache/get_pip_$(echo "$pip_version" | tr . _).py"
if ! cmp -s "$here/get_pip.py" "$cache"; then
    mkdir -p "$(dirname "$cache")"
    cp "$here/get_pip.py" "$cache"
fi
cd "$collection"
exec "$venv/bin/ansible-test" sanity --python 3.11 --color no "$@"
