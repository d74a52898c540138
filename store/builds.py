"""The store's build operations (schema/0026; docs/versioning.md, "Builds"): workflows'
current builds, the runs pinned to each, and migrate-build. Operators' calls, sync only.
A part of `Store`, kept apart as flow.py is."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from shardq.store.parts import StorePart
from shardq.store.statements import SQL, buckets_of

if TYPE_CHECKING:
    from datetime import datetime

    from shardq.shards.config import Shard

OLDER_TRANSACTIONS_POLL_S = 0.05


class BuildStore(StorePart):
    """Store's build methods (store/parts.py)."""

    def workflow_builds(self, shard: Shard) -> dict[str, tuple[str, bool]]:
        """Workflow -> (current build, pinned) as `shard` holds them."""
        with self.connection(shard) as conn:
            rows = conn.execute(SQL["workflow_builds"]).fetchall()
        return {r["workflow_name"]: (r["build_id"], r["pinned"]) for r in rows}

    def set_workflow_build(self, shard: Shard, workflow: str, build: str | None,
                           pinned: bool) -> None:
        """Give `workflow` a current build on `shard`, or none (None)."""
        with self.connection(shard) as conn:
            conn.execute(SQL["set_workflow_build"], {
                "workflow": workflow, "build": build, "pinned": pinned})

    def pinned_runs(self, shard: Shard,
                    workflow: str | None = None) -> dict[tuple[str, str], int]:
        """(workflow, build) -> unfinished runs pinned to it, of the buckets the store's
        map gives `shard` (a run a move has on two shards is counted once); of
        `workflow` only, unless None."""
        with self.connection(shard) as conn:
            rows = conn.execute(SQL["pinned_runs"], {
                "mine": buckets_of(self.map, shard), "workflow": workflow}).fetchall()
        return {(r["workflow_name"], r["build_id"]): r["n"] for r in rows}

    def migrate_build(self, shard: Shard, workflow: str, from_build: str,
                      to_build: str | None, *, wait_s: float) -> tuple[int, bool]:
        """Move `shard`'s unfinished runs of `workflow` pinned to `from_build` to
        `to_build` (None: pinned to none). Answers how many runs moved, and whether
        every task row was checked after the transactions that could have read a run's
        old build: False when one older than the move was still open after `wait_s`
        (run it again once it ends)."""
        params = {"workflow": workflow, "from_build": from_build, "to_build": to_build}
        with self.transaction(shard) as conn:
            (moved,) = [r["n"] for r in conn.execute(SQL["migrate_pinned_runs"], params)]
        # A statement that read a moved run's executions row before that commit may
        # still insert its task row with the old build: once every transaction that
        # began before the commit has ended, no such row can come, and those that
        # came are moved here.
        settled = self._older_transactions_ended(shard, wait_s)
        with self.transaction(shard) as conn:
            conn.execute(SQL["migrate_pinned_tasks"], params)
        return moved, settled

    def _older_transactions_ended(self, shard: Shard, wait_s: float) -> bool:
        since: datetime | None = None
        deadline = time.monotonic() + wait_s
        with self.connection(shard) as conn:
            while True:
                (row,) = conn.execute(SQL["older_transactions"], {"since": since}).fetchall()
                since = row["since"]
                if row["n"] == 0:
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(OLDER_TRANSACTIONS_POLL_S)
