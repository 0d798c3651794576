"""`python -m agent_fsm_lab.modelcheck [--bound small|deep]`: run the model check, print its
figures and any counterexample; exit 1 when a rule is broken."""

from __future__ import annotations

import argparse
import sys

from .search import BOUNDS, check
from .timeline import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_fsm_lab.modelcheck")
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="small")
    parser.add_argument("--progress", action="store_true", help="print progress on stderr")
    args = parser.parse_args(argv)
    result = check(BOUNDS[args.bound],
                   progress=(lambda s: print(s, file=sys.stderr)) if args.progress else None)
    print(report(result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
