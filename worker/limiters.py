"""The worker's side of rate limits (docs/flow-control.md; schema/0022): asks the home
shard for a step's slot, on the turn's thread.

Every limiter lives on the map's home shard. The worker writes its registry's
limiters there when it starts and again when a step finds its limiter missing
(a home shard that was down at the start, a limiter added since), so no
operator step is needed before a new limiter works. A home shard that cannot be
asked delays the limited step, as a wait for a slot would; it never fails it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from shardq.core.errors import InvalidArgument
from shardq.core.flow import RateLimit
from shardq.shards.errors import ShardqError
from shardq.store.protocol import WorkerStore

log = logging.getLogger(__name__)

HOME_DOWN_RETRY_S = 5.0
"""How long a limited step waits before asking again when the home shard did not answer."""


class HomeRateSlots:
    """The worker's `RateSlots` (workflow/rates.py): slots from the home shard."""

    def __init__(self, store: WorkerStore, limits: Mapping[str, RateLimit]) -> None:
        self._store = store
        self._limits = limits

    def declare(self) -> None:
        """Write the registry's limiters to the home shard; a shard that does not answer
        is left to the first step that needs one."""
        try:
            self._store.declare_rate_limiters(self._store.map.home_shard, self._limits)
        except ShardqError as exc:
            log.warning("rate limiters not declared yet: the home shard did not answer",
                        extra={"error": str(exc)})

    def __call__(self, limiter: str, run: uuid.UUID, position: int, attempt: int,
                 park_after: float) -> float:
        limit = self._limits.get(limiter)
        if limit is None:
            raise InvalidArgument(
                f"rate limiter {limiter!r} is not declared: declare it with "
                f"registry.rate_limiter({limiter!r}, rate, per=seconds)")
        home = self._store.map.home_shard
        try:
            wait = self._store.take_rate_slot(home, limiter, run=run, position=position,
                                              attempt=attempt, park_after=park_after)
            if wait is None:
                self._store.declare_rate_limiters(home, {limiter: limit})
                wait = self._store.take_rate_slot(home, limiter, run=run, position=position,
                                                  attempt=attempt, park_after=park_after)
        except ShardqError as exc:
            log.warning("rate limiter not asked: the home shard did not answer; step delayed",
                        extra={"limiter": limiter, "execution_id": str(run), "error": str(exc)})
            return HOME_DOWN_RETRY_S
        return HOME_DOWN_RETRY_S if wait is None else wait
