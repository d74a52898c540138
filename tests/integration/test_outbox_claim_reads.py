"""A relay's claim reads each pending outbox row a bounded number of times, whatever
the statistics.

The outbox is mostly empty when autovacuum analyzes it, so a burst of pending rows
(a fan-out's children, their outcomes) is estimated as one row. The claim then
joined each pending row to a rescan of all the others, and the relay's idle-time
query did the same: 3,000 pending rows read 9 million, 1-3 s a claim, and the
outcomes of 5,000 children took 14 s to relay. These tests analyze the outbox
after its rows were delivered, queue 3,000 rows, claim on one connection as a relay does
(eight times: a statement run often is prepared, and its plan cached) and count
the rows each claim reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from shardq.outbox.store import SQL
from shardq.shards.config import ShardMap
from shardq.shards.connections import connect
from shardq.shards.migrations import migrate

from ..support import rows_read

PENDING = 3_000
LIMIT = 500
READS_PER_ROW = 20
"""Rows read per pending row that a linear plan stays well under; the quadratic one
read PENDING per row."""
CLAIMS = 8

QUEUE = """
INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                           target_bucket, tenant, signal_name, payload)
SELECT CASE WHEN %(one_sender)s THEN %(sender)s ELSE gen_random_uuid() END, g, %(target)s,
       0, 'default', 'outcome', '{}'
FROM generate_series(1, %(n)s) g
"""


@pytest.fixture
def shard_map(fresh_databases: Callable[[int], list[str]]) -> ShardMap:
    shard_map = ShardMap.from_urls(fresh_databases(1))
    migrate(shard_map)
    return shard_map


@pytest.mark.parametrize("one_sender", [False, True], ids=["many-senders", "one-sender"])
def test_a_burst_after_an_empty_analyze_is_claimed_in_linear_reads(
        shard_map: ShardMap, one_sender: bool) -> None:
    sender, target = uuid.uuid4(), uuid.uuid4()
    with connect(shard_map.shards[0], autocommit=True) as conn:
        # Delivered rows leave their pages behind; ANALYZE then counts no live row
        # in them, which is what autovacuum sees of a relay's outbox most of the time.
        conn.execute(QUEUE, {"one_sender": False, "sender": sender, "target": target,
                             "n": PENDING})
        conn.execute("DELETE FROM shardq.outbox")
        conn.execute("ANALYZE shardq.outbox")
        for _ in range(CLAIMS):  # the relay's idle rounds: the statement is prepared
            with conn.transaction():
                assert conn.execute(SQL["claim_outbox"], {"limit": LIMIT}).fetchall() == []
        conn.execute(QUEUE, {"one_sender": one_sender, "sender": sender, "target": target,
                             "n": PENDING})
        queued = [r["id"] for r in conn.execute(
            "SELECT id FROM shardq.outbox ORDER BY id").fetchall()]
        for _ in range(CLAIMS):
            with conn.transaction():
                before = rows_read(conn)
                claimed = [r["id"] for r in conn.execute(
                    SQL["claim_outbox"], {"limit": LIMIT}).fetchall()]
                claim_reads = rows_read(conn) - before
                due = conn.execute(SQL["outbox_next_due"]).fetchone()
                next_due_reads = rows_read(conn) - before - claim_reads
            # One sender's rows to one target go in send order: only the first is due.
            assert claimed == (queued[:1] if one_sender else queued[:LIMIT])
            assert due is not None and due["seconds"] is not None and due["seconds"] <= 0
            assert claim_reads < READS_PER_ROW * PENDING, claim_reads
            assert next_due_reads < READS_PER_ROW * PENDING, next_due_reads
