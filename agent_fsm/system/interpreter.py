"""A Python interpreter's ABI: its version and which compiled extension modules it can load,
read from the running interpreter or by running another one."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..errors import InterpreterUnreadable
from . import proc

PROBE_TIMEOUT = 30.0
# Run isolated and without site-packages (-I -S), as a release's launcher runs it; only the
# standard library answers.
_PROBE = ("import importlib.machinery as m, json, sys, sysconfig\n"
          "print(json.dumps({'version': list(sys.version_info[:3]),"
          " 'cache_tag': sys.implementation.cache_tag, 'platform': sysconfig.get_platform(),"
          " 'suffixes': m.EXTENSION_SUFFIXES}))\n")


@dataclass(frozen=True)
class Interpreter:
    version: tuple[int, ...]
    cache_tag: str  # e.g. cpython-311
    platform: str  # sysconfig.get_platform(), e.g. linux-x86_64
    suffixes: tuple[str, ...]  # importlib.machinery.EXTENSION_SUFFIXES: the extensions it loads

    def describe(self) -> str:
        return f"{self.cache_tag} on {self.platform}"


def running() -> Interpreter:
    """The interpreter running agent-fsm now."""
    return Interpreter(tuple(sys.version_info[:3]), str(sys.implementation.cache_tag),
                       sysconfig.get_platform(), tuple(importlib.machinery.EXTENSION_SUFFIXES))


def probe(python: Path) -> Interpreter:
    """Run `python -I -S -c …` and read what it is. CouldNotRun when it does not start or finish;
    InterpreterUnreadable when it exits non-zero or prints something else."""
    done = proc.run([str(python), "-I", "-S", "-c", _PROBE], timeout=PROBE_TIMEOUT)
    if done.returncode != 0:
        raise InterpreterUnreadable(f"it exited {done.returncode}: {done.tail or 'no output'}")
    try:
        data = json.loads(done.stdout)
        version = tuple(int(v) for v in data["version"])
        found = Interpreter(version, data["cache_tag"], data["platform"], tuple(data["suffixes"]))
    except (ValueError, KeyError, TypeError):
        raise InterpreterUnreadable(f"it printed {done.stdout[:200]!r}") from None
    if not (all(isinstance(v, str) for v in (found.cache_tag, found.platform, *found.suffixes))
            and len(version) >= 2):
        raise InterpreterUnreadable(f"it printed {done.stdout[:200]!r}")
    return found
