"""`python -m agent_fsm_lab.modelcheck [--bound small|deep]`: run the model check, print its
figures and any counterexample; exit 1 when a rule is broken."""

from __future__ import annotations

import argparse
import sys
import time

from .search import BOUNDS, check
from .timeline import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_fsm_lab.modelcheck")
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="small")
    parser.add_argument("--progress", action="store_true", help="print progress on stderr")
    parser.add_argument("--parked", action="store_true",
                        help="list the kinds of configuration that wait for an operator")
    parser.add_argument("--mutants", metavar="SUBSTRING", nargs="?", const="",
                        help="check every variant of the definition `make mutants` makes (whose "
                             "id contains SUBSTRING) instead")
    args = parser.parse_args(argv)
    if args.mutants is not None:
        from . import mutants

        counts: dict[str, int] = {}
        began = time.monotonic()
        for v in mutants.run(lambda vid: args.mutants in vid):
            counts[v.outcome] = counts.get(v.outcome, 0) + 1
            print(f"{v.outcome:<10} {v.id}  ({v.seconds:.1f} s) {v.why[:160]}", flush=True)
        print(f"variants: {sum(counts.values())}, " + ", ".join(
            f"{n} {k}" for k, n in sorted(counts.items())) + f"; {time.monotonic() - began:.0f} s")
        return 1 if counts.get("survived") else 0
    result = check(BOUNDS[args.bound],
                   progress=(lambda s: print(s, file=sys.stderr)) if args.progress else None)
    print(report(result))
    if args.parked:
        for kind, n in sorted(result.parked_kinds.items()):
            print(f"parked {n:>4}: {kind}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
