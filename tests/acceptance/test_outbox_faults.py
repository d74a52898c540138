"""The outbox relay under faults: real relay processes, three shard databases, kills.

Senders run in an in-process worker; the relays are `shardq outbox-relay`
processes, killed with SIGKILL (or by the test-only failpoint) and restarted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.failpoints import FAILPOINT_ENV
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.servers import database_url
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..conftest import TABLES, Server
from ..support import (
    Daemon,
    TcpProxy,
    allow_connections,
    free_port,
    keys_on,
    rows,
    run_cli,
    scrape,
    value,
    wait_until,
)

pytestmark = pytest.mark.slow
registry = Registry()


@registry.workflow("parked")
def parked(ctx: WorkflowContext) -> Any:
    """A target that buffers what it is sent: it waits on a name nobody sends."""
    return ctx.wait_for_signal("never")


@registry.workflow("spray")
def spray(ctx: WorkflowContext) -> int:
    """Send `count` numbered signals round-robin to `targets`; every other one keyed."""
    targets = ctx.input["targets"]
    for seq in range(ctx.input["count"]):
        key = f"{ctx.workflow_id}-{seq}" if seq % 2 == 0 else None
        ctx.signal_external(targets[seq % len(targets)], "item",
                            {"sender": ctx.workflow_id, "seq": seq}, idempotency_key=key)
    return int(ctx.input["count"])


@pytest.fixture(scope="module")
def three_shards(pg_server: Server) -> ShardMap:
    shard_map = ShardMap.from_urls(pg_server.create_databases(3, tag="relay"), pool_max=20)
    migrate(shard_map)
    return shard_map


@pytest.fixture
def shards(three_shards: ShardMap) -> ShardMap:
    for shard in three_shards.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("TRUNCATE " + ", ".join(f"shardq.{t}" for t in TABLES))
    return three_shards


@pytest.fixture
def client(shards: ShardMap) -> Iterator[Client]:
    with Client.connect(shards, registry) as opened:
        yield opened


@pytest.fixture
def worker(shards: ShardMap) -> Iterator[Worker]:
    with ShardPools(shards) as pools:
        running = Worker(Store(pools), registry, config=WorkerConfig(
            concurrency=40, batch_size=20, poll_interval_s=1.0, lease_s=10.0,
        )).start()
        yield running
        running.stop()


@pytest.fixture
def spawn(daemons: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """Start an outbox relay on these shard URLs."""

    def start(urls: list[str], *args: str, env: dict[str, str] | None = None) -> Daemon:
        return daemons(["--shards", ",".join(urls), "outbox-relay", "--max-backoff", "0.5",
                        "--poll-interval", "1", *args], env)

    return start


def urls(shard_map: ShardMap) -> list[str]:
    return [s.url for s in shard_map.shards]


def park_targets(client: Client, index: int, count: int) -> list[str]:
    started = client.start_many("parked", [(k, None) for k in
                                           keys_on(client.map, index, "parked", "t", count)])
    return [str(s.execution_id) for s in started]


def outbox_left(shard_map: ShardMap) -> int:
    return sum(rows(s.url, "SELECT count(*) FROM shardq.outbox")[0][0] for s in shard_map.shards)


def received(shard_map: ShardMap) -> list[tuple[str, str, int, Any]]:
    """(target, sender, seq, key) of every stored signal, in each target's arrival order."""
    found: list[tuple[str, str, int, Any]] = []
    for shard in shard_map.shards:
        found += rows(shard.url, "SELECT execution_id::text, payload->>'sender', "
                                 "(payload->>'seq')::int, idempotency_key "
                                 "FROM shardq.signals WHERE name = 'item' ORDER BY id")
    return found


def assert_once_in_order(found: list[tuple[str, str, int, Any]], expected: int) -> None:
    assert len(found) == expected
    assert len({(sender, seq) for _, sender, seq, _ in found}) == expected
    last: dict[tuple[str, str], int] = {}
    for target, sender, seq, _ in found:
        assert seq > last.get((target, sender), -1), f"{sender} -> {target}: {seq} out of order"
        last[(target, sender)] = seq


def test_a_relay_killed_between_the_target_s_commit_and_its_mark_delivers_once(
    client: Client, worker: Worker, spawn: Callable[..., Daemon], shards: ShardMap
) -> None:
    targets = park_targets(client, 1, 2)
    (name,) = keys_on(client.map, 0, "spray", "s", 1)
    sender = client.start("spray", name, {"targets": targets, "count": 2})
    assert client.wait(sender.execution_id, timeout=20).state is State.COMPLETED

    doomed = spawn(urls(shards), env={FAILPOINT_ENV: "relay.after_deliver"})
    assert doomed.wait_exit(30) == -9
    # The target committed both (one keyed, one not); the source never marked them.
    assert len(received(shards)) == 2
    assert rows(shards.shards[0].url, "SELECT count(*) FROM shardq.outbox "
                                      "WHERE state = 'pending'") == [(2,)]

    relay = spawn(urls(shards))
    relay.wait_for("outbox relay serving")
    wait_until(lambda: outbox_left(shards) == 0, timeout=20, what="rows settled")
    found = received(shards)
    assert_once_in_order(found, 2)
    assert sorted(found[i][3] is None for i in range(2)) == [False, True]
    relay.proc.terminate()
    assert relay.wait_exit(30) == 0
    assert "duplicate 2" in relay.stderr()


def test_ten_thousand_signals_land_once_in_order_through_two_relays_one_killed_repeatedly(
    client: Client, worker: Worker, spawn: Callable[..., Daemon], shards: ShardMap
) -> None:
    targets = {i: park_targets(client, i, 10) for i in range(3)}
    senders: list[tuple[str, dict[str, Any]]] = []
    for i in range(3):
        elsewhere = [t for j, ts in targets.items() if j != i for t in ts]
        for name in keys_on(client.map, i, "spray", f"s{i}", 10 if i else 20):
            senders.append((name, {"targets": elsewhere, "count": 250}))
    assert len(senders) * 250 == 10_000

    steady = spawn(urls(shards))
    client.start_many("spray", senders[:20])
    victim = spawn(urls(shards), "--batch-size", "50")
    rng = random.Random(7)
    for kill in range(6):
        if kill == 2:
            client.start_many("spray", senders[20:])
        time.sleep(rng.uniform(0.3, 1.0))
        victim.proc.kill()
        victim.wait_exit(10)
        victim = spawn(urls(shards), "--batch-size", "50")
    wait_until(lambda: len(received(shards)) >= 10_000 and outbox_left(shards) == 0,
               timeout=120, what="every signal delivered")
    assert_once_in_order(received(shards), 10_000)
    for daemon in (steady, victim):
        daemon.proc.terminate()
        assert daemon.wait_exit(30) == 0, daemon.stderr()


def test_a_shard_that_goes_away_backs_up_its_rows_while_the_others_flow(
    client: Client, worker: Worker, spawn: Callable[..., Daemon], shards: ShardMap,
    tmp_path: Path,
) -> None:
    params = conninfo_to_dict(shards.shards[2].url)
    proxy = TcpProxy(str(params.get("host") or "127.0.0.1"),
                     int(params.get("port") or 5432)).start()
    try:
        proxied = urls(shards)
        proxied[2] = database_url(make_conninfo(shards.shards[2].url, host="127.0.0.1",
                                                port=proxy.port), str(params["dbname"]))
        relay_port, exporter_port = free_port(), free_port()
        relay = spawn(proxied, "--metrics-port", str(relay_port))
        relay.wait_for("outbox relay serving")
        exporter = Daemon("exporter", ["--shards", ",".join(urls(shards)), "metrics", "--port",
                                       str(exporter_port), "--cache-seconds", "0"], tmp_path)
        exporter.wait_for("store exporter on")
        healthy, away = park_targets(client, 1, 3), park_targets(client, 2, 3)
        proxy.stop()

        first = keys_on(client.map, 0, "spray", "a", 4)
        client.start_many("spray", [(n, {"targets": healthy + away, "count": 60}) for n in first])
        # Half of each sender's rows go to the shard that is away: those back up
        # while the other half is delivered.
        wait_until(lambda: len(received(shards)) == 120, timeout=30, what="healthy half")
        second = keys_on(client.map, 0, "spray", "b", 2)
        client.start_many("spray", [(n, {"targets": healthy, "count": 30}) for n in second])
        wait_until(lambda: len(received(shards)) == 180, timeout=30, what="second wave")
        # A delivered row goes when its relay round settles, just after the target's commit.
        backlog = wait_until(lambda: [r for r in rows(
            shards.shards[0].url, "SELECT count(*), max(attempts) FROM shardq.outbox")
            if r[0] == 120], what="only the unreachable shard's rows left")
        assert backlog[0][1] >= 1
        status = run_cli("--shards", ",".join(urls(shards)), "outbox", "--json")
        assert '"pending": 120' in status.stdout, status.stdout
        backlog_to_2 = {"source_shard": "shard-0", "target_shard": "shard-2"}
        assert value(scrape(exporter_port), "shardq_outbox_pending", **backlog_to_2) == 120
        # Only each pair's head is tried (order), and a skipped shard's rows wait.
        assert (value(scrape(relay_port), "shardq_relay_rows_total", source="shard-0",
                      outcome="retried") or 0) >= 1

        proxy.start()
        back = time.monotonic()
        wait_until(lambda: outbox_left(shards) == 0, timeout=60, what="backlog delivered")
        # A prober asks the shard once a second; its answer makes the deferred rows
        # due at once (it took a relay 69 to 117 s when each row waited out its backoff).
        took = time.monotonic() - back
        print(f"backlog of 120 delivered {took:.1f} s after the shard came back")
        assert took < 15, took
        assert_once_in_order(received(shards), 300)
        assert value(scrape(exporter_port), "shardq_outbox_pending", **backlog_to_2) is None
        exporter.proc.terminate()
        assert exporter.wait_exit(10) == 0
    finally:
        proxy.stop()


def test_a_relay_refuses_unmigrated_shards_and_a_foreign_map_with_one_line(
    fresh_databases: Callable[..., list[str]], spawn: Callable[..., Daemon]
) -> None:
    bare = fresh_databases(3, "bare")
    relay = spawn(bare)
    assert relay.wait_exit(30) == 5
    (line,) = relay.stderr().strip().splitlines()
    assert "shardq migrate" in line or "schema" in line

    two = fresh_databases(2, "two")
    migrate(ShardMap.from_urls(two))
    relay = spawn([*two, bare[0]])
    assert relay.wait_exit(30) == 4
    (line,) = relay.stderr().strip().splitlines()
    assert "map" in line


def test_the_tenant_cancel_example_fans_out_over_three_shards(
    shards: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    # The demo's own example (docs/workflows.md shows it), so the demo's registry and not
    # tests/app.py: this test is what says that example still works.
    from shardq.bin.examples import registry as examples

    relay = spawn(urls(shards))
    with ShardPools(shards) as pools, Client(Store(pools), examples) as client:
        running = Worker(Store(pools), examples, config=WorkerConfig(poll_interval_s=1.0)).start()
        try:
            users = [client.start("onboarding", key).execution_id
                     for i in range(3) for key in keys_on(client.map, i, "onboarding", f"u{i}", 2)]
            wait_until(lambda: all(client.get(u).state is State.WAITING for u in users),
                       timeout=20, what="users parked")
            finished = [users[0], users[5]]  # on the sender's shard, and on shard 2
            for user in finished:
                client.signal(user, "tenant_cancelled", {"reason": "by hand"})
                client.wait(user, timeout=20)
            (name,) = keys_on(client.map, 0, "tenant_cancel", "tc", 1)
            sender = client.start("tenant_cancel", name, {"runs": [str(u) for u in users]})
            done = client.wait(sender.execution_id, timeout=20)
            assert done.output["signalled"] == [str(users[1])]
            assert done.output["queued"] == [str(u) for u in users[2:]]
            assert done.output["skipped"] == {str(users[0]): "target_finished"}
            for user in users[1:5]:
                assert client.wait(user, timeout=20).output == "stopped: tenant cancelled"
            relayed = wait_until(lambda: [
                e.payload for e in client.history(sender.execution_id)
                if e.kind == "external.failed" and e.position is None], what="relay's record")
            assert [(p["target"], p["reason_code"]) for p in relayed] == [
                (str(users[5]), "target_finished")]
        finally:
            running.stop()
    relay.proc.terminate()
    assert relay.wait_exit(30) == 0


def test_daemons_started_while_shards_refuse_check_the_map_when_they_come_back(
    client: Client, worker: Worker, shards: ShardMap, daemons: Callable[..., Daemon],
) -> None:
    """A relay and a worker started with a two-shard map for three-shard databases, while
    every shard refuses connections: once the shards answer, both exit 4 naming the map,
    and not one queued row or parked run was touched under the wrong map."""
    targets = park_targets(client, 1, 3) + park_targets(client, 2, 3)
    client.start_many("spray", [(n, {"targets": targets, "count": 4})
                                for n in keys_on(client.map, 0, "spray", "m", 6)])
    wait_until(lambda: outbox_left(shards) == 24, timeout=30, what="24 rows queued")
    worker.stop()
    before = {s.name: rows(s.url, "SELECT count(*) FROM shardq.events")[0][0]
              for s in shards.shards}
    wrong = urls(shards)[:2]
    allow_connections(urls(shards), allowed=False)
    try:
        relay = daemons(["--shards", ",".join(wrong), "outbox-relay", "--poll-interval", "1"])
        running = daemons(["--shards", ",".join(wrong), "worker", "--app",
                           "shardq.tests.app:registry"])
        relay.wait_for("outbox relay serving")
        running.wait_for("serving")
        time.sleep(1)  # both have tried the shards, and been refused
        assert relay.proc.poll() is None and running.proc.poll() is None
    finally:
        allow_connections(urls(shards), allowed=True)
    assert relay.wait_exit(20) == 4, relay.stderr()
    assert running.wait_exit(20) == 4, running.stderr()
    for daemon in (relay, running):
        assert "shardq: error:" in daemon.stderr() and "map mismatch" in daemon.stderr()
        assert "Traceback" not in daemon.stderr()
    assert outbox_left(shards) == 24
    assert rows(shards.shards[0].url, "SELECT count(*) FROM shardq.outbox WHERE attempts > 0 "
                                      "OR state <> 'pending'") == [(0,)]
    assert {s.name: rows(s.url, "SELECT count(*) FROM shardq.events")[0][0]
            for s in shards.shards} == before
