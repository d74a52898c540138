"""A step's rate limit, in its turn (docs/flow-control.md; schema/0022).

A step that names a rate limiter takes a slot of it before it starts: the
worker asks the home shard (`RateSlots`), which answers how long until the slot.
A short wait is waited here, on the turn's thread; a longer one parks the run
until its slot (a PENDING run with its task row due then, as a retry's backoff
is), and the home shard keeps the slot for that call of the step, so its next
turn starts it without asking for another. The step is delayed, never failed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from prometheus_client import Counter

from shardq.core.errors import InvalidArgument
from shardq.core.instruments import REGISTRY
from shardq.core.models import State, TaskAction
from shardq.workflow.control import Park

RateSlots = Callable[[str, uuid.UUID, int, int, float], float]
"""`(limiter, run, position, attempt, park_after)` -> seconds until the call's slot; a
wait over `park_after` is kept as the call's reservation. The worker's, over its store."""

PARK_AFTER_S = 0.25
"""Waits up to this long are waited on the turn's thread; longer ones park the run."""

RATE_LIMITED = Counter("shardq_worker_rate_limited_steps",
                       "Steps that waited for a slot of their rate limiter: on the turn's "
                       "thread (waited) or with their run parked (parked)",
                       ["limiter", "how"], registry=REGISTRY)


def wait_for_slot(slots: RateSlots | None, limiter: str, run: uuid.UUID, position: int,
                  attempt: int) -> None:
    """Return when the step's call may start: at once, after a short wait, or never in
    this turn (Park until its slot)."""
    if slots is None:
        raise InvalidArgument(f"rate limiter {limiter!r}: steps with a rate limit run in a "
                              "worker (this context has no rate limiter service)")
    wait = slots(limiter, run, position, attempt, PARK_AFTER_S)
    if wait > PARK_AFTER_S:
        RATE_LIMITED.labels(limiter, "parked").inc()
        raise Park(state=State.PENDING, task=TaskAction.SCHEDULE, delay=wait)
    if wait > 0:
        RATE_LIMITED.labels(limiter, "waited").inc()
        time.sleep(wait)
