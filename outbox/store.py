"""The outbox's reads and writes: a relay's claim and settle, and what an operator sees.

It works through the queue's Store (its pools, its error mapping), with the
outbox's own statements (outbox/queries.sql). A sender's commit writes the rows;
nothing here does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from psycopg.rows import tuple_row

from shardq.outbox.models import OutboxBacklog, OutboxFailure, OutboxRow, OutboxSettlement
from shardq.shards.config import Shard
from shardq.shards.connections import DictConnection
from shardq.shards.sqlfile import load_queries
from shardq.store.store import Store, listen

SQL = load_queries("shardq.outbox", "queries.sql")


class OutboxStore:
    """Shard-aware access to the outbox table, over `store`'s pools."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.map = store.map

    @contextmanager
    def claim(
        self, shard: Shard, *, limit: int
    ) -> Iterator[tuple[list[OutboxRow], OutboxSettlement]]:
        """Lock up to `limit` due outbox rows of `shard`; settle them when the block ends.

        The rows stay locked (other relays skip them) until the block ends, when
        what the caller put in the settlement is written in the same
        transaction. A block that raises settles nothing: the rows are due
        again at once, their attempts untouched.
        """
        with self.store.transaction(shard) as conn, conn.cursor(row_factory=tuple_row) as cur:
            rows = [OutboxRow(*r) for r in cur.execute(SQL["claim_outbox"], {"limit": limit})]
            settlement = OutboxSettlement()
            yield rows, settlement
            if not (settlement.delivered or settlement.retry or settlement.failed):
                return
            retry_ids, delays, retry_reasons, retry_details = _columns(settlement.retry, 4)
            failed_ids, failed_reasons, failed_details = _columns(settlement.failed, 3)
            cur.execute(SQL["settle_outbox"], {
                "delivered": settlement.delivered,
                "retry_ids": retry_ids, "retry_delays": delays,
                "retry_reasons": retry_reasons, "retry_details": retry_details,
                "failed_ids": failed_ids, "failed_reasons": failed_reasons,
                "failed_details": failed_details,
            })

    def next_due(self, shard: Shard) -> float | None:
        """Seconds until `shard`'s next claimable outbox row is due; None when there is none."""
        with self.store.connection(shard) as conn:
            row = conn.execute(SQL["outbox_next_due"]).fetchone()
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    def target_back(self, shard: Shard, first_bucket: int, last_bucket: int) -> int:
        """Make `shard`'s pending rows for a bucket range due now; returns how many."""
        with self.store.connection(shard) as conn:
            return conn.execute(SQL["outbox_target_back"],
                                {"first": first_bucket, "last": last_bucket}).rowcount

    def backlog(self, shard: Shard, *, timeout_s: float | None = None) -> list[OutboxBacklog]:
        """What `shard`'s outbox still owes, by target bucket; the statement stops after
        `timeout_s` when given (a scrape's bound)."""
        with self.store.transaction(shard, timeout_s=timeout_s) as conn:
            return [OutboxBacklog(**r) for r in conn.execute(SQL["outbox_backlog"])]

    def failures(
        self, shard: Shard, *, after: int = 0, limit: int = 100
    ) -> list[OutboxFailure]:
        """`shard`'s permanently failed outbox rows with ids above `after`, by id."""
        with self.store.connection(shard) as conn:
            found = conn.execute(SQL["outbox_failures"], {"after": after, "limit": limit})
            return [OutboxFailure(**r) for r in found]

    def requeue(self, shard: Shard, ids: Sequence[int]) -> set[int]:
        """Make permanently failed rows due again: all of `ids`, or none when one of them
        is not a failed row. Returns the ids re-queued."""
        with self.store.connection(shard) as conn:
            return {r["id"] for r in conn.execute(SQL["requeue_outbox"], {"ids": list(ids)})}


def listen_for_outbox(conn: DictConnection) -> str:
    """Make `conn` (autocommit, outside any pool) receive the NOTIFYs of new outbox rows;
    returns the channel's name."""
    return listen(conn, SQL["listen_outbox_statement"])


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows of `width` values as `width` parallel lists (array parameters)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width
