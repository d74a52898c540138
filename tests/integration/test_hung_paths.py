"""Every path a daemon takes to a shard, against a server that hangs: each fails within the
documented bound (shards.liveness.HUNG_NOTICE_S) instead of waiting for ever.

Shard 1 is reached through a TcpProxy the test freezes: connections stay open and new ones
are accepted, nothing reaches the server and nothing comes back (TCP keepalives see a
healthy peer, the server's statement_timeout never starts). One freeze, every path called
at once on threads of their own: the worker's claim, heartbeat, commit and hand-back; the
map follower's read; the relay's claim, probe and settle (the settle of rows claimed just
before the freeze); `shardq serve`'s call (AsyncClient); the exporter's read.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from shardq.bin.metrics import StoreCollector
from shardq.client.async_client import AsyncClient
from shardq.core.errors import ExecutionNotFound
from shardq.core.models import StaleBounds, TurnCommit
from shardq.outbox.store import OutboxStore
from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.config import ShardMap
from shardq.shards.liveness import HUNG_NOTICE_S
from shardq.shards.pools import ShardPools
from shardq.shards.routing import new_execution_id
from shardq.store.async_store import AsyncStore
from shardq.store.params import Lease
from shardq.store.store import Store
from shardq.worker.completer import Completer
from shardq.workflow.registry import Registry

from ..support import TcpProxy

pytestmark = pytest.mark.slow

BOUND_S = HUNG_NOTICE_S + 1.5
"""The documented bound, and scheduling slack for a dozen threads on two cores."""


Call = Callable[[], object]
Path = Callable[[], Call]
"""Prepares a path before the freeze (on the thread that will call it) and returns the call."""


def test_every_path_to_a_hung_shard_fails_within_the_bound(
    frozen_rig: tuple[TcpProxy, ShardMap],
) -> None:
    proxy, two = frozen_rig
    hung = two.shards[1]
    with ShardPools(two) as pools, ShardPools(two, probe=True, statement_timeout_s=2) as scrape:
        store = Store(pools)
        outbox = OutboxStore(store)
        collector = StoreCollector(lambda: Store(scrape), two, bounds=StaleBounds(),
                                   overdue_grace_s=30, cache_s=0, timeout_s=2)
        lease = Lease(uuid.uuid4(), uuid.uuid4())
        after: list[Callable[[], object]] = []  # cleanups, once the server answers again

        def ready(call: Call) -> Path:
            return lambda: call

        def settle() -> Call:
            # Rows claimed before the freeze and settled during it: the relay's commit.
            claim = outbox.claim(hung, limit=10)
            claim.__enter__()
            return lambda: claim.__exit__(None, None, None)

        paths: dict[str, Path] = {
            "worker claim": ready(lambda: store.claim(hung, owner="t", limit=4, lease_s=10)),
            "worker heartbeat": ready(lambda: store.extend_leases(hung, [lease], 10)),
            "worker commit (completer)": ready(lambda: Completer(
                store, hung, lease_s=10, retry_for_s=0).submit(
                    TurnCommit(lease.execution_id, lease.token))),
            "worker hand-back": ready(lambda: store.release_leases(hung, [lease])),
            "map follower": ready(lambda: pools.refresh(via=hung)),
            "relay claim": ready(lambda: outbox.claim(hung, limit=10).__enter__()),
            "relay probe": ready(lambda: store.takes_writes(hung)),
            "relay settle": settle,
            "serve call": lambda: serve_call(two, after),
            "exporter read": ready(lambda: collector._read(hung, two)),
        }
        outcomes = run_all(paths, freeze=proxy.freeze)
        proxy.thaw()
        for cleanup in after:
            cleanup()
    late = {name: f"{seconds:.1f} s, {error}" for name, (seconds, error) in outcomes.items()
            if seconds > BOUND_S or error is None}
    assert not late, late
    # Each failure is the one line a log or a caller gets: it names the shard and says why
    # (the exporter's pools wait for a connection no longer than a scrape: timed out).
    unclear = {name: error for name, (_, error) in outcomes.items()
               if error is None or hung.name not in error
               or not ("not answering" in error or "timed out" in error)}
    assert not unclear, unclear


def serve_call(two: ShardMap, after: list[Callable[[], object]]) -> Call:
    """An AsyncClient on an event loop of this thread, its pools warm before the freeze
    (closed after the thaw: a pool closing meanwhile waits for its connection attempts)."""
    runner = asyncio.Runner()
    pools = AsyncShardPools(two, statement_timeout_s=15).open()
    client = AsyncClient(AsyncStore(pools), Registry())
    on_hung = new_execution_id(two.shards[1].first_bucket)
    with pytest.raises(ExecutionNotFound):
        runner.run(client.get(on_hung))

    def close() -> None:
        runner.run(pools.close())
        runner.close()

    after.append(close)
    return lambda: runner.run(client.get(on_hung))


def run_all(paths: dict[str, Path], *, freeze: Callable[[], None]
            ) -> dict[str, tuple[float, str | None]]:
    """Each path prepared on a thread of its own, then `freeze`, then every call at once:
    (seconds it took, its error or None)."""
    outcomes: dict[str, tuple[float, str | None]] = {}
    prepared = threading.Barrier(len(paths) + 1)
    go = threading.Event()

    def run(name: str, path: Path) -> None:
        call = path()
        prepared.wait(30)
        go.wait(30)
        began = time.monotonic()
        try:
            call()
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        outcomes[name] = (time.monotonic() - began, error)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in paths.items()]
    for thread in threads:
        thread.start()
    prepared.wait(30)
    freeze()
    go.set()
    deadline = time.monotonic() + BOUND_S + 10
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {name: outcomes.get(name, (float("inf"), None)) for name in paths}
