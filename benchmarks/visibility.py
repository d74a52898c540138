"""The `visibility` scenario: what a page of `Client.list_runs` costs beside a million
runs a shard (issue 40, docs/design/visibility.md).

A listing must cost O(page): a page of 100 runs reads about 100 index entries a
shard, however many runs the shards hold and however rare the filter, and a
filter that matches nothing reads one index descent. The queue's own shards are
too small to show the difference, so the scenario makes its own: eight databases
`visbench_8_0..7` forming one 8-shard map and one `visbench_1_0` forming a
1-shard map, on the server the suite creates its shards on, migrated by
`shardq.shards.migrations.migrate`. Each is loaded with `visibility_runs` runs
(1,000,000 at full size, 50,000 with --quick) by the `visibility_load` statement
(benchmarks/queries.sql), `LOAD_CHUNK` runs a statement, two shards at once, the
runs' ids spread over the last `SPAN` (30 days) and routed to the shard's own
buckets; each database is then VACUUMed and ANALYZEd. `MIX` is what the
statement makes. `visibility_load_s` is the load and the VACUUM, all nine databases.

`list_page_p50_ms_<kind>`, `list_page_p99_ms_<kind>`: one `Client.list_runs`
call of `PAGE` runs on the 8-shard client, timed on the client side, for each
filter kind of `KINDS` (`window` is a one-day window ten days back), over
`visibility_pages` calls (60) after `WARMUP` untimed ones. The calls cycle over
`CURSORS`: a first page, the page after it (its `next_cursor`), a page after a
position anywhere in the loaded span (the window, for `window`: an id cursor
as a page ending there would give) and the page after that one. So the rare
filters are read past their first page, and the common ones deep in the index,
out of the buffer cache, as a reader paging back to last week reads them.
`list_page_p99_ms` (target <= 50) is the worst kind's p99.

`list_page_over_single_shard` (target <= 2): for each kind that lists runs, its
median page on the 8-shard client over the median of the same calls (same
cursors) on the 1-shard client, whose shard holds as many runs as each of the
eight (`ratio_by_kind`); the key is the median of those ratios, so one kind
measured on a cold cache does not make the figure. What asking eight shards at
once and merging their pages costs over asking one.

`count_by_state_ms` (target <= 100): the p99 of `Client.count_runs()` (the default
tenant's runs per workflow and state) over `visibility_pages` calls on the 8-shard
client; `count_by_workflow_ms` the same for one workflow; `count_by_attribute_ms`
for one search attribute's value (`region=rare`: a count that reads its matches,
about 2,500 runs a shard at full size); `_p50_ms` their medians.
Its first answer must equal a `count(*)` of the loaded rows. The load's starts and
ends reach the counters as any writer's do (the tables' statement triggers), as
changes no worker has folded: a count reads them all, a chunk a row.

`visibility_seq_scans` (target 0): sequential scans PostgreSQL counted
(pg_stat_user_tables) on shardq's tables in the nine databases over the
measurement, load excluded. A backend reports its counters at most once a
second and otherwise ten seconds after going idle, so the clients are closed
(their backends report as they exit) and the scenario waits for their
backends to be gone before reading. The tables of `CONFIG_TABLES` (the map,
the shard's identity and ownership: a row or a few a shard, read whole by
design: every page reads `ownership` once a shard through
`shardq.holds_exactly`) are left out of the total and counted apart, in
`visibility_config_seq_scans`; `visibility_seq_scans_by_table` has them all.

The databases are dropped at the end, also on error.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from shardq.benchmarks.bench import Bench
from shardq.benchmarks.db import ENV_DSN, BenchError, query
from shardq.benchmarks.measure import Progress, percentiles
from shardq.benchmarks.workflows import registry
from shardq.client.client import Client
from shardq.core.models import Execution, State
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate
from shardq.shards.servers import LOCAL_DSN, database_url
from shardq.store.listing import Cursor, id_floor

PREFIX = "visbench_"
SHARD_COUNTS = (8, 1)
"""The two maps: `visbench_8_0..7` and `visbench_1_0`."""
LOAD_CHUNK = 250_000
LOAD_THREADS = 2
SPAN = timedelta(days=30)
"""The runs' creation times: evenly over the last 30 days."""
WINDOW_AGO, WINDOW = timedelta(days=10), timedelta(days=1)
PAGE = 100
WARMUP = 5
SEED = 40

MIX: dict[str, dict[str, float]] = {
    "tenant": {"default": 96 / 97, "rare-tenant": 1 / 97},
    "workflow": {"orders": 2 / 3, "billing": 1 / 3, "rare_workflow": 1 / 1009},
    "state": {"completed": 0.95, "failed": 0.02, "cancelled": 0.01, "waiting": 0.01,
              "pending": 0.01},
    "region": {"north": 1 / 16, "south": 1 / 16, "east": 1 / 16, "west": 1 / 16,
               "rare": 1 / 404},
    "amount >= 996": {"yes": 1 / 1000},
}
"""The shares `visibility_load` gives each value (the i-th run of a load is
`rare-tenant` when i % 97 == 0, `rare_workflow` when i % 1009 == 1, else
`billing` when i % 3 == 0, `failed` when i % 50 == 7, ...): failed runs of
`rare_workflow` are 1 in 50,450. Every fourth run has search attributes: `region`
(`rare` when i % 404 == 0) and `amount` (i % 1000)."""

KINDS: dict[str, dict[str, Any]] = {
    "none": {},
    "tenant": {"tenant": "rare-tenant"},
    "workflow": {"workflow": "rare_workflow"},
    "state": {"state": State.FAILED},
    "state_workflow": {"state": State.FAILED, "workflow": "rare_workflow"},
    "live_state": {"state": State.WAITING},
    "window": {},  # created_after, created_before: set from the load's clock
    "attribute": {"where": {"region": "rare"}},
    "attribute_range": {"where": ["amount>=996"]},
    "empty": {"workflow": "no_such_workflow"},
}
"""The filters of each kind, as `Client.list_runs` takes them; the tenant is the
client's default (`default`) unless given."""

CURSORS = ("first", "next", "position", "next")
"""Where the calls of a kind start, in turn: see the module docstring."""

CONFIG_TABLES = frozenset({"ownership", "shard_identity", "shard_maps", "schema_migrations",
                           "schema_functions", "moves", "move_batches", "applied_batches"})
"""Tables of a row or a few a shard, whatever it holds, read whole by design."""
QUIESCE_S = 15.0
"""How long the closed clients' backends may take to exit (and report)."""


def visibility(b: Bench) -> dict[str, Any]:
    b.stop_fleet()  # idle workers polling the suite's shards: no part of a page's cost
    admin = b.shards.admin_dsn or _env_dsn()
    n = b.sizes.visibility_runs
    with _databases(admin) as maps:
        now = datetime.now(UTC)
        load_s = _load(maps, n, now)
        pages = b.sizes.visibility_pages
        with contextlib.ExitStack() as clients:
            eight, one = (clients.enter_context(Client.connect(ShardMap.from_urls(m), registry))
                          for m in maps)
            before = _seq_scans(_urls(maps))
            measured = _measure(eight, pages, now, f"{len(maps[0])} shards")
            single = _measure(one, pages, now, "1 shard")
        _quiesce(admin, _names(maps))
        after = _seq_scans(_urls(maps))
        # After the scans are read: a count reads the live rows whole, by design.
        with Client.connect(ShardMap.from_urls(maps[0]), registry) as eight:
            counted = _counts(eight, pages, maps[0])
    by_table = {t: after.get(t, 0) - before.get(t, 0) for t in sorted(after)
                if after.get(t, 0) != before.get(t, 0)}
    p99s = {k: m["ms"]["p99"] for k, m in measured.items()}
    ratios = {k: round(m["ms"]["p50"] / single[k]["ms"]["p50"], 3)
              for k, m in measured.items() if k != "empty"}
    flat: dict[str, Any] = {}
    for kind, m in measured.items():
        flat[f"list_page_p99_ms_{kind}"] = m["ms"]["p99"]
        flat[f"list_page_p50_ms_{kind}"] = m["ms"]["p50"]
    return {
        "visibility_runs_per_shard": n,
        "visibility_shards": SHARD_COUNTS[0],
        "visibility_load_s": round(load_s, 1),
        "visibility_pages_per_kind": pages,
        "list_page_p99_ms": max(p99s.values()),
        "list_page_worst_kind": max(p99s, key=lambda k: p99s[k]),
        **flat,
        "list_page_over_single_shard": statistics.median(ratios.values()),
        "ratio_by_kind": ratios,
        **counted,
        "visibility_seq_scans": sum(v for t, v in by_table.items() if t not in CONFIG_TABLES),
        "visibility_config_seq_scans": sum(v for t, v in by_table.items()
                                           if t in CONFIG_TABLES),
        "visibility_seq_scans_by_table": by_table,
        "pages": measured,
        "single_shard": single,
        "window": {"created_after": _window(now)["created_after"].isoformat(),
                   "created_before": _window(now)["created_before"].isoformat()},
    }


# -- the databases ----------------------------------------------------------------


def _env_dsn() -> str:
    """The server the suite would create its shards on (it was given its shards)."""
    return os.environ.get(ENV_DSN) or LOCAL_DSN


@contextmanager
def _databases(admin: str) -> Iterator[list[list[str]]]:
    """The maps' URLs, their databases created and migrated; all dropped on the way out."""
    names = [[f"{PREFIX}{count}_{i}" for i in range(count)] for count in SHARD_COUNTS]
    made: list[str] = []
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in (n for group in names for n in group):
                _drop(conn, name)  # one an interrupted run left
                made.append(name)  # noted first: a CREATE the server ran is dropped
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        maps = [[database_url(admin, n) for n in group] for group in names]
        for urls in maps:
            migrate(ShardMap.from_urls(urls))
        yield maps
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in made:
                _drop(conn, name)


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _urls(maps: Sequence[Sequence[str]]) -> list[str]:
    return [u for urls in maps for u in urls]


def _names(maps: Sequence[Sequence[str]]) -> list[str]:
    return [f"{PREFIX}{len(urls)}_{i}" for urls in maps for i in range(len(urls))]


# -- the load ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Chunk:
    url: str
    buckets: list[int]
    n: int
    first_ms: int
    span_ms: int
    salt: int


def _chunks(maps: Sequence[Sequence[str]], n: int, now: datetime) -> list[_Chunk]:
    """Every load statement: each shard's `n` runs in LOAD_CHUNK slices of the span."""
    end_ms = int(now.timestamp() * 1000)
    span_ms = int(SPAN.total_seconds() * 1000)
    slices = math.ceil(n / LOAD_CHUNK)
    out = []
    for urls in maps:
        shard_map = ShardMap.from_urls(urls)
        for shard in shard_map.shards:
            buckets = [b for low, high in shard.ranges for b in range(low, high + 1)]
            for s in range(slices):
                size = n // slices + (1 if s < n % slices else 0)
                first = end_ms - span_ms + s * span_ms // slices
                out.append(_Chunk(shard.url, buckets, size, first,
                                  end_ms - span_ms + (s + 1) * span_ms // slices - first, s))
    # Shard by shard across the maps: the two threads load different databases.
    return sorted(out, key=lambda c: (c.salt, c.url))


def _load(maps: Sequence[Sequence[str]], n: int, now: datetime) -> float:
    chunks = _chunks(maps, n, now)
    total = sum(c.n for c in chunks)
    bar = Progress("visibility load", total, unit=" runs")
    done = 0
    lock = threading.Lock()

    def one(chunk: _Chunk) -> None:
        nonlocal done
        query(chunk.url, "visibility_load", {
            "n": chunk.n, "first_ms": chunk.first_ms, "span_ms": chunk.span_ms,
            "buckets": chunk.buckets, "salt": chunk.salt})
        with lock:
            done += chunk.n
            bar.update(done)

    started = time.monotonic()
    with ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="visbench-load") as pool:
        list(pool.map(one, chunks))
        list(pool.map(_analyze, _urls(maps)))
    bar.close()
    return time.monotonic() - started


def _analyze(url: str) -> None:
    # VACUUM too: the state autovacuum leaves insert-only tables in (PostgreSQL 13+
    # vacuums them for their inserts), their pages all-visible for index-only scans,
    # whether or not the server running the benchmark has autovacuum on.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


# -- the pages --------------------------------------------------------------------


def _window(now: datetime) -> dict[str, datetime]:
    return {"created_after": now - WINDOW_AGO, "created_before": now - WINDOW_AGO + WINDOW}


def _measure(client: Client, pages: int, now: datetime, label: str) -> dict[str, Any]:
    """Every kind's pages on `client`: percentiles of the call's ms, rows a page."""
    bar = Progress(f"visibility pages ({label})", len(KINDS) * (WARMUP + pages))
    out: dict[str, Any] = {}
    for index, kind in enumerate(KINDS):
        filters = _window(now) if kind == "window" else KINDS[kind]
        offset = index * (WARMUP + pages)

        def progress(done: int, offset: int = offset) -> None:
            bar.update(offset + done)

        times, rows = _pages(client, kind, filters, pages=pages, now=now, progress=progress)
        ms = percentiles(times)
        out[kind] = {"ms": {k: round(v, 2) for k, v in ms.items()}, "pages": len(times),
                     "rows_per_page": round(statistics.mean(rows), 1),
                     "full_pages": sum(1 for r in rows if r == PAGE)}
    bar.close()
    return out


def _pages(client: Client, kind: str, filters: dict[str, Any], *, pages: int, now: datetime,
           progress: Callable[[int], None]) -> tuple[list[float], list[int]]:
    """`WARMUP` + `pages` calls cycling over CURSORS; the timed calls' ms and rows."""
    rng = random.Random(f"{SEED}-{kind}")  # the same cursors on either client
    low, high = ((filters["created_after"], filters["created_before"]) if kind == "window"
                 else (now - SPAN, now))
    times: list[float] = []
    rows: list[int] = []
    cursor: str | None = None
    for i in range(WARMUP + pages):
        start = CURSORS[i % len(CURSORS)]
        if start == "first":
            cursor = None
        elif start == "position":
            cursor = Cursor(id_floor(low + (high - low) * rng.random())).encode()
        # "next": the previous call's next_cursor (None after a last page: a first page)
        t = time.perf_counter()
        page = client.list_runs(limit=PAGE, cursor=cursor, **filters)
        elapsed = 1000 * (time.perf_counter() - t)
        _check(kind, filters, page.items)
        if i >= WARMUP:
            times.append(elapsed)
            rows.append(len(page.items))
        cursor = page.next_cursor
        progress(i + 1)
    if kind != "empty" and not any(rows):
        raise BenchError(f"visibility: the {kind} pages listed no run: the load went wrong")
    return times, rows


def _check(kind: str, filters: dict[str, Any], items: list[Execution]) -> None:
    """Every run of a page matches its filter, in id order (a wrong page is no timing)."""
    tenant = filters.get("tenant", "default")
    for run in items:
        wrong = (run.tenant != tenant
                 or ("workflow" in filters and run.workflow_name != filters["workflow"])
                 or ("state" in filters and run.state is not filters["state"])
                 or ("where" in filters and not _attributed(filters["where"], run))
                 or ("created_after" in filters
                     and not filters["created_after"] - timedelta(milliseconds=1)
                     <= run.created_at < filters["created_before"]))
        if wrong:
            raise BenchError(f"visibility: a {kind} page listed {run.id} ({run.tenant}, "
                             f"{run.workflow_name}, {run.state}, {run.created_at}) for "
                             f"{filters}")
    if any(a.id >= b.id for a, b in itertools.pairwise(items)):
        raise BenchError(f"visibility: a {kind} page is not in id order")


def _attributed(where: Any, run: Execution) -> bool:
    """Whether `run`'s attributes meet KINDS' filters (an equality, or `name>=number`)."""
    if isinstance(where, dict):
        return all(run.attributes.get(k) == v for k, v in where.items())
    name, value = where[0].split(">=")
    return float(run.attributes.get(name, -math.inf)) >= float(value)


# -- counts -----------------------------------------------------------------------


def _counts(client: Client, calls: int, urls: Sequence[str]) -> dict[str, Any]:
    """`Client.count_runs` of the default tenant, every workflow and then one, timed as
    the pages are; the first answer checked against a count of the rows themselves."""
    out: dict[str, Any] = {}
    bar = Progress("visibility counts", 3 * (WARMUP + calls))
    kinds: tuple[tuple[str, dict[str, Any]], ...] = (
        ("count_by_state", {}), ("count_by_workflow", {"workflow": "orders"}),
        ("count_by_attribute", {"where": {"region": "rare"}}))
    for n, (key, filters) in enumerate(kinds):
        times = []
        for i in range(WARMUP + calls):
            t = time.perf_counter()
            counts = client.count_runs(**filters)
            if i >= WARMUP:
                times.append(1000 * (time.perf_counter() - t))
            bar.update(n * (WARMUP + calls) + i + 1)
        if not filters:
            rows = sum(query(url, "visibility_default_runs")[0]["n"] for url in urls)
            if counts.total != rows or min(counts.by_state.values()) < 0:
                raise BenchError(f"visibility: count_runs said {counts.total} runs "
                                 f"({counts.by_state}), the shards hold {rows}")
        ms = percentiles(times)
        out[f"{key}_ms"], out[f"{key}_p50_ms"] = round(ms["p99"], 2), round(ms["p50"], 2)
    bar.close()
    return out


# -- sequential scans -------------------------------------------------------------


def _seq_scans(urls: Sequence[str]) -> dict[str, int]:
    """seq_scan of every shardq table, summed over the databases, as reported so far."""
    totals: dict[str, int] = {}
    for url in urls:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            for row in conn.execute("SELECT relname, seq_scan FROM pg_stat_user_tables "
                                    "WHERE schemaname = 'shardq'"):
                totals[row["relname"]] = totals.get(row["relname"], 0) + int(row["seq_scan"])
    return totals


def _quiesce(admin: str, names: Sequence[str]) -> None:
    """Wait until no backend but ours is connected to the databases: every closed
    connection's backend has exited, and reported its counters as it did."""
    deadline = time.monotonic() + QUIESCE_S
    with psycopg.connect(admin, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s)",
                               (list(names),)).fetchone()
            if row is None or row[0] == 0:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"visibility: {row[0]} backends still connected "
                                 f"{QUIESCE_S:g} s after the clients closed")
            time.sleep(0.1)
