"""Prometheus endpoints of real processes, parsed with prometheus-client's text parser."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.servers import database_url

from ..app import registry
from ..support import Daemon, TcpProxy, age, free_port, run_cli, scrape, value, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def spawn(daemons: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """Start `shardq --shards URLS ...` with the tests' app (tests/app.py)."""

    def start(urls: list[str], *args: str) -> Daemon:
        return daemons(["--shards", ",".join(urls), *args],
                       {"SHARDQ_APP": "shardq.tests.app:registry"})

    return start


def urls(shard_map: ShardMap) -> list[str]:
    return [s.url for s in shard_map.shards]


def proxied(shard_map: ShardMap, *, forward: bool) -> tuple[TcpProxy, list[str]]:
    """The shards' URLs with shard-1's through a TCP proxy the test starts and stops
    (`forward=False`: it accepts connections and never answers)."""
    params = conninfo_to_dict(shard_map.shards[1].url)
    proxy = TcpProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432),
                     forward=forward).start()
    listed = urls(shard_map)
    listed[1] = database_url(make_conninfo(listed[1], host="127.0.0.1", port=proxy.port),
                             str(params["dbname"]))
    return proxy, listed


def test_stale_waits_overdue_runs_and_the_worker_s_own_counters(
    shard_map: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    port, worker_port = free_port(), free_port()
    exporter = spawn(urls(shard_map), "metrics", "--port", str(port), "--cache-seconds", "0",
                     "--stale-after", "signal=1", "--overdue-grace", "0.5")
    exporter.wait_for("store exporter on")
    with Client.connect(shard_map, registry) as client:
        # No worker yet: the started runs become overdue once they are due for
        # longer than the grace. The store's clock is PostgreSQL's now(), so the
        # rows age instead of the test sleeping.
        runs = [client.start("checkout", f"o-{i}", {"order_id": i, "items": []},
                             priority=6 if i == 2 else 0).execution_id
                for i in range(3)]
        age(shard_map, "tasks", "run_at", 1.0)
        samples = scrape(port)
        assert sum(value(samples, "shardq_overdue_tasks", shard=s.name) or 0
                   for s in shard_map.shards) == 3

        def due(level: int) -> float:
            found = [value(samples, "shardq_due_tasks", shard=s.name, priority=str(level))
                     for s in shard_map.shards]
            assert None not in found, f"no shardq_due_tasks series for priority {level}"
            return sum(v or 0 for v in found)

        assert [due(level) for level in range(10)] == [2, 0, 0, 0, 0, 0, 1, 0, 0, 0]
        assert all(value(samples, "shardq_shard_up", shard=s.name) == 1
                   for s in shard_map.shards)

        worker = spawn(urls(shard_map), "worker", "--metrics-port", str(worker_port))
        worker.wait_for(" serving ")
        wait_until(lambda: all(client.get(r).state is State.WAITING for r in runs), timeout=20,
                   what="parked on the payment signal")
        samples = scrape(port)
        assert sum(value(samples, "shardq_overdue_tasks", shard=s.name) or 0
                   for s in shard_map.shards) == 0
        assert [due(level) for level in range(10)] == [0] * 10
        opened = sum(value(samples, "shardq_open_waits", shard=s.name, kind="signal",
                           workflow="checkout") or 0 for s in shard_map.shards)
        assert opened == 3
        # Open longer than the 1 s bound: stale, then resolved and gone.
        age(shard_map, "waits", "started_at", 2.0)
        samples = scrape(port)
        assert sum(value(samples, "shardq_stale_waits", shard=s.name, kind="signal",
                         workflow="checkout") or 0 for s in shard_map.shards) == 3
        listed = run_cli("--shards", ",".join(urls(shard_map)), "stale", "--stale-after",
                         "signal=1", "--json")
        assert listed.returncode == 0, listed.stderr
        assert sorted(w["execution_id"] for w in json.loads(listed.stdout)["stale"]) == sorted(
            str(r) for r in runs)
        for run in runs:
            client.signal(run, "payment_captured", {"amount": 1})
        for run in runs:
            assert client.wait(run, timeout=20).state is State.COMPLETED
        samples = scrape(port)
        assert all(value(samples, "shardq_stale_waits", shard=s.name, kind="signal",
                         workflow="checkout") is None for s in shard_map.shards)
        assert sum(value(samples, "shardq_runs", shard=s.name, state="completed") or 0
                   for s in shard_map.shards) == 3

        own = scrape(worker_port)
        assert value(own, "shardq_worker_turns_total", outcome="completed") == 3
        assert value(own, "shardq_worker_turns_total", outcome="waiting") == 3
        claimed = sum(value(own, "shardq_worker_claimed_runs_total", shard=s.name) or 0
                      for s in shard_map.shards)
        assert claimed == 6
        assert sum(value(own, "shardq_worker_wakeups_total", shard=s.name, source="notify") or 0
                   for s in shard_map.shards) >= 1
        # Two steps per checkout; a replay returns recorded steps and runs none.
        assert value(own, "shardq_worker_step_attempts_total", outcome="completed") == 6
        assert (value(own, "shardq_worker_turn_seconds_count") or 0) >= 6


def test_runs_waiting_for_a_concurrency_slot_are_counted_per_shard_not_per_key(
    shard_map: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    port = free_port()
    exporter = spawn(urls(shard_map), "metrics", "--port", str(port), "--cache-seconds", "0")
    exporter.wait_for("store exporter on")

    def waiting(samples: Any) -> tuple[float, float]:
        runs = [value(samples, "shardq_concurrency_waiting", shard=s.name)
                for s in shard_map.shards]
        keys = [value(samples, "shardq_concurrency_keys_waiting", shard=s.name)
                for s in shard_map.shards]
        assert None not in runs and None not in keys, "a shard without its series"
        return sum(v or 0 for v in runs), sum(v or 0 for v in keys)

    assert waiting(scrape(port)) == (0, 0)
    with Client.connect(shard_map, registry) as client:
        for key, n in (("metrics:a", 3), ("metrics:b", 2)):
            client.start_many("checkout", [(f"{key}-{i}", {"order_id": i, "items": []})
                                           for i in range(n)], concurrency=(key, 1))
    # One of each key holds its slot; the others wait: 2 + 1 runs, on 2 keys.
    assert waiting(scrape(port)) == (3, 2)


def test_tenants_with_due_runs_are_counted_per_shard(
    shard_map: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    port = free_port()
    exporter = spawn(urls(shard_map), "metrics", "--port", str(port), "--cache-seconds", "0")
    exporter.wait_for("store exporter on")

    def tenants(samples: Any) -> list[float | None]:
        return [value(samples, "shardq_tenants_due", shard=s.name) for s in shard_map.shards]

    assert tenants(scrape(port)) == [0, 0]
    with Client.connect(shard_map, registry) as client:
        for tenant in ("acme", "bolt", "cove"):
            client.start_many("checkout", [(f"{tenant}-{i}", {"order_id": i, "items": []})
                                           for i in range(20)], tenant=tenant)
        # A tenant whose only run waits for a later time is not counted.
        later = client.start("checkout", "later", {"order_id": 9, "items": []}, tenant="dent")
    with psycopg.connect(shard_map.for_execution(later.execution_id).url,
                         autocommit=True) as conn:
        conn.execute("UPDATE shardq.tasks SET run_at = now() + interval '1 hour' "
                     "WHERE tenant = 'dent'")
    # Twenty runs of each tenant spread over both shards: each shard has all three.
    assert tenants(scrape(port)) == [3, 3]


def test_steps_parked_for_a_rate_limiter_are_counted_per_limiter_with_its_backlog(
    shard_map: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    with psycopg.connect(shard_map.home_shard.url, autocommit=True) as conn:
        conn.execute("INSERT INTO shardq.rate_limiters (name, rate, period_s, burst) "
                     "VALUES ('provider', 1, 60, 1)")
        for _ in range(3):  # the first starts now; two are parked, a minute apart
            conn.execute("SELECT shardq.take_rate_slot('provider', gen_random_uuid(), 0, 1, 0)")
    port = free_port()
    exporter = spawn(urls(shard_map), "metrics", "--port", str(port), "--cache-seconds", "0")
    exporter.wait_for("store exporter on")
    samples = scrape(port)
    assert value(samples, "shardq_rate_limited_steps", limiter="provider") == 2
    backlog = value(samples, "shardq_rate_limiter_backlog_seconds", limiter="provider")
    assert backlog is not None and 170 < backlog <= 180


def test_a_shard_that_does_not_answer_is_down_and_the_scrape_still_answers(
    shard_map: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    proxy, listed = proxied(shard_map, forward=False)  # accepts, then never answers
    try:
        port = free_port()
        exporter = spawn(listed, "metrics", "--port", str(port), "--scrape-timeout", "1",
                         "--cache-seconds", "0")
        exporter.wait_for("store exporter on")
        started = time.monotonic()
        samples = scrape(port)
        assert time.monotonic() - started < 4
        assert value(samples, "shardq_shard_up", shard="shard-0") == 1
        assert value(samples, "shardq_shard_up", shard="shard-1") == 0
        assert value(samples, "shardq_pending_signals", shard="shard-1") is None
        assert value(samples, "shardq_pending_signals", shard="shard-0") == 0
    finally:
        proxy.stop()


def test_a_refusing_shard_costs_a_scrape_nothing_and_is_up_on_the_first_scrape_back(
    shard_map: ShardMap, spawn: Callable[..., Daemon]
) -> None:
    proxy, listed = proxied(shard_map, forward=True)
    try:
        port = free_port()
        exporter = spawn(listed, "metrics", "--port", str(port), "--scrape-timeout", "10",
                         "--cache-seconds", "0")
        exporter.wait_for("store exporter on")
        samples = scrape(port)
        assert [value(samples, "shardq_shard_up", shard=s) for s in ("shard-0", "shard-1")] == [
            1, 1]
        proxy.stop()  # refuses new connections, resets the open ones
        for _ in range(4):  # each scrape, not only the first after it went
            started = time.monotonic()
            samples = scrape(port)
            # The 10 s timeout was what a scrape paid for a refusing shard before.
            assert time.monotonic() - started < 1.5
            assert value(samples, "shardq_shard_up", shard="shard-1") == 0
            assert value(samples, "shardq_pending_signals", shard="shard-1") is None
            assert value(samples, "shardq_shard_up", shard="shard-0") == 1
            assert value(samples, "shardq_pending_signals", shard="shard-0") == 0
        proxy.start()
        samples = scrape(port)  # the first scrape after it returned
        assert value(samples, "shardq_shard_up", shard="shard-1") == 1
        assert value(samples, "shardq_pending_signals", shard="shard-1") == 0
        # Logged once when it went and once when it came back, not once per scrape.
        logged = exporter.stderr()
        went = logged.count('logger=shardq.bin.metrics msg="shard unavailable')
        back = logged.count('logger=shardq.bin.metrics msg="shard answers again"')
        assert (went, back) == (1, 1), logged
    finally:
        proxy.stop()
