"""The store's schedule operations (schema/0024, docs/schedules.md): every schedule is
a row of the map's home shard. A part of `Store`, kept apart as flow.py is."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from psycopg.rows import args_row

from shardq.core.models import State
from shardq.core.schedules import DueSchedule, Plan, Schedule, ScheduleSpec
from shardq.shards.config import Shard
from shardq.store import schedule_statements as ops
from shardq.store import statements
from shardq.store.parts import StorePart
from shardq.store.statements import SQL


class ScheduleStore(StorePart):
    """Store's schedule methods (store/parts.py)."""

    def create_schedule(self, tenant: str, spec: ScheduleSpec) -> Schedule:
        """A new schedule (schedule_statements.create_schedule)."""
        with self.connection(self.map.home_shard) as conn:
            return statements.run(conn, ops.create_schedule(tenant, spec))

    def schedules(self, *, tenant: str | None, name: str | None = None, after: str = "",
                  limit: int = 100) -> list[Schedule]:
        """Schedules by name (a tenant's, or every tenant's with None), after `after`."""
        with self.connection(self.map.home_shard) as conn:
            return statements.run(conn, ops.schedules(tenant=tenant, name=name, after=after,
                                                      limit=limit))

    def change_schedule(self, tenant: str, name: str, action: str) -> Schedule | None:
        """Pause, resume, trigger or delete; None when the tenant has no such schedule."""
        with self.connection(self.map.home_shard) as conn:
            return statements.run(conn, ops.change_schedule(tenant, name, action))

    @contextmanager
    def claim_schedules(self, limit: int) -> Iterator[tuple[list[DueSchedule],
                                                            Callable[[str, Plan, Any], None]]]:
        """A ticker's round on the home shard: the claimed schedules (each with the shard's
        clock at the claim), and how to record what was done with one; all of it is
        written in one statement and committed when the block ends (the rows stay
        locked until then), nothing when it raises."""
        with self.transaction(self.map.home_shard) as conn:
            cursor = conn.cursor(row_factory=args_row(DueSchedule))
            rows = cursor.execute(SQL["claim_schedules"], {"limit": limit}).fetchall()
            moved: list[tuple[str, Plan, Any]] = []

            def advance(name: str, plan: Plan, last_run: Any) -> None:
                moved.append((name, plan, last_run))

            yield rows, advance
            if moved:
                conn.execute(SQL["advance_schedules"], _advanced(moved))

    def next_schedule_in(self) -> float | None:
        """Seconds until the home shard's next due tick; None when none is due ever."""
        with self.connection(self.map.home_shard) as conn:
            row = conn.execute(SQL["next_schedule_in"]).fetchone()
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    def run_states(self, shard: Shard, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, State]:
        """The state of each of these runs of `shard` that exists."""
        if not ids:
            return {}
        with self.connection(shard) as conn:
            return {r["id"]: State(r["state"])
                    for r in conn.execute(SQL["run_states"], {"ids": list(ids)})}


def _advanced(moved: Sequence[tuple[str, Plan, Any]]) -> dict[str, list[Any]]:
    """advance_schedules' columns: each schedule's next tick, held tick, latest tick run
    and its run, and its counters."""
    ticks = [[*p.starts, *([p.manual] if p.manual else [])] for _, p, _ in moved]
    return {"names": [n for n, _, _ in moved], "next_at": [p.next_at for _, p, _ in moved],
            "buffered_at": [p.buffered_at for _, p, _ in moved],
            "last_tick": [max(t) if t else None for t in ticks],
            "last_run": [r for _, _, r in moved], "started": [len(t) for t in ticks],
            "skipped": [p.skipped for _, p, _ in moved],
            "missed": [p.missed for _, p, _ in moved]}
