"""The daemon's startup: resume, hold or converge the assets, and open the gate only after the
pending upgrade (if any) is judged, published and its signal cleared.
"""

from __future__ import annotations

import logging

from .clock import Clock
from .errors import PublishError
from .machine import Controller
from .store import StateDoc

log = logging.getLogger("agent_fsm")

PUBLISH_RETRY_FIRST = 1.0
PUBLISH_RETRY_MAX = 30.0


def open_gate_after_judgment(controller: Controller, clock: Clock,
                             max_tries: int | None = None) -> StateDoc:
    """Run `complete` (publish, clear signal, write assets, reload, promote, open the gate).

    A failed publish is retried with a growing delay; the gate stays closed meanwhile, because
    `open_gate` comes after `publish_result` in the recorded transition and resuming never
    skips an effect. `max_tries` bounds the retries (None: until it works).
    """
    delay = PUBLISH_RETRY_FIRST
    tries = 0
    while True:
        tries += 1
        try:
            doc = controller.resume()
            if doc.state == "judged_ok":
                doc = controller.fire("complete")
            return doc
        except PublishError as exc:
            if max_tries is not None and tries >= max_tries:
                raise
            log.warning("publishing the result failed (try %d), retrying in %.0fs: %s",
                        tries, delay, exc)
            clock.sleep(delay)
            delay = min(delay * 2, PUBLISH_RETRY_MAX)
