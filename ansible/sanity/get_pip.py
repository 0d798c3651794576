"""Stands in for ansible-test's pip bootstrap script where ci-files.testing.ansible.com is unreachable.

ansible-test creates each sanity test's virtual environment without pip, then runs the script it
caches at ~/.ansible/test/cache/get_pip_<version>.py (downloaded from ci-files.testing.ansible.com,
or "manually downloaded and saved" there, as its error message says) with pip's install arguments
plus get-pip's own --no-setuptools/--no-wheel.  This script does the same job from what the
interpreter already carries: the pip wheel that `ensurepip` bundles installs itself and the
requested packages, from the package index pip is configured with.
"""

import ensurepip
import glob
import os
import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")


def bundled_pip() -> str | None:
    """The pip wheel this interpreter's ensurepip would install (Debian keeps it elsewhere)."""
    here = os.path.join(os.path.dirname(ensurepip.__file__), "_bundled")
    wheels = glob.glob(os.path.join(here, "pip-*.whl")) or glob.glob("/usr/share/python-wheels/pip-*.whl")
    return sorted(wheels)[-1] if wheels else None


def main() -> int:
    # ansible-test asks for its pinned pip first; it removes pip once the environment is made, so
    # the bundled pip does the job and nothing is downloaded for pip itself.
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY and not arg.startswith("pip==")]
    wheel = bundled_pip()
    if wheel is None:  # no wheel on disk: let ensurepip find its own
        saved = os.environ.get("PIP_CONFIG_FILE")
        ensurepip.bootstrap(upgrade=True)
        # ensurepip sets PIP_CONFIG_FILE=/dev/null for itself; the install below must read the
        # machine's pip configuration (its index and certificates) again.
        os.environ.pop("PIP_CONFIG_FILE", None)
        if saved is not None:
            os.environ["PIP_CONFIG_FILE"] = saved
        pip = [sys.executable, "-m", "pip"]
    else:  # pip runs from its wheel (it supports that) and installs itself from it
        pip = [sys.executable, os.path.join(wheel, "pip")]
        args.insert(0, wheel)
    if not any(not arg.startswith("-") for arg in args):
        return 0
    return subprocess.call([*pip, "install", *args])


if __name__ == "__main__":
    sys.exit(main())
