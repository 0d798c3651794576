"""The judged-ok path's publishing: `complete`, retried with the gate closed until the publisher
answers, or, after `publish_give_up_seconds`, `complete_queued`. The daemon runs it after a judgment
and at a start in `judged_ok`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ..errors import PublishError
from ..machine.engine import Controller
from ..machine.vocabulary import StateName, Trigger
from ..node.state import reasons
from ..node.state.store import StateDoc
from ..system.clock import Clock

log = logging.getLogger("agent_fsm")

PUBLISH_RETRY_FIRST = 1.0
PUBLISH_RETRY_MAX = 30.0


def open_gate_after_judgment(controller: Controller, clock: Clock,
                             max_tries: int | None = None,
                             before_try: Callable[[int, str], None] = lambda _n, _why: None,
                             *, give_up_after: float | None = None,
                             monotonic: Callable[[], float] = time.monotonic,
                             stopping: Callable[[], bool] = lambda: False,
                             each_try: Callable[[], contextlib.AbstractContextManager[object]]
                             = contextlib.nullcontext,
                             ) -> StateDoc:
    """Run `complete` (publish, clear signal, write assets, reload, promote, open the gate).

    A failed publish is retried with a growing delay, the gate closed. `open_gate` follows
    `publish_result` in the recorded transition, and resuming never skips an effect. `before_try(n,
    last_error)` runs before each try: the daemon extends its start timeout, so a slow publisher
    never causes a rollback. `max_tries` bounds the tries (None: no bound).

    `give_up_after` (None: never) is the dead publisher's way out. Publishing may fail that long,
    counted from the judgment (the state file's time, kept over a restart) or from this call
    (monotonic), whichever is longer. Then `complete_queued` supersedes the owed `complete`, queues
    the result and opens the gate. A stop (`stopping()`) ends the tries. Each try runs inside
    `each_try()`, where one check of the release serves `write_assets` and `promote_last_good`.
    """
    delay = PUBLISH_RETRY_FIRST
    tries = 0
    why = ""
    began = monotonic()
    queued: dict[str, Any] | None = None  # the arguments of complete_queued, once given up
    while True:
        tries += 1
        before_try(tries, why)
        try:
            with each_try():
                if queued is not None:
                    return _complete_queued(controller, queued)
                doc = controller.resume()
                if doc.state == StateName.judged_ok:
                    doc = controller.fire(Trigger.complete)
                return doc
        except PublishError as exc:
            why = str(exc)
            if max_tries is not None and tries >= max_tries:
                raise
            if stopping():
                log.warning("stopping while the result is not published: %s", exc)
                return controller.store.read()
            left = None if give_up_after is None or queued is not None else \
                _give_up_in(controller, clock, give_up_after, monotonic() - began)
            if left is not None and left <= 0:
                since = controller.store.read().since
                queued = reasons.publish_given_up(why, give_up_after or 0.0,
                                                  clock.now() if since is None else since)
                log.error("publishing the result has failed for %.0fs (publish_give_up_seconds)"
                          ": queueing it in the outbox and opening the gate; it is delivered "
                          "once the publisher answers. Last error: %s", give_up_after, exc)
                continue
            wait = delay if left is None else max(min(delay, left), 0.0)
            log.warning("publishing the result failed (try %d), retrying in %.0fs: %s",
                        tries, wait, exc)
            clock.sleep(wait)
            delay = min(delay * 2, PUBLISH_RETRY_MAX)


def _give_up_in(controller: Controller, clock: Clock, give_up_after: float,
                ran: float) -> float:
    """Seconds until publishing is given up, counted from the judgment or from this process's first
    try, whichever is longer ago. The judgment's time (`since`, wall clock) survives a restart; the
    first try's (`ran`, monotonic) is not stretched by a clock stepped back."""
    since = controller.store.read().since
    failing = max(ran, 0.0 if since is None else clock.now() - since)
    return give_up_after - failing


def _complete_queued(controller: Controller, args: dict[str, Any]) -> StateDoc:
    """Fire `complete_queued`, which supersedes an owed `complete`, or resume it if a crash left it
    owed; nothing once the node has left `judged_ok`."""
    doc = controller.store.read()
    if doc.state == StateName.judged_ok and (doc.pending is None
                                             or doc.pending.trigger == Trigger.complete):
        return controller.fire(Trigger.complete_queued, **args)
    return controller.resume()
