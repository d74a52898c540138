"""What every scenario shares: sizes, the shards, a client, the worker fleet, drains.

A drain is timed from a wall-clock instant the scenario picks (just before the
bulk insert, or the workers' spawn) to the finish time of the last run to
complete, read from the database after the poll saw the queue empty. Both
clocks are this machine's (workers and server run here), so the end is exact
to the commit rather than to the poll interval. The poll itself counts tasks
due or leased through the `tasks_due` index, which stays cheap beside a million
parked runs; the count of completed runs (`run.completed` events) is then checked once,
outside the timed window, and must equal the number started.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from shardq.benchmarks.db import BenchError, Poller, Shards, analyze_as_autovacuum, query
from shardq.benchmarks.dbcost import DbMeter, Instruments, probe
from shardq.benchmarks.fleet import Fleet, FleetConfig
from shardq.benchmarks.measure import CpuMeter, wait_for
from shardq.benchmarks.pyspy import summarize
from shardq.benchmarks.workflows import registry
from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for


@dataclass(frozen=True)
class Sizes:
    """How big each scenario runs; the defaults are the full suite."""

    claim_n: int = 20_000
    single_n: int = 1_000
    floor_rows: int = 200_000
    floor_seconds: float = 5.0
    floor_batches: tuple[int, ...] = (1, 10, 100)
    wake_samples: int = 500
    cycle_runs: int = 10_000
    signal_threads: int = 8
    signal_batch: int = 50
    steps3_backlogs: tuple[int, ...] = (2_000, 20_000)
    steps3_seconds: float = 10.0
    parked: int = 1_000_000
    parked_repeats: int = 5
    relay_signals: int = 4_000
    relay_samples: int = 200
    http_signals: int = 20_000
    limit_probes: int = 300
    flood_floor: int = 20_000
    limited_runs: int = 100_000
    limited_keys: int = 1_000
    violation_runs: int = 20_000
    violation_keys: int = 200
    fairness_runs: int = 30_000
    rated_runs: int = 2_000
    fanin_children: int = 10_000
    schedules: int = 60_000
    replay_runs: int = 100_000
    visibility_runs: int = 1_000_000
    visibility_pages: int = 60

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick(cls) -> Sizes:
        """Every scenario small: the whole suite in under a minute."""
        return cls(claim_n=3_000, single_n=200, floor_rows=30_000, floor_seconds=1.0,
                   wake_samples=200, cycle_runs=600, steps3_backlogs=(500, 2_000),
                   steps3_seconds=2.0, parked=100_000, parked_repeats=1,
                   relay_signals=600, relay_samples=60, http_signals=2_000,
                   limit_probes=100, flood_floor=3_000, limited_runs=10_000,
                   limited_keys=250, violation_runs=5_000, violation_keys=50,
                   fairness_runs=10_000, rated_runs=1_000, fanin_children=2_000, schedules=10_000,
                   replay_runs=10_000, visibility_runs=50_000)


@dataclass
class Bench:
    shards: Shards
    sizes: Sizes
    fleet_config: FleetConfig
    log: Callable[[str], None]
    pg_stat_statements: bool = False
    py_spy: Path | None = None
    client: Client = field(init=False)
    _fleet: Fleet | None = None
    _pgss_ok: bool | None = None
    _instruments: Instruments | None = None

    def __post_init__(self) -> None:
        pool_max = max(10, self.sizes.signal_threads + 4)
        self.client = Client.connect(ShardMap.from_urls(self.shards.urls, pool_max=pool_max),
                                     registry)

    @property
    def urls(self) -> list[str]:
        return self.shards.urls

    def close(self) -> None:
        self.stop_fleet()
        self.client.close()

    # -- workers ---------------------------------------------------------------

    def spawn_fleet(self, config: FleetConfig | None = None) -> Fleet:
        """Start (not wait for) a fresh fleet, replacing any running one."""
        self.stop_fleet()
        self._fleet = Fleet(self.urls, config or self.fleet_config).start()
        return self._fleet

    def fleet(self) -> Fleet:
        """The running standard fleet, started and awaited if there is none."""
        if self._fleet is None or self._fleet.config != self.fleet_config:
            self.spawn_fleet().wait_ready()
        assert self._fleet is not None
        self._fleet.check_alive()
        return self._fleet

    def stop_fleet(self) -> list[str]:
        """Stop the fleet; returns the warnings and errors its workers logged."""
        if self._fleet is None:
            return []
        errors = self._fleet.errors()
        self._fleet.stop()
        self._fleet = None
        return errors

    # -- state -----------------------------------------------------------------

    def keys_on(self, index: int, workflow: str, prefix: str, count: int) -> list[str]:
        """`count` workflow ids `<prefix>-<i>` whose runs of `workflow` live on shard
        `index`."""
        shard = self.client.map.shards[index]
        found = (k for k in (f"{prefix}-{i}" for i in itertools.count())
                 if self.client.map.for_bucket(bucket_for("default", workflow, k)) == shard)
        return list(itertools.islice(found, count))

    def reset(self, *, checkpoint: bool = False) -> None:
        """Empty the queue tables (no dead tuples carried over), optionally CHECKPOINT."""
        self.shards.truncate()
        if checkpoint:
            self.checkpoint()

    def vacuum(self) -> None:
        """Remove the dead rows earlier drains left (autovacuum may be off on the server)."""
        for url in self.urls:
            query(url, "vacuum_dead")

    def checkpoint(self) -> None:
        for url in self.urls:
            try:
                query(url, "checkpoint")
            except psycopg.Error as exc:  # not a superuser: say so, carry on
                self.log(f"CHECKPOINT refused ({exc.sqlstate}); results may include one")
                return

    # -- drains ----------------------------------------------------------------

    def wait_drained(self, total: int, label: str, *, timeout: float | None = None) -> float:
        """Poll until no task is due or leased; `total` only scales the bar. Monotonic end."""
        limit = timeout if timeout is not None else max(120.0, total / 100)
        with Poller(self.urls) as poller:
            return wait_for(lambda: total - poller.total("active_tasks"), total, label=label,
                            timeout=limit, interval=0.1)

    def finished(self, workflow: str, prefix: str, expected: int) -> float:
        """Check all `expected` runs completed; the epoch time the last one finished."""
        rows = [query(u, "drain_result", {"workflow": workflow, "prefix": prefix + "%"})[0]
                for u in self.urls]
        completed = sum(int(r["completed"]) for r in rows)
        failed = sum(int(r["failed"]) for r in rows)
        if completed != expected or failed:
            params = {"workflow": workflow, "prefix": prefix + "%"}
            sample = [r for u in self.urls for r in query(u, "failed_sample", params)][:3]
            raise BenchError(f"{prefix}: {completed} of {expected} completed, {failed} failed; "
                             f"e.g. {sample}")
        return max(float(r["last_finished"]) for r in rows if r["last_finished"] is not None)

    def timed_drain(self, workflow: str, prefix: str, items: list[tuple[str, Any]],
                    label: str, *, backlog: bool = False) -> dict[str, Any]:
        """Idle workers, `items` bulk-inserted in one start_many, timed until all complete.

        Workers first (the default), the window opens just before the insert and
        holds it, with the ANALYZE autovacuum would run after it. With `backlog`,
        the workers are frozen (SIGSTOP) through the insert and the ANALYZE and
        the window opens as they continue: it holds the drain alone, as the
        floors' windows do. `insert_s` is the start_many alone either way.
        """
        fleet = self.fleet()
        n = len(items)
        # The instruments attach first: py-spy takes half a second to.
        with self.statements() as top, self.profiled(fleet) as profile:
            with fleet.frozen() if backlog else contextlib.nullcontext():
                if not backlog:
                    db = self.db_meter().start()
                    meter, t0 = CpuMeter(fleet.pids).start(), time.time()
                t = time.time()
                self.client.start_many(workflow, items)
                inserted = time.time() - t
                # Statistics, as autovacuum keeps them on a live queue.
                for url in self.urls:
                    analyze_as_autovacuum(url, n / len(self.urls))
                if backlog:
                    db = self.db_meter().start()
                    meter, t0 = CpuMeter(fleet.pids).start(), time.time()
            self.wait_drained(n, label)
            cpu = meter.stop(n)
            cost = db.stop(n)
        end = self.finished(workflow, prefix, n)
        seconds = end - t0
        return {
            "jobs": n, "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds, 1),
            "insert_s": round(inserted, 3), "cpu": cpu, **cost, **top, **profile,
        }

    # -- optional instruments --------------------------------------------------

    def instruments(self) -> Instruments:
        """What the servers let the database meter read (asked once; says what is missing)."""
        if self._instruments is None:
            self._instruments = probe(self.urls, self.log)
        return self._instruments

    def db_meter(self) -> DbMeter:
        """A meter of the database's cost per job: WAL always, per statement where loaded."""
        return DbMeter(self.urls, self.instruments())

    @contextmanager
    def statements(self) -> Iterator[dict[str, Any]]:
        """With --pg-stat-statements: the top statements by time of the block, per shard 0."""
        out: dict[str, Any] = {}
        if not self.pg_stat_statements or not self._pgss_ready():
            yield out
            return
        for url in self.urls:
            query(url, "stat_statements_reset")
        yield out
        out["statements"] = query(self.urls[0], "stat_statements_top", {"limit": 12})

    def _pgss_ready(self) -> bool:
        if self._pgss_ok is None:
            preload = str(self.shards.facts()["shared_preload_libraries"])
            self._pgss_ok = "pg_stat_statements" in preload
            if self._pgss_ok:
                for url in self.urls:
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            else:
                self.log("--pg-stat-statements: the server does not preload pg_stat_statements;"
                         " skipped")
        return self._pgss_ok

    @contextmanager
    def profiled(self, fleet: Fleet) -> Iterator[dict[str, Any]]:
        """With --py-spy DIR: sample the GIL holder of every worker through the block.

        Raw collapsed stacks land in DIR, their summary in the result. py-spy pauses
        the process for each sample: the throughput of a profiled run is not to be quoted.
        """
        out: dict[str, Any] = {}
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if self.py_spy is None:
            yield out
            return
        if not Path(spy).exists():
            self.log("--py-spy: py-spy is not installed (pip install py-spy); skipped")
            yield out
            return
        self.py_spy.mkdir(parents=True, exist_ok=True)
        procs, files = [], []
        for pid in fleet.pids:
            target = self.py_spy / f"worker-{pid}.txt"
            procs.append(subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
                 "--gil", "-o", str(target)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
            files.append(str(target))
        time.sleep(0.5)  # let py-spy attach before the measured work starts
        try:
            yield out
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
            out["py_spy_raw"] = files
            out["py_spy"] = summarize(Path(f) for f in files if Path(f).exists())

