"""Where the benchmark runs: shard databases it creates (and drops), or ones it is given.

Without `--shards` / SHARDQ_SHARDS the suite creates uniquely named databases on
the server at SHARDQ_BENCH_DSN, else the local server on 127.0.0.1:5432, else an
embedded throw-away server, migrates them and drops them at the end. Given
shards are migrated and must hold no executions (the suite truncates the queue
tables between scenarios), unless `--wipe` allows it to empty them.
"""

from __future__ import annotations

import hashlib
import os
import platform
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from shardq.benchmarks.measure import percentiles
from shardq.shards.config import ShardMap
from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.migrations import migrate
from shardq.shards.servers import LOCAL_DSN, answers, database_url
from shardq.shards.sqlfile import load_queries

SQL = load_queries("shardq.benchmarks", "queries.sql")
ENV_DSN = "SHARDQ_BENCH_DSN"
ENV_SHARDS = "SHARDQ_SHARDS"
TRUNCATE_ATTEMPTS = 5
Row = dict[str, Any]


class BenchError(RuntimeError):
    """The benchmark cannot run as asked (no server, shards not empty, a worker died...)."""


def query(url: str, name: str, params: dict[str, Any] | None = None) -> list[Row]:
    """Run one named statement in its own autocommit connection; rows as dicts."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(SQL[name], params or {})
        return cur.fetchall() if cur.description else []


QUEUE_TABLES = ("executions", "tasks", "waits", "history")
"""The tables a drain fills: what analyze_as_autovacuum looks at."""


def analyze_as_autovacuum(url: str, changed_rows: float) -> list[str]:
    """ANALYZE the queue tables autovacuum would analyze after `changed_rows` new rows.

    Its rule: more changed rows than threshold + scale factor x rows. A fresh
    table of a few thousand rows would otherwise plan as sequential scans,
    while re-analyzing a million-row table after each drain would charge the
    drain for work autovacuum would not do. Returns the tables analyzed.
    """
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        return _analyze_stale(conn, QUEUE_TABLES, changed_rows)


def _analyze_stale(conn: psycopg.Connection[Row], tables: Sequence[str],
                   changed_rows: float | None) -> list[str]:
    """ANALYZE those of `tables` past autovacuum's trigger, by `changed_rows` each or
    (None) by the rows PostgreSQL counted as changed since their last ANALYZE."""
    stale = [r["name"] for r in conn.execute(SQL["analyze_rules"], {"tables": list(tables)})
             if (r["changed"] if changed_rows is None else changed_rows)
             > r["threshold"] + r["scale"] * r["reltuples"]]
    if stale:
        conn.execute(sql.SQL("ANALYZE {}").format(
            sql.SQL(", ").join(sql.Identifier("shardq", name) for name in stale)
        ))
    return stale


class Autoanalyze:
    """ANALYZE, every `interval_s` while it runs, the queue tables autovacuum's
    trigger would pick by the rows changed since their last ANALYZE: a long
    scenario's stand-in for the autovacuum a live deployment runs, which CI's
    server has turned off.

    Without it the statistics are those of the tables as a scenario found them
    (just truncated), and a shard filled meanwhile plans as if it were empty.
    """

    TABLES = (*QUEUE_TABLES, "signals", "outbox")

    def __init__(self, urls: Sequence[str], interval_s: float = 2.0) -> None:
        self.urls = list(urls)
        self.interval_s = interval_s
        self.analyzed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-autoanalyze",
                                        daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for url in self.urls:
                with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
                    self.analyzed += len(_analyze_stale(conn, self.TABLES, None))

    def __enter__(self) -> Autoanalyze:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


class Poller:
    """One open autocommit connection per shard for the tight progress polls."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._conns = [
            psycopg.connect(u, autocommit=True, row_factory=dict_row,
                            application_name="shardq-bench")
            for u in urls
        ]

    def each(self, name: str, params: dict[str, Any] | None = None) -> list[list[Row]]:
        return [c.execute(SQL[name], params or {}).fetchall() for c in self._conns]

    def total(self, name: str, params: dict[str, Any] | None = None) -> int:
        """The sum over the shards of the query's one `n`."""
        return sum(int(rows[0]["n"]) for rows in self.each(name, params))

    def close(self) -> None:
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> Poller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Shards:
    """The shard databases of one benchmark run, and how to put them back."""

    urls: list[str]
    source: str
    """Where they came from: `given`, `server <dsn>` or `embedded`."""
    admin_dsn: str | None = None
    created: list[str] = field(default_factory=list)
    embedded: EmbeddedPostgres | None = None
    emptied: bool = False
    """Set once the shards were found empty (or wiped): only then may drop() empty them."""

    @property
    def map(self) -> ShardMap:
        return ShardMap.from_urls(self.urls)

    def truncate(self) -> None:
        for url in self.urls:
            for attempt in range(TRUNCATE_ATTEMPTS):
                try:
                    query(url, "truncate_queue")
                    break
                except psycopg.errors.DeadlockDetected:
                    # A scenario's last workers may still hold their locks
                    # (seen once at load 8.8, under steps3).
                    if attempt == TRUNCATE_ATTEMPTS - 1:
                        raise
                    time.sleep(0.2 * (attempt + 1))

    def facts(self) -> Row:
        rows = query(self.urls[0], "server_facts")
        return rows[0]

    def drop(self) -> None:
        """Drop what we created (empty given shards, drop the floor's schema); stop a server."""
        try:
            if self.admin_dsn is not None and self.created:
                with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                    for name in self.created:
                        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                            sql.Identifier(name)))
                self.created = []
            elif self.source == "given" and self.emptied:
                # They were empty when we started (or --wipe said so): leave them empty.
                self.truncate()
                for url in self.urls:
                    query(url, "floor_drop")
        finally:
            if self.embedded is not None:
                self.embedded.stop()
                self.embedded = None


def provision(given: Sequence[str], *, count: int, wipe: bool, log: Any) -> Shards:
    """Shard databases for this run, migrated and empty."""
    shards = Shards(list(given), "given") if given else _create(count, log)
    try:
        migrate(shards.map)
        for url in shards.urls:
            if query(url, "has_executions")[0]["any"] and not wipe:
                raise BenchError(
                    "a given shard already holds executions; the benchmark truncates the "
                    "queue tables between scenarios: use empty shard databases, or pass "
                    "--wipe to let it empty them"
                )
        shards.truncate()
        shards.emptied = True
    except BaseException:
        shards.drop()
        raise
    return shards


def _create(count: int, log: Any) -> Shards:
    explicit = os.environ.get(ENV_DSN)
    embedded: EmbeddedPostgres | None = None
    if explicit:
        dsn, source = explicit, f"server {ENV_DSN}"
    elif answers(LOCAL_DSN):
        dsn, source = LOCAL_DSN, "server 127.0.0.1:5432"
    else:
        log("no server at 127.0.0.1:5432; starting an embedded PostgreSQL (fsync off!)")
        embedded = EmbeddedPostgres().start()
        dsn, source = embedded.dsn("postgres"), "embedded"
    shards = Shards([], source, admin_dsn=dsn, embedded=embedded)
    prefix = f"shardq_bench_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(count):
                name = f"{prefix}_s{i}"
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                shards.created.append(name)
                shards.urls.append(database_url(dsn, name))
    except BaseException:
        shards.drop()
        raise
    return shards


def commit_latency(url: str, samples: int = 200) -> Row:
    """Sequential one-row autocommit INSERTs: what one durable commit costs on this server.

    Any single-threaded path (a signal's commit, then the woken run's commits) pays this
    at least once per commit; it is the floor under the wake latency.
    """
    query(url, "floor_schema")
    query(url, "commit_probe_create")
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        statement = SQL["commit_probe"]
        for _ in range(samples):
            t = time.perf_counter()
            conn.execute(statement, prepare=True)
            times.append(1000 * (time.perf_counter() - t))
    stats = percentiles(times)
    return {"samples": samples, "p50_ms": round(stats["p50"], 3),
            "p99_ms": round(stats["p99"], 3), "mean_ms": round(stats["mean"], 3)}


ENGINE_DIRS = ("core", "workflow", "client", "worker", "store", "schema", "shards", "bin",
               "outbox", "moves")


def _git(root: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=5, check=False).stdout.rstrip()
    except OSError:
        return ""


def engine_fingerprint(root: Path) -> str:
    """A digest of the engine's source as it is on disk (the commit alone misses edits)."""
    digest = hashlib.sha256()
    for folder in ENGINE_DIRS:
        for path in sorted((root / folder).glob("*")):
            if path.suffix in (".py", ".sql") and path.is_file():
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def machine_facts() -> Row:
    """Cores, Python, OS, the code's commit and local edits: stated beside every result."""
    root = Path(__file__).resolve().parent.parent
    commit = _git(root, "rev-parse", "--short", "HEAD").strip()
    status = _git(root, "status", "--porcelain", "--", *ENGINE_DIRS)
    return {
        "engine_fingerprint": engine_fingerprint(root),
        "engine_files_modified": [line[3:] for line in status.splitlines() if line.strip()],
        "cores": os.cpu_count(),
        "cpu_model": _proc_field("/proc/cpuinfo", "model name"),
        "memory_gib": _memory_gib(),
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "executable": sys.executable,
        "commit": commit or None,
    }


def _proc_field(path: str, key: str) -> str | None:
    """The first `key: value` line of a /proc file, or None off Linux."""
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def _memory_gib() -> float | None:
    total = _proc_field("/proc/meminfo", "MemTotal")  # "24576000 kB"
    return round(int(total.split()[0]) / 2**20, 1) if total else None
