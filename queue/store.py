"""The one seam between shardq and a shard's tables.

Every statement comes from queue/queries.sql (the listing's dynamic filters
from queue/listing.py). Methods pick the shard's pooled connection and run a
body that takes any connection, so several operations can share one commit.
psycopg errors stop here: callers see ShardUnavailable, StoreRejected and the
engine's own errors.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg

from shardq.queue import listing
from shardq.queue.errors import ExecutionNotFound, SignalRefused, StoreRejected
from shardq.queue.models import (
    Claim,
    CommitOutcome,
    Execution,
    HistoryEvent,
    PendingSignal,
    SignalResult,
    StartResult,
    State,
    TaskAction,
    TurnCommit,
)
from shardq.shards.config import Shard
from shardq.shards.pools import DictConnection, ShardPools
from shardq.shards.sqlfile import load_queries

log = logging.getLogger(__name__)

SQL = load_queries("shardq.queue", "queries.sql")
MAX_PENDING_SIGNALS = 1000
"""Unconsumed signals one execution may buffer; beyond it a sender is refused."""


class Store:
    """Shard-aware access to the queue tables; one instance per process is enough."""

    def __init__(self, pools: ShardPools) -> None:
        self.pools = pools
        self.map = pools.map

    @contextmanager
    def transaction(self, shard: Shard) -> Iterator[DictConnection]:
        """One transaction on `shard`; data errors become StoreRejected."""
        with self.pools.connection(shard) as conn:
            try:
                with conn.transaction():
                    yield conn
            except (psycopg.DataError, psycopg.errors.UntranslatableCharacter) as exc:
                raise StoreRejected(f"{shard.name}: the database refused a value: {exc}") from exc

    # -- starting and reading ------------------------------------------------

    def start_executions(
        self,
        shard: Shard,
        *,
        tenant: str,
        workflow_name: str,
        workflow_version: int,
        items: Sequence[tuple[uuid.UUID, str, str]],
    ) -> list[StartResult]:
        """Insert (id, workflow_id, input JSON) runs that do not exist yet, in one commit.

        Results come back in `items` order; an existing workflow_id returns its
        execution with `created=False`.
        """
        params = {
            "ids": [i[0] for i in items],
            "workflow_ids": [i[1] for i in items],
            "inputs": [i[2] for i in items],
            "tenant": tenant,
            "workflow_name": workflow_name,
            "workflow_version": workflow_version,
        }
        with self.transaction(shard) as conn:
            rows = {r["workflow_id"]: r for r in conn.execute(SQL["start_executions"], params)}
            if any(r["created"] for r in rows.values()):
                conn.execute(SQL["notify_wake"])
        missing = [i for i in items if i[1] not in rows]
        if missing:
            # A concurrent start of the same key committed after our snapshot
            # began: it is visible to a new statement.
            with self.transaction(shard) as conn:
                for r in conn.execute(SQL["start_executions"], {
                    **params,
                    "ids": [i[0] for i in missing],
                    "workflow_ids": [i[1] for i in missing],
                    "inputs": [i[2] for i in missing],
                }):
                    rows[r["workflow_id"]] = r
        return [
            StartResult(rows[wf]["id"], rows[wf]["created"], State(rows[wf]["state"]))
            for _, wf, _ in items
        ]

    def get_execution(self, execution_id: uuid.UUID) -> Execution | None:
        shard = self.map.for_execution(execution_id)
        with self.transaction(shard) as conn:
            row = conn.execute(SQL["get_execution"], {"id": execution_id}).fetchone()
        return _execution(row) if row else None

    def read_history(self, execution_id: uuid.UUID) -> list[HistoryEvent]:
        shard = self.map.for_execution(execution_id)
        with self.transaction(shard) as conn:
            rows = conn.execute(SQL["read_history"], {"id": execution_id}).fetchall()
        return [
            HistoryEvent(r["seq"], r["position"], r["kind"], r["name"], r["payload"],
                         r["recorded_at"])
            for r in rows
        ]

    def list_executions(self, shard: Shard, query: listing.ListQuery) -> list[Execution]:
        statement, params = listing.compile_list(query)
        with self.transaction(shard) as conn:
            return [_execution(r) for r in conn.execute(statement, params)]

    # -- claiming and leases -------------------------------------------------

    def claim(self, shard: Shard, *, owner: str, limit: int, lease_s: float) -> list[Claim]:
        """Lease up to `limit` due tasks, each with a fresh token, history and pending signals."""
        with self.transaction(shard) as conn:
            rows = conn.execute(
                SQL["claim_tasks"], {"owner": owner, "limit": limit, "lease_s": lease_s}
            ).fetchall()
        return [_claim(r) for r in rows]

    def next_due_in(self, shard: Shard) -> float | None:
        """Seconds until the earliest task is due (negative if overdue), None if there is none."""
        with self.transaction(shard) as conn:
            row = conn.execute(SQL["next_due_in"]).fetchone()
        return None if row is None or row["seconds"] is None else float(row["seconds"])

    def extend_leases(
        self, shard: Shard, leases: Sequence[tuple[uuid.UUID, uuid.UUID]], lease_s: float
    ) -> set[uuid.UUID]:
        """Push back the expiry of leases still held; returns the ids that were extended."""
        return self._lease_update(shard, "extend_leases", leases, {"lease_s": lease_s})

    def release_leases(
        self, shard: Shard, leases: Sequence[tuple[uuid.UUID, uuid.UUID]]
    ) -> set[uuid.UUID]:
        """Make leased tasks due now (shutdown); returns the ids released."""
        released = self._lease_update(shard, "release_leases", leases, {}, notify=True)
        return released

    def _lease_update(
        self,
        shard: Shard,
        query: str,
        leases: Sequence[tuple[uuid.UUID, uuid.UUID]],
        extra: dict[str, Any],
        *,
        notify: bool = False,
    ) -> set[uuid.UUID]:
        if not leases:
            return set()
        params = {"ids": [i for i, _ in leases], "tokens": [t for _, t in leases], **extra}
        with self.transaction(shard) as conn:
            done = {r["execution_id"] for r in conn.execute(SQL[query], params)}
            if notify and done:
                conn.execute(SQL["notify_wake"])
        return done

    def held_leases(self, shard: Shard) -> int:
        with self.transaction(shard) as conn:
            row = conn.execute(SQL["held_leases"]).fetchone()
        return int(row["held"]) if row else 0

    # -- committing turns ----------------------------------------------------

    def commit_turns(
        self, shard: Shard, commits: Sequence[TurnCommit], *, lease_s: float
    ) -> dict[uuid.UUID, CommitOutcome]:
        """Apply many executions' turn commits in one transaction, each fenced by its lease.

        At most one commit per execution per call. A commit whose lease was lost
        writes nothing and comes back `landed=False`; one that already landed
        (a retry after a lost connection) comes back `landed=True` unchanged.
        """
        with self.transaction(shard) as conn:
            return _commit_turns(conn, commits, lease_s)

    # -- signals and cancellation ----------------------------------------------

    def deliver_signal(
        self,
        execution_id: uuid.UUID,
        *,
        tenant: str,
        name: str,
        payload_json: str,
        idempotency_key: str | None,
    ) -> SignalResult:
        """Store a signal, record it in history and wake the run if it waits on it: one commit."""
        shard = self.map.for_execution(execution_id)
        with self.transaction(shard) as conn:
            target = conn.execute(SQL["lock_execution"], {"id": execution_id}).fetchone()
            if target is None or target["tenant"] != tenant:
                raise ExecutionNotFound(f"execution {execution_id} not found")
            if idempotency_key is not None:
                earlier = conn.execute(
                    SQL["find_keyed_signal"], {"id": execution_id, "key": idempotency_key}
                ).fetchone()
                if earlier is not None:
                    return SignalResult(execution_id, earlier["id"], delivered=False)
            if State(target["state"]).terminal:
                raise SignalRefused(
                    f"execution {execution_id} is {target['state']}: it takes no more signals"
                )
            pending = conn.execute(SQL["count_pending_signals"], {"id": execution_id}).fetchone()
            if pending is not None and pending["pending"] >= MAX_PENDING_SIGNALS:
                raise SignalRefused(
                    f"execution {execution_id} already has {MAX_PENDING_SIGNALS} unconsumed signals"
                )
            row = conn.execute(SQL["insert_signal"], {
                "id": execution_id, "tenant": tenant, "name": name,
                "payload": payload_json, "key": idempotency_key,
            }).fetchone()
            assert row is not None
            conn.execute(
                SQL["record_signal_received"],
                {"id": execution_id, "name": name, "signal_id": row["id"]},
            )
            if conn.execute(SQL["wake_signal_waiter"], {"id": execution_id, "name": name}).rowcount:
                conn.execute(SQL["notify_wake"])
        return SignalResult(execution_id, row["id"], delivered=True)

    def cancel(self, execution_id: uuid.UUID, *, tenant: str) -> State:
        """Cancel now if no worker holds the run, else ask its worker to stop at a checkpoint."""
        shard = self.map.for_execution(execution_id)
        with self.transaction(shard) as conn:
            target = conn.execute(SQL["lock_execution"], {"id": execution_id}).fetchone()
            if target is None or target["tenant"] != tenant:
                raise ExecutionNotFound(f"execution {execution_id} not found")
            state = State(target["state"])
            if state.terminal:
                return state
            lease = conn.execute(SQL["task_lease"], {"id": execution_id}).fetchone()
            if lease is not None and lease["leased"]:
                conn.execute(SQL["request_cancel"], {"id": execution_id})
                return state
            conn.execute(SQL["cancel_now"], {"id": execution_id})
            return State.CANCELLED


def _commit_turns(
    conn: DictConnection, commits: Sequence[TurnCommit], lease_s: float
) -> dict[uuid.UUID, CommitOutcome]:
    ids = [c.execution_id for c in commits]
    if len(set(ids)) != len(ids):
        raise ValueError("commit_turns takes at most one commit per execution")
    locked = {r["id"]: r for r in conn.execute(SQL["lock_executions"], {"ids": ids})}
    fenced = {
        r["execution_id"]: r["lease_token"]
        for r in conn.execute(SQL["fence_leases"], {
            "ids": ids,
            "tokens": [c.lease_token for c in commits],
            "next_tokens": [c.next_token for c in commits],
        })
    }
    outcomes: dict[uuid.UUID, CommitOutcome] = {}
    apply: list[TurnCommit] = []
    for c in commits:
        row = locked.get(c.execution_id)
        cancel = bool(row and row["cancel_requested"])
        if fenced.get(c.execution_id) == c.lease_token:
            apply.append(c)
            outcomes[c.execution_id] = CommitOutcome(True, cancel)
        elif fenced.get(c.execution_id) == c.next_token or (
            row is not None and row["commit_token"] == c.next_token
        ):
            outcomes[c.execution_id] = CommitOutcome(True, cancel)
        else:
            outcomes[c.execution_id] = CommitOutcome(False)
    if apply:
        _apply_commits(conn, apply, lease_s)
    return outcomes


def _apply_commits(conn: DictConnection, commits: list[TurnCommit], lease_s: float) -> None:
    events = [(c.execution_id, e) for c in commits for e in c.events]
    changed = [c for c in commits if c.state is not None]
    opened = [c for c in commits if c.open_wait is not None]
    consumed = [(sid, pos) for c in commits for sid, pos in c.consumed_signals]
    by_action = {a: [c for c in commits if c.task is a] for a in TaskAction}
    parking = [c for c in commits if c.wake_on_signal is not None]
    notify = bool(by_action[TaskAction.SCHEDULE])
    with conn.pipeline():
        if events:
            conn.execute(SQL["insert_history"], {
                "ids": [i for i, _ in events],
                "positions": [e.position for _, e in events],
                "kinds": [e.kind.value for _, e in events],
                "names": [e.name for _, e in events],
                "payloads": [json.dumps(e.payload) for _, e in events],
                "wake_ins": [e.wake_in for _, e in events],
            })
        if changed:
            conn.execute(SQL["update_executions"], {
                "ids": [c.execution_id for c in changed],
                "states": [c.state.value if c.state else None for c in changed],
                "outputs": [c.output_json for c in changed],
                "errors": [json.dumps(c.error) if c.error is not None else None for c in changed],
                "commit_tokens": [c.next_token for c in changed],
            })
        closing = [c.execution_id for c in commits if c.close_wait and c.open_wait is None]
        if closing:
            conn.execute(SQL["close_waits"], {"ids": closing})
        if opened:
            waits = [(c.execution_id, c.open_wait) for c in opened if c.open_wait is not None]
            conn.execute(SQL["open_waits"], {
                "ids": [i for i, _ in waits],
                "positions": [w.position for _, w in waits],
                "kinds": [w.kind for _, w in waits],
                "names": [w.name for _, w in waits],
                "deadline_ins": [w.deadline_in for _, w in waits],
                "requests": [json.dumps(w.request) if w.request else None for _, w in waits],
            })
        if consumed:
            conn.execute(SQL["consume_signals"], {
                "signal_ids": [s for s, _ in consumed], "positions": [p for _, p in consumed],
            })
        if by_action[TaskAction.DELETE]:
            conn.execute(SQL["delete_tasks"], {
                "ids": [c.execution_id for c in by_action[TaskAction.DELETE]],
            })
        if by_action[TaskAction.KEEP]:
            conn.execute(SQL["keep_tasks"], {
                "ids": [c.execution_id for c in by_action[TaskAction.KEEP]],
                "next_tokens": [c.next_token for c in by_action[TaskAction.KEEP]],
                "lease_s": lease_s,
            })
        if by_action[TaskAction.SCHEDULE]:
            conn.execute(SQL["schedule_tasks"], {
                "ids": [c.execution_id for c in by_action[TaskAction.SCHEDULE]],
                "delays": [c.delay for c in by_action[TaskAction.SCHEDULE]],
            })
        if parking:
            woken = conn.execute(SQL["wake_if_signal_pending"], {
                "ids": [c.execution_id for c in parking],
                "names": [c.wake_on_signal for c in parking],
            })
    if parking and woken.rowcount > 0:
        notify = True
    if notify:
        conn.execute(SQL["notify_wake"])


def _execution(row: dict[str, Any]) -> Execution:
    return Execution(
        id=row["id"],
        tenant=row["tenant"],
        workflow_name=row["workflow_name"],
        workflow_version=row["workflow_version"],
        workflow_id=row["workflow_id"],
        state=State(row["state"]),
        input=row["input"],
        output=row["output"],
        error=row["error"],
        cancel_requested=row["cancel_requested"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        finished_at=row["finished_at"],
    )


def _claim(row: dict[str, Any]) -> Claim:
    db_now: datetime = row["db_now"]
    return Claim(
        execution_id=row["execution_id"],
        lease_token=row["lease_token"],
        claims=row["claims"],
        tenant=row["tenant"],
        workflow_name=row["workflow_name"],
        workflow_version=row["workflow_version"],
        workflow_id=row["workflow_id"],
        input=json.loads(row["input"]),
        state=State(row["state"]),
        cancel_requested=row["cancel_requested"],
        db_now=db_now,
        history=tuple(
            HistoryEvent(seq, position, kind, name, payload)
            for seq, position, kind, name, payload in json.loads(row["history"])
        ),
        signals=tuple(
            PendingSignal(sid, name, payload) for sid, name, payload in json.loads(row["signals"])
        ),
    )
