"""Retention: finished runs are deleted once their definition's retention has passed.

Retention is its own setting, never derived from a workflow's timeouts,
deadlines or business dates. A definition may set `retention_s`; every other
run (also of workflows this process does not know) keeps the default. Runs
are deleted in batches, each its own short transaction under a per-shard
advisory lock, so one purger at a time works a shard and no batch holds locks
for long; live runs are never touched (only a finished run qualifies).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from shardq.shards.config import Shard
from shardq.shards.errors import ShardRetired
from shardq.store.protocol import WorkerStore
from shardq.store.store import Store
from shardq.workflow.registry import DEFAULT_RETENTION_S, Registry

log = logging.getLogger(__name__)

PURGE_BATCH = 500
KEY_IDLE_S = 3600.0
"""How long a concurrency key holds no slot, has no run waiting and is not declared by a
start before its row is deleted (a woken run of the key brings it back)."""


@dataclass(frozen=True)
class RetentionPlan:
    """The retention of each named workflow, and the default for every other one."""

    default_s: float
    explicit: dict[float, tuple[str, ...]]
    """Retention -> the workflows whose definitions set it."""

    @classmethod
    def of(cls, registry: Registry | None, default_s: float = DEFAULT_RETENTION_S) -> RetentionPlan:
        longest: dict[str, float] = {}
        for definition in registry.definitions() if registry is not None else []:
            if definition.retention_s is not None:
                # Versions that disagree: keep the runs as long as any version asks.
                longest[definition.name] = max(definition.retention_s,
                                               longest.get(definition.name, 0.0))
        groups: dict[float, list[str]] = defaultdict(list)
        for name, seconds in longest.items():
            groups[seconds].append(name)
        return cls(default_s, {s: tuple(sorted(names)) for s, names in groups.items()})

    def parts(self) -> list[tuple[float, tuple[str, ...], bool]]:
        """(retention, workflows, listed): listed groups, then the default for the rest."""
        named = tuple(sorted(n for names in self.explicit.values() for n in names))
        return [(s, names, True) for s, names in self.explicit.items()] + [
            (self.default_s, named, False)]


def purge(
    store: WorkerStore, shard: Shard, plan: RetentionPlan, *, batch: int = PURGE_BATCH
) -> int | None:
    """Delete `shard`'s finished runs past retention; how many, or None when another
    purger holds the shard."""
    total = 0
    for retention_s, workflows, listed in plan.parts():
        while True:
            gone = store.purge_batch(shard, retention_s=retention_s, workflows=workflows,
                                     listed=listed, limit=batch)
            if gone is None:
                return None if total == 0 else total
            total += gone
            if gone < batch:
                break
    if total:
        log.info("purged finished runs", extra={"shard": shard.name, "runs": total})
    keys = 0
    while True:
        gone = store.purge_idle_keys(shard, idle_s=KEY_IDLE_S, limit=batch)
        keys += gone
        if gone < batch:
            break
    if keys:
        log.info("purged idle concurrency keys", extra={"shard": shard.name, "keys": keys})
    return total


def purgeable(store: Store, shard: Shard, plan: RetentionPlan) -> int:
    """How many of `shard`'s runs a purge would delete now (a dry run).

    The concrete Store: an operator's read (`shardq purge --dry-run`), not a worker's,
    so purge_count stays out of WorkerStore."""
    return sum(store.purge_count(shard, retention_s=s, workflows=w, listed=listed)
               for s, w, listed in plan.parts())


def purge_served(  # noqa: PLR0917 - the worker's housekeeping thread, spawned once
    store: WorkerStore, served: Callable[[], list[Shard]], plan: RetentionPlan, interval_s: float,
    drained: threading.Event, stopping: threading.Event,
) -> None:
    """A worker's housekeeping: purge each served shard every `interval_s`."""
    while not drained.wait(interval_s):
        for shard in served():
            if stopping.is_set():
                return
            try:
                purge(store, shard, plan)
            except ShardRetired:
                continue  # removed from the map: the pools knew before the map loop
            except Exception as exc:  # housekeeping must never take the worker down
                log.warning("purge failed", extra={"shard": shard.name, "error": str(exc)})


def fold_counts_served(
    store: WorkerStore, served: Callable[[], list[Shard]], interval_s: float,
    drained: threading.Event,
) -> None:
    """A worker's fold of its served shards' run counts every `interval_s`: the changes
    commits append (schema/0029) become a few counter rows, so a count reads few."""
    while not drained.wait(interval_s):
        for shard in served():
            try:
                folded = store.fold_run_counts(shard)
            except ShardRetired:
                continue  # removed from the map: the pools knew before the map loop
            except Exception as exc:  # housekeeping must never take the worker down
                log.warning("count fold failed", extra={"shard": shard.name, "error": str(exc)})
                continue
            if folded:
                log.debug("folded run counts", extra={"shard": shard.name, "changes": folded})
