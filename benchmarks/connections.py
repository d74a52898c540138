"""How many connections a worker holds at 64 shards: `connections_per_worker_64_shards`.

64 shards on 2 PostgreSQL servers (embedded ones started for the scenario: at 64
shards as databases it opens about 100 sessions a server), as schemas of one
database per server (shards/layout.py): 32 each. One worker process, started as an
operator starts it (`SHARDQ_POOL_MAX=6`, a 60 s safety poll), serves all 64 while the
scenario starts one-step runs on every shard (500 a call) and waits for them; a
sampler counts the worker's sessions on both servers every 20 ms (its pools are
`shardq-worker`, its LISTEN connections `shardq`; the scenario's own client is named
otherwise). Then 100 parked probes are signalled one at a time:
signal -> resumed latency, every wake-up a NOTIFY heard on a shared LISTEN connection.

The same at 8 shards as schemas (4 a server), and at 8 and 64 shards as databases
(today's default layout) for what the schemas change: connections that do not grow
with the shards, and the wake path's one thread hand-off more
(`connections_<n>_wake_p99_schemas_over_databases`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.fleet import Fleet, FleetConfig
from shardq.benchmarks.measure import Progress, percentiles
from shardq.benchmarks.workflows import WAKE_SIGNAL, registry
from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.layout import with_schema
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.shards.servers import database_url
from shardq.store.store import Store

DATABASE = "connbench"
POOL_MAX = 6
"""The worker's pool per database: `SHARDQ_POOL_MAX`, what an operator sizes once per
server, whatever the shards on it."""
RUNS_PER_SHARD = 40
WAKE_SAMPLES = 100
LATE_MS = 10_000
"""A wake-up slower than this came from the safety poll, not a NOTIFY."""
SAMPLE_S = 0.02
SESSIONS = """SELECT count(*) FROM pg_stat_activity
WHERE datname = ANY(%s) AND application_name IN ('shardq', 'shardq-worker')"""


def connections(b: Bench) -> dict[str, Any]:
    b.stop_fleet()  # the suite's workers hold sessions of their own
    out: dict[str, Any] = {"connections_pool_max": POOL_MAX}
    # Two servers of the scenario's own: at 64 shards as databases, the worker's pools
    # and LISTEN connections, and the scenario's client, open about 100 sessions a
    # server, more than a default max_connections of 100 leaves (the embedded one
    # allows 300).
    with EmbeddedPostgres() as first, EmbeddedPostgres() as second:
        admins = [first.dsn(), second.dsn()]
        layouts = [(f"{2 * per}_{kind}", [[DATABASE]] * 2, per) if kind == "shards" else
                   (f"{2 * per}_{kind}", [[f"{DATABASE}_{i}" for i in range(per)]] * 2, None)
                   for per in (4, 32) for kind in ("databases", "shards")]
        for label, names, schemas in layouts:
            with _databases(admins, names) as servers:
                urls = [u for dbs in servers for u in dbs] if schemas is None else [
                    with_schema(dbs[0], f"c{i:02d}") for dbs in servers for i in range(schemas)]
                served = _serve(urls, servers, label.replace("_", " "))
            out.update({f"connections_per_worker_{label}": served["peak"],
                        f"connections_per_worker_{label}_idle": served["idle"],
                        f"connections_{label}_runs_per_s": served["rate"],
                        f"connections_{label}_wake_p50_ms": served["wake_p50_ms"],
                        f"connections_{label}_wake_p99_ms": served["wake_p99_ms"],
                        f"connections_{label}_wakes_late": served["wakes_late"]})
    for n in (8, 64):
        out[f"connections_{n}_wake_p99_schemas_over_databases"] = round(
            out[f"connections_{n}_shards_wake_p99_ms"]
            / out[f"connections_{n}_databases_wake_p99_ms"], 3)
    return out


@contextmanager
def _databases(admins: Sequence[str], names: Sequence[Sequence[str]]) -> Iterator[list[list[str]]]:
    """Fresh databases `names[i]` on server `admins[i]`, dropped on the way out."""
    made: list[tuple[str, str]] = []
    try:
        for admin, dbs in zip(admins, names, strict=True):
            with psycopg.connect(admin, autocommit=True) as conn:
                for name in dbs:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(name)))
                    made.append((admin, name))
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        yield [[database_url(admin, n) for n in dbs] for admin, dbs in zip(admins, names,
                                                                            strict=True)]
    finally:
        for admin, name in made:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))


def _serve(urls: list[str], servers: list[list[str]], label: str) -> dict[str, Any]:
    """The worker's peak sessions while it drains runs on every shard, its sessions once
    idle, the runs it drained a second, and signal -> resumed latency (its safety poll is
    60 s: a NOTIFY its LISTEN connection heard woke each)."""
    shard_map = ShardMap.from_urls(urls)
    migrate(shard_map)
    config = FleetConfig(workers=1, concurrency=16, batch_size=16, poll_interval=60.0,
                         env=(("SHARDQ_POOL_MIN", "1"), ("SHARDQ_POOL_MAX", str(POOL_MAX))))
    with Fleet(urls, config) as fleet, ShardPools(shard_map, application_name="bench") as pools, \
            _Sampler(servers) as sampler:
        _wait_serving(fleet)
        client = Client(Store(pools), registry)
        sampler.start()
        n = RUNS_PER_SHARD * len(urls)
        bar = Progress(f"{label}: one worker drains", n)
        started = time.monotonic()
        runs = [r.execution_id for chunk in range(0, n, 500) for r in client.start_many(
            "noop", [(f"c-{i}", None) for i in range(chunk, min(n, chunk + 500))])]
        for i, run in enumerate(runs):
            if client.wait(run, timeout=120).state is not State.COMPLETED:
                raise RuntimeError(f"run {run} did not complete: {fleet.tail()}")
            bar.update(i + 1)
        rate = n / (time.monotonic() - started)
        bar.close()
        peak = sampler.stop()
        time.sleep(2.0)  # idle: claim loops asleep on their wakes
        idle = sum(sampler.count())
        lags = _wakes(client, label)
        wake = percentiles(lags)
    return {"peak": peak, "idle": idle, "rate": round(rate, 1),
            "wake_p50_ms": round(wake["p50"], 2), "wake_p99_ms": round(wake["p99"], 2),
            "wakes_late": sum(1 for lag in lags if lag > LATE_MS)}


def _wakes(client: Client, label: str) -> list[float]:
    """Signal -> resumed milliseconds of WAKE_SAMPLES parked probes, one at a time."""
    probes = client.start_many("wake_probe", [(f"w-{i}", None) for i in range(WAKE_SAMPLES)])
    deadline = time.monotonic() + 60
    while any(client.get(p.execution_id).state is not State.WAITING for p in probes):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: the wake probes did not park")
        time.sleep(0.1)
    time.sleep(1.0)  # the claim loops asleep
    lags = []
    for probe in probes:
        sent = time.time()
        client.signal(probe.execution_id, WAKE_SIGNAL)
        # Past the 60 s safety poll: a wake-up no NOTIFY brought is counted, not fatal.
        output = client.wait(probe.execution_id, timeout=90, poll=0.005).output
        lags.append((output["resumed_at"] - sent) * 1000)
        time.sleep(0.02)
    return lags


def _wait_serving(fleet: Fleet, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all("serving" in log.read_text(errors="replace") for log in fleet.logs):
        fleet.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start: {fleet.tail()}")
        time.sleep(0.05)


class _Sampler:
    """The worker's sessions on every server, counted every SAMPLE_S; the peak kept."""

    def __init__(self, servers: list[list[str]]) -> None:
        """`servers`: the URLs of the databases on each server."""
        self._conns = [psycopg.connect(dbs[0], autocommit=True) for dbs in servers]
        self._names = [[str(conninfo_to_dict(u)["dbname"]) for u in dbs] for dbs in servers]
        self._stop = threading.Event()
        self._peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for conn in self._conns:
            conn.close()

    def start(self) -> None:
        self._thread.start()

    def count(self) -> list[int]:
        counts = []
        for conn, names in zip(self._conns, self._names, strict=True):
            row = conn.execute(SESSIONS, (names,)).fetchone()
            counts.append(int(row[0]) if row else 0)
        return counts

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._peak = max(self._peak, sum(self.count()))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self._peak
