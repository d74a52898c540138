"""Reads of many runs while a batch of buckets is on two shards: each run counted once.

Between a move's switch and its source's cleanup, a moved run's rows are on its source
and its target. A reader passes each shard the buckets its own map version gives that
shard, so whichever version it holds, listing, the inbox, the exporter's counts and
`shardq stale` read the run on one shard only. The state is made by hand here: a run
of bucket 2047 (the last of shard-0 in a two-shard map) copied to shard-1, which owns
the bucket now, and the source not cleaned up yet.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shardq.core.models import StaleBounds
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.shards.routing import new_execution_id
from shardq.store import listing
from shardq.store.params import NewRun, StartBatch
from shardq.store.store import Store

from ..support import rows

BUCKET = 2047
TABLES = ("executions", "tasks", "waits")


def _map(shard_map: ShardMap, last_of_first: int) -> ShardMap:
    first, second = shard_map.shards[:2]
    return ShardMap.from_document({"shards": [
        {"name": first.name, "url": first.url, "buckets": [0, last_of_first]},
        {"name": second.name, "url": second.url, "buckets": [last_of_first + 1, 4095]},
    ]})


@pytest.fixture
def moved_run(shard_map: ShardMap) -> Iterator[uuid.UUID]:
    """A run parked on an interrupt, on both shards, owned by the second."""
    if len(shard_map.shards) != 2 or shard_map.for_bucket(BUCKET).name != "shard-0":
        pytest.skip("needs the suite's two-shard map")
    source, target = (s.url for s in shard_map.shards)
    saved = {url: rows(url, "SELECT writable::text, owned::text FROM shardq.ownership")[0]
             for url in (source, target)}
    with ShardPools(shard_map) as pools:
        run = new_execution_id(BUCKET)
        Store(pools).start_executions(shard_map.shards[0], StartBatch(
            "default", "reads", 1, [NewRun(run, "reads-1", "null", BUCKET)]))
    rows(source, "DELETE FROM shardq.tasks WHERE execution_id = %s RETURNING 1", run)
    rows(source, "INSERT INTO shardq.waits (execution_id, position, kind, name, deadline, "
                 "request, started_at) VALUES (%s, 0, 'interrupt', 'approve', NULL, "
                 "'{\"prompt\": \"ok?\", \"actions\": [\"approve\"]}', now() - interval '2 days')"
                 " RETURNING 1", run)
    with psycopg.connect(source) as src, psycopg.connect(target) as dst:
        for table in TABLES:
            key = "id" if table == "executions" else "execution_id"
            with src.cursor().copy(
                    f"COPY (SELECT * FROM shardq.{table} WHERE {key} = '{run}') TO STDOUT"
            ) as out, dst.cursor().copy(f"COPY shardq.{table} FROM STDIN") as into:
                for chunk in out:
                    into.write(chunk)
    rows(source, "UPDATE shardq.ownership SET writable = set_bit(writable, %s, 0), "
                 "owned = set_bit(owned, %s, 0), unclean = true RETURNING 1", BUCKET, BUCKET)
    rows(target, "UPDATE shardq.ownership SET writable = set_bit(writable, %s, 1), "
                 "owned = set_bit(owned, %s, 1) RETURNING 1", BUCKET, BUCKET)
    yield run
    for url, (writable, owned) in saved.items():
        rows(url, "UPDATE shardq.ownership SET writable = %s::bit(4096), owned = %s::bit(4096),"
                  " unclean = false RETURNING 1", writable, owned)


def _verified(_map: ShardMap, _shard: Any) -> None:
    """Maps made for the test are not the one the shards were migrated with."""


@pytest.mark.parametrize("version", ["before the switch", "after the switch"])
def test_a_run_on_two_shards_is_read_once_by_every_map_version(
    shard_map: ShardMap, moved_run: uuid.UUID, version: str
) -> None:
    reader_map = _map(shard_map, BUCKET if version == "before the switch" else BUCKET - 1)
    owner = reader_map.for_bucket(BUCKET).name
    for shard in shard_map.shards:  # both hold it: a read without `mine` counts it twice
        assert rows(shard.url, "SELECT count(*) FROM shardq.executions WHERE id = %s",
                    moved_run) == [(1,)]
    bounds = StaleBounds(timer_s=60, signal_s=60, condition_s=60, interrupt_s=60, grace_s=0)
    with ShardPools(reader_map, verify=_verified) as pools:
        store = Store(pools)
        listed = {s.name: [e.id for e in store.list_executions(s, listing.ListQuery()).runs]
                  for s in reader_map.shards}
        inbox = {s.name: [p.execution_id for p in store.pending_interrupts(
            s, tenant="default", workflow=None, after=None, limit=10)]
            for s in reader_map.shards}
        stale = {s.name: [w.execution_id for w in store.stale_waits(s, bounds)]
                 for s in reader_map.shards}
        health = {s.name: store.health(s, bounds, overdue_grace_s=60, timeout_s=10)
                  for s in reader_map.shards}
    expected = {s.name: [moved_run] if s.name == owner else [] for s in reader_map.shards}
    assert listed == expected
    assert inbox == expected
    assert stale == expected
    counts = {n: len(ids) for n, ids in expected.items()}
    assert {n: h.runs_by_state.get("input_required", 0) for n, h in health.items()} == counts
    assert {n: sum(c for _, _, c in h.open_waits) for n, h in health.items()} == counts
    assert {n: sum(c for _, _, c, _ in h.stale_waits) for n, h in health.items()} == counts
