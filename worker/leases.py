"""Keeping a worker's leases: one heartbeat thread per shard extends what it holds there."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from shardq.core.daemons import first_line
from shardq.shards.config import Shard
from shardq.shards.errors import ShardqError, ShardRetired
from shardq.store.params import Lease
from shardq.store.protocol import WorkerStore

log = logging.getLogger(__name__)


def beat(  # noqa: PLR0917 - partial-applied once per shard by the worker
    store: WorkerStore, shard: Shard, held: Callable[[], list[Lease]], lease_s: float,
    drained: threading.Event, gone: threading.Event,
) -> None:
    """Extend the leases `held()` names on `shard` every third of a lease, until the
    worker's drain is over (`drained`) or the shard is let go (`gone`).

    A thread per shard: an extension to a shard that hangs blocks until the store
    finds out (shards/liveness.py), and must not hold back the leases of the
    healthy ones. A third of the lease: two heartbeats may fail before another
    worker could take a healthy turn over.
    """
    interval = lease_s / 3
    while not drained.wait(interval) and not gone.is_set():
        leases = held()
        if not leases:
            continue
        try:
            kept = store.extend_leases(shard, leases, lease_s)
        except ShardRetired:
            continue  # removed from the map: its claim loop lets it go
        except ShardqError as exc:
            log.warning("heartbeat failed", extra={"shard": shard.name, "error": first_line(exc)})
            continue
        except Exception:
            # A heartbeat thread that died would leave the worker claiming
            # while every lease it holds expires under its turns (which
            # then run again elsewhere): log it and beat again next time.
            log.exception("heartbeat failed; retrying", extra={"shard": shard.name})
            continue
        for lease in leases:
            if lease.execution_id not in kept:
                log.debug("lease not extended (finished or lost)",
                          extra={"execution_id": str(lease.execution_id)})
