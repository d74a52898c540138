"""A worker serving a shard whose server hangs: TCP alive, nothing answering.

Shard 1 is reached through a TcpProxy that the test freezes (it stops moving
bytes and closes nothing: what a SIGSTOPped server or a stuck pooler looks like
to a client, keepalives included). The worker's claim loop for shard 1 is then
stuck in a statement until the store finds the server does not answer
(shards/liveness.py), and again at each probe of the shard while it is down.
What a user needs, and each test asserts: shard 0's runs keep completing at once
meanwhile (the stalled claim does not hold the turn slots), and once the server
answers again, every run on both shards completes exactly once.
"""

from __future__ import annotations

import threading
import time

import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.liveness import HUNG_NOTICE_S
from shardq.shards.pools import ShardPools
from shardq.store import listener
from shardq.store.listener import WakeSource
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker
from shardq.workflow.registry import Registry

from ..support import TcpProxy, keys_on, rows, wait_until

pytestmark = pytest.mark.slow

registry = Registry()


@registry.workflow("ping")
def ping(ctx):  # type: ignore[no-untyped-def]
    return ctx.step("pong", lambda: "pong")


def test_a_hung_shard_does_not_take_the_other_shards_turn_slots(
    shard_map: ShardMap, client: Client, frozen_rig: tuple[TcpProxy, ShardMap],
) -> None:
    proxy, through_proxy = frozen_rig
    with ShardPools(through_proxy) as pools:
        # Four slots, batches of four: a claim that kept its reservation while it waits
        # on shard 1 would leave none for shard 0.
        worker = Worker(Store(pools), registry, config=WorkerConfig(
            concurrency=4, batch_size=4, poll_interval_s=0.5, lease_s=5,
            drain_timeout_s=2)).start()
        try:
            warm = [s.execution_id for s in client.start_many(
                "ping", [(k, None) for k in keys_on(shard_map, 0, "ping", "warm", 2)
                         + keys_on(shard_map, 1, "ping", "warm", 2)])]
            wait_until(lambda: all(client.get(i).state is State.COMPLETED for i in warm),
                       what="both shards served before the freeze")

            proxy.freeze()
            # Work due on the hung shard: its claim loop claims it and stalls there.
            stuck = [s.execution_id for s in client.start_many(
                "ping", [(k, None) for k in keys_on(shard_map, 1, "ping", "stuck", 6)])]
            latencies: list[float] = []
            frozen_for = HUNG_NOTICE_S * 2 + 4  # a first stall, then probes of a down shard
            ends = time.monotonic() + frozen_for
            keys = iter(keys_on(shard_map, 0, "ping", "during", 200))
            while time.monotonic() < ends:
                began = time.monotonic()
                run = client.start("ping", next(keys)).execution_id
                wait_until(lambda run=run: client.get(run).state is State.COMPLETED,  # type: ignore[misc]
                           timeout=frozen_for, what="a run on the healthy shard")
                latencies.append(time.monotonic() - began)
                time.sleep(0.25)
            assert len(latencies) >= 8, latencies
            # A slot lent back from a stalled claim is free within CLAIM_STALL_S: no run on
            # the healthy shard waits for the hung one's statement (about HUNG_NOTICE_S).
            assert max(latencies) < 2.0, [round(x, 2) for x in latencies]
            assert all(client.get(i).state is not State.COMPLETED for i in stuck)

            # A claim the worker gave up on reaches the server once it answers again, and
            # commits leases nobody holds: those runs wait out their lease (5 s here).
            proxy.thaw()
            wait_until(lambda: all(client.get(i).state is State.COMPLETED for i in stuck),
                       timeout=30, what="the hung shard's runs, once it answers")
        finally:
            worker.stop()
    # Exactly once: one outcome per run, one pong per run, on both shards.
    for shard in shard_map.shards:
        doubled = rows(shard.url, "SELECT execution_id, count(*) FROM shardq.events "
                                  "WHERE kind IN ('run.completed', 'step.completed') "
                                  "GROUP BY 1, kind HAVING count(*) > 1")
        assert doubled == [], doubled


def test_a_statement_to_a_hung_shard_fails_within_the_bound_and_the_other_answers(
    shard_map: ShardMap, frozen_rig: tuple[TcpProxy, ShardMap],
) -> None:
    proxy, through_proxy = frozen_rig
    with ShardPools(through_proxy) as pools:
        store = Store(pools)
        healthy, hung = through_proxy.shards
        assert store.takes_writes(hung)  # reached and verified before the freeze
        proxy.freeze()
        outcome: list[object] = []

        def call_hung() -> None:
            began = time.monotonic()
            try:
                store.takes_writes(hung)
            except Exception as exc:
                outcome.append(exc)
            outcome.append(time.monotonic() - began)

        caller = threading.Thread(target=call_hung)
        caller.start()
        time.sleep(0.5)
        began = time.monotonic()
        assert store.takes_writes(healthy)  # meanwhile, the other shard answers
        assert time.monotonic() - began < 1.0
        caller.join(HUNG_NOTICE_S + 5)
        assert not caller.is_alive(), "a statement to a hung server never failed"
        error, seconds = outcome
        assert isinstance(error, ShardUnavailable), error
        assert isinstance(seconds, float)
        # Its statement was abandoned, or (a pool still opening connections) no connection
        # came and a probe got no answer: either way one line naming the shard.
        assert "shard-1" in str(error) and "not answering" in str(error), error
        assert seconds <= HUNG_NOTICE_S + 1.0, seconds
        proxy.thaw()
        wait_until(lambda: answers(store, hung), timeout=15,
                   what="the shard serving again once it answers")


def answers(store: Store, shard: Shard) -> bool:
    try:
        return store.takes_writes(shard)
    except ShardUnavailable:
        return False


def test_a_listen_connection_that_went_quiet_is_replaced_and_hears_again(
    shard_map: ShardMap, frozen_rig: tuple[TcpProxy, ShardMap], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its own connection silent, the server answering others (a stale NAT entry, a stuck
    pooler client): a probe finds the server alive, so only the capped check ends it."""
    monkeypatch.setattr(listener, "CHECK_AFTER_S", 1.0)
    proxy, through_proxy = frozen_rig
    wake = WakeSource(through_proxy.shards[1])
    direct = shard_map.shards[1].url
    try:
        assert wake.wait(10)  # the first connection counts as a wake-up
        wake.clear()
        proxy.freeze_open()
        notify(direct)  # lost with the quiet connection
        began = time.monotonic()
        assert wake.wait(1.0 + listener.PING_CAP_S + 5), "the quiet connection was never replaced"
        assert time.monotonic() - began <= 1.0 + listener.PING_CAP_S + 2
        wake.clear()
        notify(direct)
        assert wake.wait(5), "the new LISTEN connection does not hear NOTIFYs"
    finally:
        wake.close()


def notify(url: str) -> None:
    rows(url, "SELECT pg_notify(shardq.wake_channel(), '') IS NULL")


def test_a_slow_statement_on_a_server_that_answers_is_not_cut_short(
    shard_map: ShardMap, frozen_rig: tuple[TcpProxy, ShardMap],
) -> None:
    """The watchdog asks the server, it does not time the statement: a statement that runs
    past HUNG_NOTICE_S on a server that answers its probe completes and keeps its
    connection (a long report, a big purge), through the same proxy that can freeze."""
    _proxy, through_proxy = frozen_rig
    with ShardPools(through_proxy) as pools:
        shard = through_proxy.shards[1]
        slow_s = HUNG_NOTICE_S + 2.0
        began = time.monotonic()
        with pools.connection(shard) as conn:
            row = conn.execute("SELECT pg_sleep(%s)::text AS slept, pg_backend_pid() AS pid",
                               (slow_s,)).fetchone()
        assert row is not None and row["slept"] == ""
        assert time.monotonic() - began >= slow_s
        # Not abandoned: the backend that ran it is still connected (an abandoned round
        # trip closes its connection).
        assert rows(shard_map.shards[1].url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                    row["pid"]) == [(1,)]
