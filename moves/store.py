"""The move's reads and writes: the seam between the mover (and `shards status`) and
the tables a move touches on home, on its source and on its target.

Every statement is a named query: the move's own in moves/queries.sql, and those a
map change runs too (the mover's lock, writing and reading a map version, the schema
version) in shards/queries.sql. Each method takes the connection it acts on: the
mover keeps its own direct connections (a session lock on home for its whole run,
one switch's transaction on the target beside a snapshot on the source), so the
caller decides which statements share a transaction, except where a method says it
is one transaction itself. Rows come back as the values of moves/models.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import psycopg

from shardq.moves.models import (
    BatchMaxima,
    BatchRecord,
    LateWriter,
    LockHolder,
    MoveRecord,
    Ownership,
    PendingCleanup,
    Writer,
)
from shardq.moves.plan import Batch, Layout
from shardq.shards.connections import DictConnection
from shardq.shards.sqlfile import load_queries
from shardq.shards.versions import MOVER_LOCK_KEY

SQL = load_queries("shardq.moves", "queries.sql")
SHARDS_SQL = load_queries("shardq.shards", "queries.sql")

COPIES = {
    "executions": (SQL["copy_out_executions"], SQL["copy_in_executions"]),
    "history": (SQL["copy_out_history"], SQL["copy_in_history"]),
    "ended_runs": (SQL["copy_out_ended_runs"], SQL["copy_in_ended_runs"]),
    "run_attributes": (SQL["copy_out_run_attributes"], SQL["copy_in_run_attributes"]),
    "signals": (SQL["copy_out_signals"], SQL["copy_in_signals"]),
    "waits": (SQL["copy_out_waits"], SQL["copy_in_waits"]),
    "concurrency_keys": (SQL["copy_out_concurrency_keys"], SQL["copy_in_concurrency_keys"]),
    "key_queue": (SQL["copy_out_key_queue"], SQL["copy_in_key_queue"]),
    "children": (SQL["copy_out_children"], SQL["copy_in_children"]),
    "tasks": (SQL["copy_out_tasks"], SQL["copy_in_tasks"]),
    "outbox": (SQL["copy_out_outbox"], SQL["copy_in_outbox"]),
}
"""Each table a move copies, in copy order: its COPY out of the source and into the
target (binary, so each pair's column lists match)."""
TABLES = tuple(COPIES)

_ANALYZE = {
    "executions": SQL["analyze_executions"],
    "history": SQL["analyze_history"],
    "signals": SQL["analyze_signals"],
    "waits": SQL["analyze_waits"],
    "tasks": SQL["analyze_tasks"],
    "outbox": SQL["analyze_outbox"],
    "concurrency_keys": SQL["analyze_concurrency_keys"],
    "key_queue": SQL["analyze_key_queue"],
    "children": SQL["analyze_children"],
    "ended_runs": SQL["analyze_ended_runs"],
    "run_attributes": SQL["analyze_run_attributes"],
}


class MoveStore:
    """The move's statements, each run on the connection a method is given."""

    # -- the map, the schema, a session's name: any shard ------------------------------

    def newest_map(self, conn: DictConnection) -> tuple[int, Layout] | None:
        """The newest map version `conn`'s shard holds and its layout; None without one."""
        row = conn.execute(SQL["newest_map"]).fetchone()
        return None if row is None else (int(row["version"]), json.loads(row["layout"]))

    def map_layout(self, conn: DictConnection, version: int) -> Layout | None:
        """The layout of map version `version`, None when `conn`'s shard lacks it."""
        row = conn.execute(SHARDS_SQL["read_map_version"], {"version": version}).fetchone()
        return None if row is None else dict(json.loads(row["layout"]))

    def add_map(self, conn: DictConnection, version: int, layout: Layout) -> None:
        """Record map version `version`; a version already there is kept as it is."""
        conn.execute(SHARDS_SQL["record_map_version_once"],
                     {"version": version, "layout": json.dumps(layout)})

    def notify_map(self, conn: DictConnection, version: int) -> None:
        """Tell the processes following the map, and wake the shard's claim loops."""
        conn.execute(SQL["notify_map"], {"version": version})

    def ownership(self, conn: DictConnection) -> Ownership | None:
        row = conn.execute(SQL["ownership_bits"]).fetchone()
        return None if row is None else Ownership(**row)

    def schema_version(self, conn: DictConnection) -> int:
        row = conn.execute(SHARDS_SQL["schema_version"]).fetchone()
        return int(row["version"]) if row is not None else 0

    def set_application_name(self, conn: DictConnection, name: str) -> None:
        """Name `conn`'s session in pg_stat_activity."""
        conn.execute(SQL["set_application_name"], {"name": name})

    # -- the mover's lock and the journal, on home -------------------------------------

    def try_mover_lock(self, conn: DictConnection) -> bool:
        """Take the mover's lock for `conn`'s session; False when another session has it."""
        row = conn.execute(SHARDS_SQL["try_mover_lock"], {"key": MOVER_LOCK_KEY}).fetchone()
        return bool(row and row["locked"])

    def mover_lock_holder(self, conn: DictConnection) -> LockHolder | None:
        row = conn.execute(SQL["mover_lock_holder"], {
            "high": MOVER_LOCK_KEY >> 32, "low": MOVER_LOCK_KEY & 0xFFFF_FFFF}).fetchone()
        return None if row is None else LockHolder(**row)

    def unfinished_move(self, conn: DictConnection) -> MoveRecord | None:
        row = conn.execute(SQL["unfinished_move"]).fetchone()
        return None if row is None else MoveRecord(**row)

    def move(self, conn: DictConnection, move: int) -> MoveRecord | None:
        row = conn.execute(SQL["move_by_id"], {"id": move}).fetchone()
        return None if row is None else MoveRecord(**row)

    def latest_uncleaned_move(self, conn: DictConnection) -> int | None:
        """The newest finished move whose source still keeps copies of its batches."""
        row = conn.execute(SQL["latest_uncleaned_move"]).fetchone()
        return None if row is None else int(row["id"])

    def journal_move(self, conn: DictConnection, *, first: int, last: int, source: str,
                     target: str, from_version: int, max_runs: int, max_rows: int,
                     grace_s: float, batches: Sequence[Batch]) -> int:
        """Journal a new move and its batches, in one transaction; the move's id."""
        with conn.transaction():
            row = conn.execute(SQL["insert_move"], {
                "first": first, "last": last, "source": source, "target": target,
                "from_version": from_version, "max_runs": max_runs, "max_rows": max_rows,
                "grace_s": grace_s}).fetchone()
            assert row is not None
            move = int(row["id"])
            self._insert_batches(conn, move, 0, batches)
        return move

    def replan_batches(self, conn: DictConnection, move: int, after: int,
                       batches: Sequence[Batch], *, max_runs: int, max_rows: int) -> None:
        """Replace the batches after `after` that are still planned by `batches`, and
        record the move's new batch limits, in one transaction."""
        with conn.transaction():
            conn.execute(SQL["drop_planned_batches"], {"move": move, "after": after})
            self._insert_batches(conn, move, after + 1, batches)
            conn.execute(SQL["set_batch_limits"], {"move": move, "runs": max_runs,
                                                   "rows": max_rows})

    def _insert_batches(self, conn: DictConnection, move: int, start: int,
                        batches: Sequence[Batch]) -> None:
        for number, b in enumerate(batches, start=start):
            conn.execute(SQL["insert_batch"], {
                "move": move, "batch": number, "first": b.first, "last": b.last,
                "runs": b.runs, "rows": b.rows})

    def batches(self, conn: DictConnection, move: int) -> list[BatchRecord]:
        """The batches of `move`, in order."""
        return [BatchRecord(**r) for r in conn.execute(SQL["move_batches"], {"move": move})]

    def pending_cleanups(self, conn: DictConnection) -> list[PendingCleanup]:
        """Every switched batch whose source keeps its copy, of any move, soonest due first."""
        return [PendingCleanup(**r) for r in conn.execute(SQL["pending_cleanups"])]

    def set_move_phase(self, conn: DictConnection, move: int, phase: str) -> None:
        conn.execute(SQL["set_move_phase"], {"move": move, "phase": phase})

    def set_batch_phase(self, conn: DictConnection, move: int, batch: int, phase: str) -> None:
        conn.execute(SQL["set_batch_phase"], {"move": move, "batch": batch, "phase": phase})

    def batch_switched(self, conn: DictConnection, move: int, batch: int, *, version: int,
                       runs: int | None, rows: int | None, paused_ms: int | None) -> None:
        """Journal a batch this run switched, with what it copied and how long it paused."""
        conn.execute(SQL["batch_switched"], {
            "move": move, "batch": batch, "runs": runs, "rows": rows,
            "paused_ms": paused_ms, "version": version})

    def batch_switched_found(self, conn: DictConnection, move: int, batch: int,
                             version: int) -> None:
        """Journal a batch an earlier run switched (what it copied is not known)."""
        conn.execute(SQL["batch_switched_found"],
                     {"move": move, "batch": batch, "version": version})

    def batch_released(self, conn: DictConnection, move: int, batch: int,
                       version: int) -> None:
        conn.execute(SQL["batch_released"], {"move": move, "batch": batch, "version": version})

    # -- planning, on a source ---------------------------------------------------------

    def bucket_counts(self, conn: DictConnection, first: int,
                      last: int) -> dict[int, tuple[int, int]]:
        """Runs and (estimated) rows per bucket of first..last that holds any."""
        return {int(r["bucket"]): (int(r["runs"]), int(r["rows"])) for r in conn.execute(
            SQL["bucket_counts"], {"first": first, "last": last})}

    def runs_per_bucket(self, conn: DictConnection) -> dict[int, int]:
        """Runs per bucket the shard owns (that holds any)."""
        return {int(r["bucket"]): int(r["runs"]) for r in conn.execute(SQL["runs_per_bucket"])}

    # -- F1, F2: the freeze, on the source ---------------------------------------------

    def freeze(self, conn: DictConnection, bits: str, move: int, target: str) -> bool:
        """Stop writes to the buckets of `bits` for `move`; False when the shard does not
        own all of them (nothing frozen)."""
        row = conn.execute(SQL["freeze"], {"bits": bits, "move": move,
                                           "target": target}).fetchone()
        return row is not None

    def unfreeze(self, conn: DictConnection, bits: str) -> None:
        """Writable again, the buckets of `bits` the shard still owns."""
        conn.execute(SQL["unfreeze"], {"bits": bits})

    def writers(self, conn: DictConnection) -> list[Writer]:
        """The other transactions of the shard's database holding an xid now."""
        return [Writer(**r) for r in conn.execute(SQL["writers"])]

    def writers_left(self, conn: DictConnection, writers: Sequence[Writer]) -> list[LateWriter]:
        """Those of `writers` still in the same transaction."""
        return [LateWriter(**r) for r in conn.execute(SQL["writers_left"], {
            "pids": [w.pid for w in writers], "xids": [w.xid for w in writers]})]

    # -- S1: the copy and the switch ---------------------------------------------------

    def batch_runs(self, conn: DictConnection, first: int, last: int) -> list[uuid.UUID]:
        """The runs of buckets first..last on the shard."""
        return [r["id"] for r in conn.execute(SQL["batch_runs"], {"first": first,
                                                                  "last": last})]

    def batch_maxima(self, conn: DictConnection, ids: Sequence[uuid.UUID]) -> BatchMaxima:
        row = conn.execute(SQL["batch_maxima"], {"ids": list(ids)}).fetchone()
        assert row is not None
        return BatchMaxima(**row)

    def copy(self, src: DictConnection, dst: DictConnection, table: str,
             ids: Sequence[uuid.UUID], batch: Batch) -> int:
        """Stream `table`'s rows of `ids` (of the batch's buckets, for rows kept by bucket)
        from src to dst in binary COPY; the rows copied."""
        out_sql, in_sql = COPIES[table]
        params = {"ids": list(ids), "first": batch.first, "last": batch.last}
        with src.cursor() as out_cur, dst.cursor() as in_cur:
            with out_cur.copy(out_sql, params) as out, \
                    in_cur.copy(in_sql) as into:
                for chunk in out:
                    into.write(chunk)
            return max(in_cur.rowcount, 0)

    def switch_lock(self, conn: DictConnection, move: int, batch: int) -> None:
        """Wait for, then hold until the transaction ends, the lock of one batch's switch."""
        conn.execute(SQL["switch_lock"], {"move": move, "batch": batch})

    def try_switch_lock(self, conn: DictConnection, move: int, batch: int) -> bool:
        """The lock of one batch's switch until the transaction ends, if free now."""
        row = conn.execute(SQL["try_switch_lock"], {"move": move, "batch": batch}).fetchone()
        return bool(row and row["taken"])

    def end_orphaned_switch(self, conn: DictConnection, name: str) -> None:
        """End the other sessions named `name`: a killed mover's switch."""
        conn.execute(SQL["end_orphaned_switch"], {"name": name})

    def applied_batch(self, conn: DictConnection, move: int, batch: int) -> int | None:
        """The map version a batch switched to on `conn`'s shard; None if it did not."""
        row = conn.execute(SQL["applied_batch"], {"move": move, "batch": batch}).fetchone()
        return None if row is None else int(row["map_version"])

    def take_batch(self, conn: DictConnection, move: int, batch: int, *, bits: str,
                   version: int, layout: Layout, maxima: BatchMaxima) -> None:
        """The switch's writes after the copy, in the caller's transaction on the target:
        its sequences past the copied rows, map version `version`, the buckets of `bits`
        owned and writable, the batch recorded applied, and the processes told."""
        if maxima.history_seq is not None:
            conn.execute(SQL["advance_history_seq"], {"max": maxima.history_seq})
        if maxima.signal_id is not None:
            conn.execute(SQL["advance_signal_id"], {"max": maxima.signal_id})
        self.add_map(conn, version, layout)
        conn.execute(SQL["take_ownership"], {"bits": bits, "version": version})
        conn.execute(SQL["record_applied"], {"move": move, "batch": batch, "version": version})
        self.notify_map(conn, version)

    # -- R: the release, on the source -------------------------------------------------

    def release(self, conn: DictConnection, *, bits: str, version: int, layout: Layout) -> None:
        """Give up the buckets of `bits` as of map version `version`, in one transaction."""
        with conn.transaction():
            self.add_map(conn, version, layout)
            conn.execute(SQL["release"], {"bits": bits, "version": version})
            self.notify_map(conn, version)

    # -- C: the cleanup, and statistics ------------------------------------------------

    def leftover_runs(self, conn: DictConnection, first: int, last: int,
                      limit: int) -> list[uuid.UUID]:
        """Up to `limit` runs of buckets first..last the shard does not own."""
        return [r["id"] for r in conn.execute(SQL["leftover_runs"], {
            "first": first, "last": last, "limit": limit})]

    def move_session(self, conn: DictConnection) -> None:
        """Until `conn`'s transaction ends, task rows are copied in as they are: no
        concurrency admission (schema/0020)."""
        conn.execute(SQL["move_session"])

    def delete_runs(self, conn: DictConnection, ids: Sequence[uuid.UUID]) -> None:
        """Delete every row of these runs, in every table, in one statement."""
        conn.execute(SQL["delete_runs"], {"ids": list(ids)})

    def delete_leftover_keys(self, conn: DictConnection, first: int, last: int) -> None:
        """Delete the limit rows of keys in buckets first..last the shard does not own."""
        conn.execute(SQL["delete_leftover_keys"], {"first": first, "last": last})

    def mark_clean(self, conn: DictConnection) -> None:
        """Clear the shard's `unclean` once nothing is frozen and no foreign run is left."""
        conn.execute(SQL["mark_clean"])

    def table_rows(self, conn: DictConnection, tables: Sequence[str]) -> dict[str, float]:
        """The rows each table's statistics describe (-1: never analyzed)."""
        return {r["relname"]: float(r["reltuples"]) for r in conn.execute(
            SQL["table_rows"], {"tables": list(tables)})}

    def analyze(self, conn: DictConnection, table: str) -> bool:
        """ANALYZE `table`, one of TABLES; False, and nothing done, when that would wait
        behind a lock (an operator's VACUUM of the table) for more than a second."""
        try:
            with conn.transaction():
                conn.execute(SQL["analyze_lock_timeout"])
                conn.execute(_ANALYZE[table])
        except psycopg.errors.LockNotAvailable:
            return False
        return True
