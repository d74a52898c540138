"""Finding a run by its workflow key, or locking runs by id, reads those rows,
whatever the statistics and whenever the plan was made.

A start whose key already has a run, a signal-with-start of a running key and
`Client.find` look the key up in executions_workflow_key. On a shard whose tables
were never analyzed (a new deployment's first minute, CI's server without
autovacuum), the planner once read the listing index executions_workflow
(tenant, workflow_name, id) instead and filtered every run of the workflow for
each key: a ticker re-starting the 2,000 ticks of a killed worker's round stalled
for seconds. A delivery of signals locks its targets with plans its connection
made on its first calls: made on an empty shard, they scanned every run. These
tests count the rows such a statement reads, in its own transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from shardq.shards.config import ShardMap
from shardq.shards.connections import connect
from shardq.shards.migrations import migrate
from shardq.store import statements
from shardq.store.params import (
    NewRun,
    SignalDelivery,
    StartBatch,
    StartSignalled,
    placed_run,
)

from ..support import rows_read

RUNS = 3_000
"""Runs of the one workflow the shard holds: a scan of them per key would read
RUNS x keys rows."""
KEYS = 300


def _batch(keys: range) -> StartBatch:
    runs: list[NewRun] = [placed_run("default", "w", f"k{i}", "null", None) for i in keys]
    return StartBatch("default", "w", 1, runs)


@pytest.fixture
def unanalyzed(fresh_databases: Callable[[int], list[str]]) -> ShardMap:
    """A shard of RUNS runs of workflow `w` (keys k0...), its tables never analyzed."""
    shard_map = ShardMap.from_urls(fresh_databases(1))
    migrate(shard_map)
    with connect(shard_map.shards[0], autocommit=True) as conn:
        for first in range(0, RUNS, 1_000):
            statements.run(conn, statements.start_executions(_batch(range(first,
                                                                          first + 1_000))))
        (analyzed,) = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_user_tables WHERE relname = 'executions'"
            " AND coalesce(last_analyze, last_autoanalyze) IS NOT NULL").fetchall()
        assert analyzed["n"] == 0
    return shard_map


def test_a_start_of_existing_keys_reads_each_key_not_the_workflow(
        unanalyzed: ShardMap) -> None:
    shard = unanalyzed.shards[0]
    with connect(shard) as conn:
        ids = {r["workflow_id"]: r["id"] for r in conn.execute(
            "SELECT workflow_id, id FROM shardq.executions")}
    with connect(shard) as conn, conn.transaction():
        before = rows_read(conn)
        results = statements.run(conn, statements.start_executions(_batch(range(KEYS))))
        read = rows_read(conn) - before
    assert [r.created for r in results] == [False] * KEYS
    assert [r.execution_id for r in results] == [ids[f"k{i}"] for i in range(KEYS)]
    # A probe per key reads a few rows (its index entry, the run, its state); a scan
    # of the workflow per key would read RUNS x KEYS = 900,000.
    assert read < 20 * KEYS, read


def test_a_signal_with_start_of_a_running_key_reads_that_key(unanalyzed: ShardMap) -> None:
    shard = unanalyzed.shards[0]
    with connect(shard) as conn:
        (existing,) = conn.execute(
            "SELECT id FROM shardq.executions WHERE workflow_id = %s", [f"k{RUNS - 1}"]
        ).fetchall()
    # The newest key: a walk of the workflow's runs in id order finds it last.
    request = StartSignalled(_batch(range(RUNS - 1, RUNS)), "poke", '{"n": 1}', None)
    with connect(shard) as conn, conn.transaction():
        before = rows_read(conn)
        result = statements.run(conn, statements.signal_with_start(request))
        read = rows_read(conn) - before
    assert (result.execution_id, result.created, result.delivered) == (existing["id"], False,
                                                                       True)
    assert read < 50, read  # a probe reads about ten; the walk read the 3,000 runs


SIGNALS = 30


def test_a_delivery_locks_its_targets_by_key_with_plans_made_on_an_empty_shard(
        fresh_databases: Callable[[int], list[str]]) -> None:
    """deliver_signals (a client's or the relay's) locks its targets' rows, with plans
    a connection keeps from its first calls: made on an empty shard, they scanned
    every run for each delivery once the shard filled up."""
    shard_map = ShardMap.from_urls(fresh_databases(1))
    migrate(shard_map)
    nobody = [SignalDelivery(uuid.uuid4(), "poke", "{}", None)]
    with connect(shard_map.shards[0], autocommit=True) as conn:
        for _ in range(8):  # plans made now, and kept
            (refused,) = statements.run(conn, statements.deliver_signals("default", nobody))
            assert refused.error is not None
        for first in range(0, RUNS, 1_000):
            statements.run(conn, statements.start_executions(_batch(range(first,
                                                                          first + 1_000))))
        targets = [r["id"] for r in conn.execute(
            "SELECT id FROM shardq.executions ORDER BY workflow_id LIMIT %s", [SIGNALS])]
        with conn.transaction():
            before = rows_read(conn)
            results = statements.run(conn, statements.deliver_signals(
                "default", [SignalDelivery(t, "poke", '{"n": 1}', None) for t in targets]))
            read = rows_read(conn) - before
    assert [r.error for r in results] == [None] * SIGNALS
    # A probe per target reads its task, its run and what the delivery checks; a
    # scan reads all RUNS runs and their RUNS tasks.
    assert read < 20 * SIGNALS, read
