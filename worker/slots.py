"""A worker's bookkeeping of the runs it holds: the leases in flight, the slots a claim
reserved, and the queue of claimed runs waiting for a turn thread."""

from __future__ import annotations

import collections
import threading
import uuid
from dataclasses import dataclass

from shardq.core.models import Claim
from shardq.shards.config import Shard


@dataclass
class Reservation:
    """The turn slots a claim in flight holds, from `_reserve` until `_claimed`."""

    slots: int
    since: float
    lent: bool = False
    """Given back to the free slots because the claim stalled (CLAIM_STALL_S): what it
    claims is then counted when it answers, whatever is free by then."""


@dataclass
class InFlight:
    """A lease this worker holds, from the claim until the turn's last commit is settled.

    `token` is rewritten by the run's turn thread when a checkpoint lands, and
    read without the lock by the heartbeat and by stop(). A token one
    checkpoint old costs the heartbeat one extension of that lease (a lease
    spans three heartbeats, and outlives a failed one just the same) and
    stop() the hand-back of that lease (it expires instead). A lock would
    prevent neither, as a checkpoint can land between a reader's read and its
    statement anyway, and it would cost every checkpoint.
    """

    shard: Shard
    execution_id: uuid.UUID
    token: uuid.UUID
    workflow: str

    def log_fields(self) -> dict[str, str]:
        return {"execution_id": str(self.execution_id), "shard": self.shard.name,
                "workflow": self.workflow}


TurnItem = tuple[InFlight, Claim] | None


class TurnQueue:
    """Claimed runs waiting for a turn thread, waking idle threads one at a time.

    A queue that wakes a waiting thread per item woke the whole pool for every
    claimed batch, though a few threads finish no-op turns faster than the rest
    wake up. Here at most one idle thread is being woken at any moment: each
    one, once running, wakes the next if work is left. Busy threads take work
    without sleeping, so fast turns stay on the threads already running, while
    slow ones still fan out to every idle thread (one wake-up latency apart).
    """

    def __init__(self) -> None:
        self._items: collections.deque[TurnItem] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._idle = 0  # threads waiting in get()
        self._waking = 0  # of those, notified and not yet running

    def put_many(self, items: list[TurnItem], *, first: bool = False) -> None:
        """Queue items behind those waiting, or (`first`: urgent runs) ahead of them."""
        with self._ready:
            if first:
                self._items.extendleft(reversed(items))
            else:
                self._items.extend(items)
            self._wake_one()

    def get(self) -> TurnItem:
        with self._ready:
            while not self._items:
                self._idle += 1
                self._ready.wait()
                self._idle -= 1
                self._waking -= 1
            item = self._items.popleft()
            if self._items:
                self._wake_one()
            return item

    def _wake_one(self) -> None:
        # Holds the lock. Condition.wait() only returns after a notify (no
        # timeout here), so `_waking` counts exactly the notified sleepers.
        if self._idle and not self._waking:
            self._waking += 1
            self._ready.notify(1)
