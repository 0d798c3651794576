"""`python -m agent_fsm_lab.modelcheck [--bound small|deep]`: run the model check, print its
figures and any counterexample; exit 1 when a rule is broken.

`--mutants [SUBSTRING] [--only REGEX] [--jobs N] [--output FILE]`: check the definition's
one-step variants instead (`mutants.py`); exit 1 when one survives, 2 when the shipped definition
itself breaks a rule."""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .search import BOUNDS, check
from .timeline import report


def _mutants(substring: str, only: list[str], jobs: int, output: Path | None) -> int:
    from . import mutants

    def wanted(vid: str) -> bool:
        return substring in vid and (not only or any(re.search(p, vid) for p in only))

    verdicts: list[mutants.Verdict] = []
    began = time.monotonic()

    def write(final: str = "") -> None:
        if output is None:
            return
        body = {"bound": str(BOUNDS["mutant"]), "summary": final,
                "survived": sorted(v.id for v in verdicts if v.outcome == "survived"),
                "variants": sorted((asdict(v) for v in verdicts), key=lambda v: v["id"])}
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(output)

    for signum in (signal.SIGTERM, signal.SIGHUP):  # the workers end with this process
        signal.signal(signum, lambda n, _frame: sys.exit(128 + n))
    try:
        for v in mutants.run(wanted, jobs=jobs):
            verdicts.append(v)
            print(f"{v.outcome:<10} {v.id}  ({v.seconds:.1f} s) {v.why[:160]}", flush=True)
            write()
    except mutants.ShippedBroken as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    final = summary(verdicts, time.monotonic() - began, jobs)
    write(final)
    print(final)
    return 1 if any(v.outcome == "survived" for v in verdicts) else 0


def summary(verdicts: list[Any], total: float, jobs: int) -> str:
    from .mutants import AT_REST, UNEXERCISED

    counts = {k: sum(1 for v in verdicts if v.outcome == k)
              for k in ("caught", "equivalent", AT_REST, "survived")}
    idle = sum(1 for v in verdicts if v.outcome == "equivalent" and UNEXERCISED in v.why)
    times = sorted(v.seconds for v in verdicts) or [0.0]
    return (f"{len(verdicts)} variants: {counts['caught']} caught, {counts['equivalent']} "
            f"equivalent ({idle} of them never exercised: the transition they change never "
            f"fires within the bound), {counts[AT_REST]} equivalent at rest (the same "
            f"configurations at rest, every rule kept on the way), {counts['survived']} "
            f"survived; {total:.0f} s in all "
            f"({jobs} jobs), "
            f"{statistics.median(times):.1f} s median per variant, {times[-1]:.1f} s max; "
            f"{BOUNDS['mutant']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_fsm_lab.modelcheck")
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="small")
    parser.add_argument("--progress", action="store_true", help="print progress on stderr")
    parser.add_argument("--parked", action="store_true",
                        help="list the kinds of configuration that wait for an operator")
    parser.add_argument("--mutants", metavar="SUBSTRING", nargs="?", const="",
                        help="check every variant of the definition `make mutants` makes (whose "
                             "id contains SUBSTRING) instead")
    parser.add_argument("--only", action="append", metavar="REGEX", default=[],
                        help="with --mutants: only the variants whose id matches (re.search), "
                             "as agent_fsm_lab.mutants' --only; repeatable")
    parser.add_argument("--jobs", type=int, default=2,
                        help="with --mutants: variants checked in parallel processes (2)")
    parser.add_argument("--output", type=Path, metavar="FILE",
                        help="with --mutants: write the verdicts there as JSON")
    args = parser.parse_args(argv)
    if args.mutants is not None or args.only:
        return _mutants(args.mutants or "", args.only, args.jobs, args.output)
    result = check(BOUNDS[args.bound],
                   progress=(lambda s: print(s, file=sys.stderr)) if args.progress else None)
    print(report(result))
    if args.parked:
        for kind, n in sorted(result.parked_kinds.items()):
            print(f"parked {n:>4}: {kind}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
