"""The way back with a big last-good (`make bench`, group `wayback`): a crash-at-start rollback
to a last-good whose payload is 1 GiB against the same rollback to one whose payload is 1 KiB,
and the daemon's start (`systemctl restart` to READY=1) of each, in one run.

Each node is a private systemd (as the `upgrades` group's) whose 1.0.0 carries the payload; the
candidates crash at start. What a start and the way back check is a walk of the release: no
file is read whose stat is the one recorded when it was added (`node.releases.hashes`), so
neither figure should grow with the payload's bytes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import big

SMALL_BYTES = 1 << 10


def _payload(where: Path, big_one: bool) -> Path:
    where.mkdir(parents=True)
    if big_one:
        for i in range(big.TREE_FILES):
            big._random_file(where / f"blob{i}.bin", big.TREE_FILE_BYTES)
    else:
        big._random_file(where / "blob0.bin", SMALL_BYTES)
    return where


def measure(workdir: Path, repeat: int, figure: Callable[..., Any]) -> list[Any]:
    from agent_fsm.actions.releases import packing
    from agent_fsm_lab.lab import GOOD_WORKLOAD

    from .run import CRASH, lab_node, restart_to_ready, say, timed_upgrade

    repeat = min(repeat, 3)  # a node of a gigabyte each: three runs give a median
    subtracted = CRASH["restart"] * CRASH["max_attempts"]
    found: dict[str, tuple[list[float], list[float]]] = {}
    for name, big_one in (("small", False), ("big", True)):
        payload = _payload(workdir / f"wayback-payload-{name}", big_one)
        rollbacks: list[float] = []
        starts: list[float] = []

        def last_good(at: Path, payload: Path = payload) -> None:
            packing.pack("1.0.0", at, GOOD_WORKLOAD, payload=payload)

        with lab_node(CRASH, last_good=last_good) as lab:
            say(f"  wayback: last-good with a {'1 GiB' if big_one else '1 KiB'} payload")
            for i in range(repeat):
                starts.append(restart_to_ready(lab))
                version = f"3.{i}.0"
                lab.pack(version, "crash")
                wall, _ = timed_upgrade(lab, version, rolled_back=True)
                rollbacks.append(wall - subtracted)
        found[name] = rollbacks, starts
    details = {"payload_bytes": {"small": SMALL_BYTES, "big": big.TREE_FILES * big.TREE_FILE_BYTES},
               "subtracted_s": subtracted,
               "median_small_s": round(statistics.median(found["small"][0]), 3)}
    return [figure("rollback_big", found["big"][0], found["small"][0], details),
            figure("daemon_start_big", found["big"][1], found["small"][1],
                   {"payload_bytes": details["payload_bytes"]})]
