"""Each store operation the clients use, once: its statements, their parameters and the
parsing of their rows, as a generator that either store drives.

An operation yields `(statement, parameters)` and is sent back the statement's
rows (dicts; none for a statement that returns none); what it returns is the
operation's answer, what it raises its refusal. `run` drives one over a psycopg
connection (the sync `Store`), `run_async` over an async one (`AsyncStore`): the
SQL, the parameters and the parsing have one definition whichever client asked.
The statements are queue/queries.sql's (`store.SQL`), the row parsers
queue/store.py's own where it has them.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from shardq.queue import listing
from shardq.queue.errors import (
    ExecutionNotFound,
    ShardUnavailable,
    StoreConflict,
    StoreRejected,
)
from shardq.queue.models import (
    BufferedSignal,
    Execution,
    HistoryEvent,
    PendingInterrupt,
    SignalResult,
    SignalWithStartResult,
    StartResult,
    State,
    WaitInfo,
)
from shardq.queue.params import InterruptDecision, SignalDelivery, StartBatch, StartSignalled
from shardq.queue.store import (
    _END,
    _EPOCH,
    _STATES,
    MAX_PENDING_SIGNALS,
    MAX_PENDING_SIGNALS_TOTAL,
    SQL,
    _about_the_server,
    _execution,
    _signal_result,
    _TaskAppeared,
    _workflow_params,
)
from shardq.shards.config import Shard
from shardq.shards.errors import refusal
from shardq.shards.pools import connection_lost

R = TypeVar("R")
Row = dict[str, Any]
Step = tuple[str, Mapping[str, Any]]
Op = Generator[Step, list[Row], R]
"""An operation: yields (statement, parameters), is sent the rows, returns its answer."""


# -- drivers -------------------------------------------------------------------------


def run(conn: psycopg.Connection[Row], op: Op[R]) -> R:
    """`op` over a sync connection, statement by statement."""
    try:
        step = next(op)
        while True:
            cur = conn.execute(*step)
            step = op.send(cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(conn: psycopg.AsyncConnection[Row], op: Op[R]) -> R:
    """`op` over an async connection, statement by statement."""
    try:
        step = next(op)
        while True:
            cur = await conn.execute(*step)
            step = op.send(await cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def translated(shard: Shard, exc: psycopg.Error) -> Exception | None:
    """What a driver error on `shard` stands for to a store's caller (StoreRejected,
    StoreConflict, NotOwner or Fenced, ShardUnavailable), or None: raise it as it is
    (a broken connection is the pool's to report)."""
    if isinstance(exc, psycopg.DataError | psycopg.errors.UntranslatableCharacter):
        return StoreRejected(f"{shard.name}: the database refused a value: {exc}")
    if isinstance(exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure):
        return StoreConflict(f"{shard.name}: {exc.sqlstate}: {exc}")
    # A bucket frozen by a move, or moved away: the caller follows the map.
    moved = refusal(shard.name, exc.sqlstate, exc.diag.message_primary or "",
                    exc.diag.message_detail)
    if moved is not None:
        return moved
    if connection_lost(exc) or not _about_the_server(exc):
        return None
    first = str(exc).strip().splitlines()
    return ShardUnavailable(f"{shard.label}: {first[0] if first else exc.sqlstate}")


# -- starting and reading ----------------------------------------------------------------


def start_executions(batch: StartBatch) -> Op[list[StartResult]]:
    """Insert the batch's runs whose workflow key has none yet (one statement, its own
    commit); results in `batch.runs` order, an existing key's run with `created=False`."""
    runs = batch.runs
    params = {
        "ids": [r.execution_id for r in runs],
        "workflow_ids": [r.workflow_id for r in runs],
        "inputs": [r.input_json for r in runs],
        **_workflow_params(batch),
    }
    rows = {r["workflow_id"]: r for r in (yield SQL["start_executions"], params)}
    missing = [r.workflow_id for r in runs if r.workflow_id not in rows]
    if missing:
        # Already there, possibly committed by a concurrent start after the
        # statement's snapshot: a new statement sees it.
        found = yield SQL["find_executions"], {**params, "workflow_ids": missing}
        rows.update({r["workflow_id"]: r for r in found})
    return [
        StartResult(row["id"], row["created"], _STATES[row["state"]])
        for row in (rows[r.workflow_id] for r in runs)
    ]


def get_execution(execution_id: uuid.UUID) -> Op[Execution | None]:
    rows = yield SQL["get_execution"], {"id": execution_id}
    return _execution(rows[0]) if rows else None


def read_history(execution_id: uuid.UUID) -> Op[list[HistoryEvent]]:
    rows = yield SQL["read_history"], {"id": execution_id}
    return [HistoryEvent(r["seq"], r["position"], r["kind"], r["name"], r["payload"],
                         r["recorded_at"]) for r in rows]


def list_executions(query: listing.ListQuery, mine: str) -> Op[list[Execution]]:
    """A page of one shard's runs; `mine`: the buckets the reader's map gives it
    (store.buckets_of)."""
    statement, params = listing.compile_list(query)
    params["mine"] = mine
    rows = yield statement, params
    return [_execution(r) for r in rows]


def waits_and_signals(
    ids: Sequence[uuid.UUID],
) -> Op[dict[uuid.UUID, tuple[WaitInfo | None, list[BufferedSignal]]]]:
    """Each run's open wait and its buffered signals, oldest first: two statements."""
    found: dict[uuid.UUID, tuple[WaitInfo | None, list[BufferedSignal]]] = {
        i: (None, []) for i in ids}
    for row in (yield SQL["open_wait"], {"ids": list(ids)}):
        run_id = row.pop("execution_id")
        found[run_id] = (WaitInfo(**row), found[run_id][1])
    for row in (yield SQL["pending_signals"], {"ids": list(ids)}):
        found[row.pop("execution_id")][1].append(BufferedSignal(**row))
    return found


def workflows_of(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, tuple[str, int]]]:
    rows = yield SQL["workflows_of"], {"ids": list(ids)}
    return {r["id"]: (r["workflow_name"], r["workflow_version"]) for r in rows}


def find_run(*, tenant: str, workflow_name: str, workflow_id: str) -> Op[uuid.UUID | None]:
    rows = yield SQL["find_executions"], {
        "tenant": tenant, "workflow_name": workflow_name, "workflow_ids": [workflow_id]}
    return rows[0]["id"] if rows else None


# -- signals and updates -------------------------------------------------------------------


def deliver_signals(tenant: str, signals: Sequence[SignalDelivery]) -> Op[list[SignalResult]]:
    """One tenant's signals to runs of one shard, in one statement (shardq.deliver_signals):
    results in input order, a refused signal carrying its error."""
    relayed = any(s.origin is not None for s in signals)
    rows = yield SQL["deliver_signals"], {
        "origins": [s.origin for s in signals] if relayed else None,
        "tenant": tenant,
        "ids": [s.target for s in signals],
        "names": [s.name for s in signals],
        "payloads": [s.payload_json for s in signals],
        "keys": [s.idempotency_key for s in signals],
        "max_pending": MAX_PENDING_SIGNALS,
        "max_pending_total": MAX_PENDING_SIGNALS_TOTAL,
    }
    return [_signal_result(s.target, s.name, row) for s, row in zip(signals, rows, strict=True)]


def signal_with_start(request: StartSignalled) -> Op[SignalWithStartResult]:
    """One statement (shardq.signal_with_start_v2); a refused signal raises SignalRefused
    (only an existing run can refuse, so nothing was created then)."""
    (new,) = request.start.runs
    rows = yield SQL["signal_with_start"], {
        **_workflow_params(request.start), "workflow_id": new.workflow_id,
        "new_id": new.execution_id, "input": new.input_json, "name": request.name,
        "payload": request.payload_json, "key": request.idempotency_key,
        "max_pending": MAX_PENDING_SIGNALS, "max_pending_total": MAX_PENDING_SIGNALS_TOTAL,
    }
    (row,) = rows
    result = _signal_result(row["execution_id"], request.name, row)
    if result.error is not None:
        raise result.error
    return SignalWithStartResult(row["execution_id"], row["created"], result.delivered,
                                 result.signal_id, result.signal_name)


def signal_by_key(execution_id: uuid.UUID, key: str) -> Op[tuple[int, str] | None]:
    rows = yield SQL["signal_by_key"], {"id": execution_id, "key": key}
    return (rows[0]["id"], rows[0]["name"]) if rows else None


def update_outcome(
    execution_id: uuid.UUID, update_id: int,
) -> Op[tuple[dict[str, Any] | None, State | None]]:
    (row,) = yield SQL["update_outcome"], {"id": execution_id, "update_id": update_id}
    return row["outcome"], _STATES[row["state"]] if row["state"] else None


# -- interrupts and cancellation -----------------------------------------------------------


def open_interrupt(
    execution_id: uuid.UUID, name: str,
) -> Op[tuple[str, int | None, dict[str, Any] | None] | None]:
    rows = yield SQL["open_interrupt"], {"id": execution_id, "name": name}
    return (rows[0]["tenant"], rows[0]["position"], rows[0]["request"]) if rows else None


def decide_interrupt(
    decision: InterruptDecision,
) -> Op[tuple[str, dict[str, Any] | None, str | None]]:
    d = decision
    (row,) = yield SQL["decide_interrupt"], {
        "tenant": d.tenant, "id": d.execution_id, "name": d.name, "position": d.position,
        "action": d.action, "payload": d.payload_json, "decision_id": d.decision_id,
        "actor": d.actor,
    }
    return row["outcome"], row["decision"], row["detail"]


def pending_interrupts(
    *, mine: str, tenant: str, workflow: str | None, after: tuple[datetime, uuid.UUID] | None,
    limit: int, newest_first: bool = False, waited_s: float = 0.0,
) -> Op[list[PendingInterrupt]]:
    after_at, after_id = after or (
        (_END, uuid.UUID(int=(1 << 128) - 1)) if newest_first else (_EPOCH, uuid.UUID(int=0)))
    statement = SQL["pending_interrupts_newest"] if newest_first else SQL["pending_interrupts"]
    rows = yield statement, {
        "mine": mine, "tenant": tenant, "workflow": workflow, "after_at": after_at,
        "after_id": after_id, "limit": limit, "waited_s": waited_s,
    }
    return [PendingInterrupt(**{**r, "actions": tuple(r["actions"] or ())}) for r in rows]


def cancel_attempt(execution_id: uuid.UUID, *, tenant: str, actor: str | None) -> Op[State]:
    """One try at a cancel, in one transaction (the driver's): raises _TaskAppeared when
    the run became due between its two locks, and the driver starts again."""
    yield SQL["fence_run"], {"id": execution_id}
    leases = yield SQL["lock_task"], {"id": execution_id}
    targets = yield SQL["lock_execution"], {"id": execution_id}
    lease = leases[0] if leases else None
    target = targets[0] if targets else None
    if target is None or target["tenant"] != tenant:
        raise ExecutionNotFound(f"execution {execution_id} not found")
    state = State(target["state"])
    if state.terminal:
        return state
    if lease is None and (yield SQL["task_exists"], {"id": execution_id}):
        # A sender made the run due between the two locks, and a worker may hold it
        # by now: what was read of its task row is stale. Locking that row now would
        # take the locks out of order, so start again, task row first.
        raise _TaskAppeared
    if lease is not None and lease["leased"]:
        yield SQL["request_cancel"], {"id": execution_id}
        return state
    yield SQL["cancel_now"], {"id": execution_id, "actor": actor}
    return State.CANCELLED


def cancel_gave_up(shard_name: str, execution_id: uuid.UUID) -> StoreConflict:
    """What a cancel raises after CANCEL_ATTEMPTS tries found the run changing each time."""
    return StoreConflict(f"{shard_name}: execution {execution_id} kept changing under "
                         f"cancel; try again")

