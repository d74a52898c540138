"""Following the shard map: where a process learns newer versions, and the one retry
policy for requests a shard refused because a bucket moved (docs/design/growing.md,
sections 3.4 and 5.1).

A request routed by an older map is refused by the shard, in the writing
transaction (shardq.fence): NotOwner when the bucket belongs to another shard now,
Fenced while a move has frozen it. `Rerouting` decides what the caller does next:

- NotOwner: read the newer version from the shard that refused (it holds the
  version it names) and retry at once on the owner it gives;
- Fenced: back off 20, 40, 80 ms ... capped at 200 ms and retry, reading the
  newer version first whenever the refusal names one; from the second refusal on,
  also read the move's target's versions (the switch may have committed there
  while the mover died before it released the source);
- after SHARDQ_MOVE_RETRY_S seconds (10 by default), ShardUnavailable naming the
  bucket, the move and the shard.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ConfigError, Fenced, NotOwner, ShardUnavailable
from shardq.shards.sqlfile import load_queries

if TYPE_CHECKING:
    from shardq.shards.check import ShardStatus
    from shardq.shards.connections import DictConnection

log = logging.getLogger(__name__)

SQL = load_queries("shardq.shards", "queries.sql")

ENV_MOVE_RETRY = "SHARDQ_MOVE_RETRY_S"
DEFAULT_MOVE_RETRY_S = 10.0
ENV_MAP_POLL = "SHARDQ_MAP_POLL_S"
DEFAULT_MAP_POLL_S = 30.0
FIRST_PAUSE_S = 0.02
MAX_PAUSE_S = 0.2

R = TypeVar("R")


class Router(Protocol):
    """What follows the map: ShardPools."""

    @property
    def map(self) -> ShardMap: ...

    def refresh(self, at_least: int = 0, via: Shard | str | None = None) -> ShardMap: ...


def _seconds_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1e6:  # also refuses nan and inf
        raise ConfigError(f"{name} must be a number of seconds within 0..1e6, got {raw!r}")
    return value


def move_retry_budget() -> float:
    """Seconds a refused request is retried before ShardUnavailable (SHARDQ_MOVE_RETRY_S)."""
    return _seconds_env(ENV_MOVE_RETRY, DEFAULT_MOVE_RETRY_S)


def map_poll_interval() -> float:
    """Seconds between a long-lived process's re-reads of the newest map version
    (SHARDQ_MAP_POLL_S; 0 turns the poll off)."""
    return _seconds_env(ENV_MAP_POLL, DEFAULT_MAP_POLL_S)


@dataclass
class Rerouting:
    """The retry state of one request (or one batch) refused by a move; see the module
    docstring. `pause_after(refusal)` refreshes the router's map as the refusal asks and
    says how long to wait before the retry, or raises ShardUnavailable past the budget;
    `after(refusal)` waits that long (an asyncio caller awaits it instead)."""

    router: Router
    budget_s: float = field(default_factory=move_retry_budget)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    started: float = -1.0
    fenced: int = 0
    attempts: int = 0

    def after(self, refusal: NotOwner) -> None:
        pause = self.pause_after(refusal)
        if pause > 0:
            self.sleep(pause)

    def pause_after(self, refusal: NotOwner) -> float:
        now = self.clock()
        if self.started < 0:
            self.started = now
        self.attempts += 1
        elapsed = now - self.started
        if elapsed >= self.budget_s:
            raise ShardUnavailable(_gave_up(refusal, elapsed, self.budget_s)) from refusal
        before = self.router.map.version
        if refusal.map_version > before:
            self.router.refresh(at_least=refusal.map_version, via=refusal.shard)
        if isinstance(refusal, Fenced):
            self.fenced += 1
            if self.fenced >= 2 and refusal.target:
                # The switch commits on the target first: it may own the bucket already.
                self._refresh_quietly(refusal.target)
        elif self.router.map.version > before:
            return 0.0  # the owner is known now: at once
        else:
            # Not the owner, yet no newer version there: another process's refresh
            # may have raced ours; read once more, then back off as for a fence.
            self._refresh_quietly(refusal.shard)
            if self.router.map.version > before:
                return 0.0
        pause: float = min(MAX_PAUSE_S, FIRST_PAUSE_S * 2.0 ** min(self.attempts - 1, 8))
        return max(0.0, min(pause, self.budget_s - elapsed))

    def _refresh_quietly(self, via: str) -> None:
        try:
            self.router.refresh(via=via)
        except ShardUnavailable as exc:
            log.debug("could not read the map", extra={"shard": via, "error": str(exc)})


def _gave_up(refusal: NotOwner, elapsed: float, budget: float) -> str:
    waited = f"after {elapsed:.1f} s of retries (SHARDQ_MOVE_RETRY_S={budget:g})"
    if isinstance(refusal, Fenced):
        return (f"{refusal.shard}: bucket {refusal.bucket} is frozen by move {refusal.move} "
                f"to {refusal.target} {waited}: the move may have stopped; see "
                "`shardq shards status`")
    return (f"{refusal.shard}: bucket {refusal.bucket} is not owned there, and no map "
            f"version naming its owner could be read {waited} (refusal at map version "
            f"{refusal.map_version})")


def rerouted(router: Router, call: Callable[[ShardMap], R], *,
             rerouting: Rerouting | None = None) -> R:
    """`call(current map)` until no shard refuses it for a moved bucket (see Rerouting).

    `call` routes by the map it is given, and must be safe to repeat: a refusal
    rolled its transaction back, so nothing of a refused attempt was stored.
    """
    retry = rerouting or Rerouting(router)
    while True:
        try:
            return call(router.map)
        except NotOwner as refusal:
            retry.after(refusal)


# -- reading versions --------------------------------------------------------------


def read_newer_map(conn: DictConnection, after: int) -> tuple[int, dict[str, Any], Any] | None:
    """(version, layout, deployment) of the newest map version newer than `after` that
    the connected shard holds, or None."""
    row = conn.execute(SQL["read_newer_map"], {"after": after}).fetchone()
    if row is None:
        return None
    return int(row["version"]), json.loads(row["layout"]), row["deployment"]


def newest_map(seeds: ShardMap, statuses: Iterable[ShardStatus]) -> ShardMap:
    """The map to start from: the newest version among `statuses` (what verify_shards
    read from the reachable seeds), or the seeds themselves when none is newer, with
    the deployment the shards recorded."""
    best: ShardStatus | None = None
    deployment = None
    for status in statuses:
        deployment = deployment or status.deployment
        if status.layout is not None and status.map_version is not None and (
            best is None or status.map_version > (best.map_version or 0)
        ):
            best = status
    if best is None or best.map_version is None or best.layout is None or (
        best.map_version <= seeds.version
    ):
        if deployment is None or seeds.deployment is not None:
            return seeds
        return ShardMap(seeds.shards, version=seeds.version, home=seeds.home,
                        deployment=deployment, origin=seeds.origin, pool_min=seeds.pool_min,
                        pool_max=seeds.pool_max, pooler=seeds.pooler)
    return ShardMap.from_layout(best.layout, best.map_version, seeds=seeds,
                                deployment=best.deployment or deployment)
