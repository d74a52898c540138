"""Failpoints: test hooks that kill this process at a named point of its work.

`SHARDQ_FAILPOINT=<point>[@<number>]` makes the process SIGKILL itself when it
reaches `point` with that number (0 when none is given; what it counts is the
point's own: a move's batch). Tests set it on the subprocess they mean to kill, to
prove what a crash at exactly that point leaves, and that a restart recovers from
it. Unset, a failpoint costs an environment lookup. POINTS lists every point and
the state a kill there leaves; a name not in it is a programming error.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

FAILPOINT_ENV = "SHARDQ_FAILPOINT"

POINTS = {
    "relay.after_deliver": "a relay batch reached its target shards; its source rows are "
                           "not settled (the window exactly-once covers)",
    "move.plan": "the move and its batches journaled, nothing frozen",
    "move.freeze": "F1 committed on the source (the journal said fenced before it); "
                   "writers not yet waited out",
    "move.fenced": "F2 over; nothing copied",
    "move.copy": "S1 in flight: executions and history copied, the target's transaction "
                 "open",
    "move.switch": "S1 complete but not committed",
    "move.switched": "S1 committed on the target, the journal still says fenced",
    "move.release": "R committed on the source; home and the other shards lack the version",
    "move.released": "R journaled; cleanup not started",
    "move.clean": "C in flight: one chunk of the source's rows deleted",
    "move.cleaned": "C journaled for the batch; other batches' copies not yet deleted",
}
"""Every failpoint, `<component>.<point>`, and the state a kill there leaves. A move's
points take the batch's number (`move.copy@1`)."""


def parse(value: str) -> tuple[str, int]:
    """`<point>[@<number>]` as (point, number); ValueError for an unknown point or a
    number that is not one."""
    point, at, number = value.partition("@")
    if point not in POINTS:
        raise ValueError(f"{FAILPOINT_ENV}={value!r}: no failpoint {point!r} (known: "
                         f"{', '.join(POINTS)})")
    if at and not number.isdigit():
        raise ValueError(f"{FAILPOINT_ENV}={value!r}: {number!r} is not a number")
    return point, int(number or 0)


def failpoint(point: str, number: int = 0) -> None:
    """SIGKILL this process if SHARDQ_FAILPOINT names `point` with `number`."""
    if point not in POINTS:
        raise ValueError(f"no failpoint {point!r}: add it to POINTS")
    wanted = os.environ.get(FAILPOINT_ENV)
    if wanted and parse(wanted) == (point, number):
        log.warning("failpoint %s@%d reached: killing this process", point, number,
                    extra={"failpoint": point})
        os.kill(os.getpid(), signal.SIGKILL)
