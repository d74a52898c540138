"""Each store operation the clients use, once: its statements, their parameters and the
parsing of their rows, as a generator that either store drives.

An operation yields `(statement, parameters)` and is sent back the statement's
rows (dicts; none for a statement that returns none); what it returns is the
operation's answer, what it raises its refusal. `run` drives one over a psycopg
connection (the sync `Store`), `run_async` over an async one (`AsyncStore`): the
SQL, the parameters and the parsing have one definition whichever client asked.
The statements are store/queries.sql's (`SQL`), and the row parsers and bounds
every driver shares are here too. The hot paths only the worker takes (claim,
commit, heartbeats) stay in store/store.py, which only a sync driver runs.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Generator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg

from shardq.core.attributes import AttributeFilter
from shardq.core.children import ChildInfo
from shardq.core.errors import (
    ExecutionNotFound,
    ShardUnavailable,
    SignalRefused,
    StoreConflict,
    StoreFailed,
    StoreRejected,
)
from shardq.core.flow import ConcurrencyLimit, RateLimit, RateLimiter, RateWait
from shardq.core.models import (
    BufferedSignal,
    Execution,
    HistoryEvent,
    OutboxEntry,
    PendingInterrupt,
    SignalResult,
    SignalWithStartResult,
    StartResult,
    State,
    WaitInfo,
)
from shardq.shards.config import Shard, ShardMap
from shardq.shards.connections import connection_lost
from shardq.shards.errors import ShardqError, refusal
from shardq.shards.routing import BUCKETS, bucket_for_key, new_execution_id
from shardq.shards.sqlfile import load_queries
from shardq.store import listing
from shardq.store.counts import STARTED
from shardq.store.params import (
    InterruptDecision,
    NewRun,
    SignalDelivery,
    StartBatch,
    StartSignalled,
)

R = TypeVar("R")
Row = dict[str, Any]
Step = tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], bool]
Op = Generator[Step, list[Row], R]
"""An operation: yields (statement, parameters) or (statement, parameters, prepare), is
sent the rows, returns its answer."""

SQL = load_queries("shardq.store", "queries.sql")
_STATES = {s.value: s for s in State}  # State(value) costs ~3 us: felt in a 20k-run start
MAX_PENDING_SIGNALS = 1000
"""Unconsumed signals of one name one execution may buffer; beyond it a sender is refused.

Per name, so a flood of a name the run never waits on cannot crowd out the
signal it does wait on."""
MAX_PENDING_SIGNALS_TOTAL = 10_000
"""Unconsumed signals of all names one execution may buffer."""
LOCKED_RUN_ATTEMPTS = 5
"""A cancel (or a priority change) starts again when the run became due while it waited for
the run's lock; each new start holds the task row, so a second race needs a second sender in
between."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_END = datetime(9999, 12, 31, tzinfo=UTC)


def buckets_of(shard_map: ShardMap, shard: Shard) -> str:
    """The buckets `shard_map` gives `shard`, as the text of a bit(4096), bucket 0 first:
    what a read of many runs passes the shard as `mine` (schema/functions/holds_exactly.sql)."""
    return _buckets_of(shard_map, shard.name)


@functools.lru_cache(maxsize=64)
def _buckets_of(shard_map: ShardMap, name: str) -> str:
    return "".join("1" if shard_map.for_bucket(b).name == name else "0" for b in range(BUCKETS))


_SERVER_STATES = ("53", "57", "58", "25006")
"""SQLSTATEs that speak of the server, not the statement (a lost connection aside):
insufficient resources (connection slots, disk full), operator intervention
(shutdown, recovery, a statement cancelled by statement_timeout), system errors,
and a server switched read-only. Callers see them as ShardUnavailable."""


def _about_the_server(exc: psycopg.Error) -> bool:
    return exc.sqlstate is not None and exc.sqlstate.startswith(_SERVER_STATES)


class _TaskAppeared(Exception):
    """Rolls back a cancel or a priority change whose read of the run's task row went
    stale."""


def _workflow_params(batch: StartBatch) -> dict[str, Any]:
    return {"tenant": batch.tenant, "workflow_name": batch.workflow_name,
            "workflow_version": batch.workflow_version, "gates": list(batch.gates) or None,
            "priority": batch.priority, "trace": batch.trace}


def _signal_result(execution_id: uuid.UUID, name: str, row: dict[str, Any]) -> SignalResult:
    """A deliver_signals row as a result.

    Its reason code is decided in SQL (shardq.signal_refusal), which also
    refuses a run's ctx.signal_external to a run of its own shard: one refusal
    has one code, whoever sent the signal.
    """
    reason, detail = row["reason_code"], row["detail"]
    if reason == "target_not_found":
        return _refused(execution_id, ExecutionNotFound(detail))
    if reason is not None:
        return _refused(execution_id, SignalRefused(detail, reason))
    if row["earlier_id"] is not None:
        return SignalResult(execution_id, row["earlier_id"], delivered=False,
                            signal_name=row["earlier_name"])
    return SignalResult(execution_id, row["signal_id"], delivered=True, signal_name=name)


def _refused(execution_id: uuid.UUID, error: ExecutionNotFound | SignalRefused) -> SignalResult:
    return SignalResult(execution_id, None, delivered=False, error=error)


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
        finished_at=row["finished_at"],
        priority=row["priority"],
        concurrency_key=row.get("concurrency_key"),
        waiting_for_slot=bool(row.get("waiting_for_slot")),
        build_id=row["build_id"],
        pinned=row["pinned"],
        attributes=row.get("attributes") or {},
    )


# -- drivers -------------------------------------------------------------------------


def run(conn: psycopg.Connection[Row], op: Op[R]) -> R:
    """`op` over a sync connection, statement by statement."""
    try:
        step = next(op)
        while True:
            cur = conn.execute(step[0], step[1], prepare=_prepare(step))
            step = op.send(cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(conn: psycopg.AsyncConnection[Row], op: Op[R]) -> R:
    """`op` over an async connection, statement by statement."""
    try:
        step = next(op)
        while True:
            cur = await conn.execute(step[0], step[1], prepare=_prepare(step))
            step = op.send(await cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _prepare(step: Step) -> bool | None:
    """A step's third item, False, keeps psycopg from preparing it (list_executions);
    None lets psycopg prepare a statement it has run a few times."""
    return step[2] if len(step) == 3 else None


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


def unmapped(shard: Shard, exc: psycopg.Error) -> ShardqError:
    """What a driver error that came out of the pool means to a store's caller: a
    broken connection the pool did not report is the shard unavailable, anything else
    a failed statement. With translated() this is why nothing above the store catches
    psycopg's errors."""
    first = str(exc).strip().splitlines()
    said = first[0] if first else type(exc).__name__
    if connection_lost(exc):
        return ShardUnavailable(f"{shard.label}: connection lost: {said}")
    return StoreFailed(f"{shard.name}: {exc.sqlstate}: {said}", exc.sqlstate)


# -- starting and reading ----------------------------------------------------------------


def start_executions(batch: StartBatch) -> Op[list[StartResult]]:
    """Insert the batch's runs whose workflow key has none yet (one statement, its own
    commit); results in `batch.runs` order, an existing key's run with `created=False`."""
    runs = batch.runs
    yield from declare_limits(runs)
    params = {
        "ids": [r.execution_id for r in runs],
        "workflow_ids": [r.workflow_id for r in runs],
        "inputs": [r.input_json for r in runs],
        "concurrency_keys": [r.concurrency[0] if r.concurrency else None for r in runs],
        "concurrency_limits": [r.concurrency[1] if r.concurrency else None for r in runs],
        **_workflow_params(batch),
    }
    rows = {r["workflow_id"]: r for r in (yield SQL["start_executions"], params)}
    missing = [r.workflow_id for r in runs if r.workflow_id not in rows]
    if missing:
        # Already there, possibly committed by a concurrent start after the
        # statement's snapshot: a new statement sees it.
        found = yield SQL["find_executions"], {
            **params, "workflow_ids": missing,
            "probes": [r.execution_id for r in runs if r.workflow_id not in rows]}
        rows.update({r["workflow_id"]: r for r in found})
    return [
        StartResult(row["id"], row["created"], _STATES[row["state"]])
        for row in (rows[r.workflow_id] for r in runs)
    ]


def declare_limits(runs: Sequence[NewRun]) -> Op[None]:
    """Commit the concurrency limits these runs declare, before they are inserted: their
    admission reads them (schema/functions/declare_limits.sql). Nothing for unkeyed runs."""
    declared = {r.concurrency[0]: (r.concurrency[1], r) for r in runs if r.concurrency}
    if not declared:
        return
    yield SQL["declare_limits"], {
        "keys": list(declared), "limits": [limit for limit, _ in declared.values()],
        "buckets": [r.bucket for _, r in declared.values()],
        "probes": [r.execution_id for _, r in declared.values()]}


def _concurrency_limit(row: Row) -> ConcurrencyLimit:
    return ConcurrencyLimit(row["key"], row["declared"], row["override"], row["running"],
                            row["waiting"])


def concurrency_limit(key: str) -> Op[ConcurrencyLimit | None]:
    """A concurrency key as its shard holds it; None when no start has declared it."""
    rows = yield SQL["concurrency_limit"], {"key": key, "probe": _key_probe(key)}
    return _concurrency_limit(rows[0]) if rows else None


def set_concurrency_limit(key: str, override: int | None) -> Op[ConcurrencyLimit | None]:
    """An operator's limit for `key` (None: the declared one again), promoting waiting runs
    when it grew; the key as it now is, None when no start has declared it."""
    rows = yield SQL["set_concurrency_limit"], {
        "key": key, "override": override, "probe": _key_probe(key)}
    return _concurrency_limit(rows[0]) if rows else None


def busiest_keys(shard_map: ShardMap, shard: Shard, limit: int) -> Op[list[ConcurrencyLimit]]:
    """The shard's keys with the most runs waiting for a slot, most first."""
    rows = yield SQL["busiest_keys"], {"mine": buckets_of(shard_map, shard), "limit": limit}
    return [_concurrency_limit(r) for r in rows]


def tenant_weights() -> Op[dict[str, int]]:
    """The weights an operator gave tenants on one shard (a tenant not in it weighs 1)."""
    rows = yield SQL["tenant_weights"], {}
    return {r["tenant"]: r["weight"] for r in rows}


def set_tenant_weight(tenant: str, weight: int | None) -> Op[None]:
    """Give `tenant` a weight on one shard, or 1 again (None)."""
    yield SQL["set_tenant_weight"], {"tenant": tenant, "weight": weight}


def take_rate_slot(limiter: str, run: uuid.UUID, position: int, attempt: int,
                   park_after: float) -> Op[float | None]:
    """Seconds until a step's call may start under `limiter` (schema/functions/
    take_rate_slot.sql); None when the shard holds no such limiter."""
    rows = yield SQL["take_rate_slot"], {"limiter": limiter, "run": run, "position": position,
                                         "attempt": attempt, "park_after": park_after}
    wait = rows[0]["wait_s"]
    return None if wait is None else float(wait)


def declare_rate_limiters(limits: Mapping[str, RateLimit]) -> Op[None]:
    """Write the limiters workflow code declares (an operator's numbers stay)."""
    names = sorted(limits)
    yield SQL["declare_rate_limiters"], {
        "names": names, "rates": [limits[n].rate for n in names],
        "periods": [limits[n].per for n in names], "bursts": [limits[n].burst for n in names]}


def rate_limiters(name: str | None) -> Op[list[RateLimiter]]:
    """Every limiter the shard holds, or the one called `name`."""
    rows = yield SQL["rate_limiters"], {"name": name}
    return [_rate_limiter(r) for r in rows]


def set_rate_limit(name: str, limit: RateLimit | None) -> Op[RateLimiter | None]:
    """An operator's numbers for limiter `name` (None: the declared ones again); the
    limiter as it now is, None when no worker has declared it."""
    rows = yield SQL["set_rate_limit"], {
        "name": name, "rate": limit and limit.rate, "period_s": limit and limit.per,
        "burst": limit and limit.burst}
    return _rate_limiter(rows[0]) if rows else None


def count_runs(tenant: str | None, workflow: str | None, where: tuple[AttributeFilter, ...] = (),
               mine: str = "") -> Op[list[tuple[str, str, int]]]:
    """This shard's (workflow, kind, n) rows (store/counts.py), of one tenant or all: from
    its counters, or from the runs attribute filters match (`mine`: as a page's)."""
    if not where:
        rows = yield SQL["count_runs"], {"tenant": tenant, "workflow": workflow}
        return [(r["workflow"], r["kind"], int(r["n"])) for r in rows]
    statement, params = listing.compile_count(listing.ListQuery(
        tenant=tenant, workflow=workflow, where=where))
    found = yield statement, {**params, "mine": mine}, False
    # As counters have them: every run started, and each in its state but pending.
    return [(r["workflow_name"], kind, int(r["n"])) for r in found
            for kind in (STARTED, r["state"]) if kind != State.PENDING]


def outbox_of(execution_id: uuid.UUID, tenant: str) -> Op[list[OutboxEntry]]:
    """A run's outbox rows on one shard, sent by it or to it, oldest first."""
    rows = yield SQL["outbox_of"], {"id": execution_id, "tenant": tenant}
    return [OutboxEntry(**r) for r in rows]


def children_of(execution_id: uuid.UUID) -> Op[list[ChildInfo]]:
    """The children a run started, in start order."""
    rows = yield SQL["children_of"], {"id": execution_id}
    return [ChildInfo(**r) for r in rows]


def rate_wait_of(execution_id: uuid.UUID) -> Op[RateWait | None]:
    """The slot a run is parked for, if any."""
    rows = yield SQL["rate_reservations_of"], {"id": execution_id}
    return RateWait(rows[0]["limiter"], rows[0]["at"]) if rows else None


def _rate_limiter(row: dict[str, Any]) -> RateLimiter:
    override = None if row["o_rate"] is None else RateLimit(
        row["o_rate"], row["o_period_s"], row["o_burst"])
    return RateLimiter(row["name"], RateLimit(row["rate"], row["period_s"], row["burst"]),
                       override, row["waiting"], row["backlog_s"])


def _key_probe(key: str) -> uuid.UUID:
    """An id of the key's bucket: what the fence and ownership checks read."""
    return new_execution_id(bucket_for_key(key))


def get_execution(execution_id: uuid.UUID) -> Op[Execution | None]:
    rows = yield SQL["executions_of"], {"ids": [execution_id], "fenced": True}
    return _execution(rows[0]) if rows else None


def read_history(execution_id: uuid.UUID) -> Op[list[HistoryEvent]]:
    rows = yield SQL["read_history"], {"id": execution_id}
    return [HistoryEvent(r["seq"], r["position"], r["kind"], r["name"], r["payload"],
                         r["recorded_at"]) for r in rows]


def read_histories(ids: Sequence[uuid.UUID]) -> Op[dict[uuid.UUID, list[HistoryEvent]]]:
    """Each of these runs' events in order (a run with none, or not here, is absent)."""
    found: dict[uuid.UUID, list[HistoryEvent]] = {}
    for r in (yield SQL["read_histories"], {"ids": list(ids)}):
        found.setdefault(r["execution_id"], []).append(HistoryEvent(
            r["seq"], r["position"], r["kind"], r["name"], r["payload"], r["recorded_at"]))
    return found


def list_executions(query: listing.ListQuery, mine: str,
                    rows: int | None = None) -> Op[listing.ShardPage]:
    """A page of one shard's runs; `mine`: the buckets the reader's map gives it
    (store.buckets_of). Its ids, then the rows of the first `rows` of them (every one
    when None): a reader of many shards keeps only some of each shard's ids, and reads
    the rows of the others it keeps afterwards, if any."""
    statement, params = listing.compile_list(query)
    params["mine"] = mine
    # Planned for its parameters each time, never prepared: a generic plan does not
    # know the page's limit or which filters hold, and read and sorted a whole table.
    ids = [r["id"] for r in (yield statement, params, False)]
    read = len(ids) if rows is None else min(rows, len(ids))
    return listing.ShardPage(ids, (yield from executions_of(ids[:read])), read)


def executions_of(ids: Sequence[uuid.UUID]) -> Op[list[Execution]]:
    """The rows of a page whose ids a listing found, in id order (a run gone since,
    purged, is not among them)."""
    if not ids:
        return []
    rows = yield SQL["executions_of"], {"ids": list(ids), "fenced": False}
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


def find_run(*, tenant: str, workflow_name: str, workflow_id: str,
             bucket: int) -> Op[uuid.UUID | None]:
    """The run of this workflow key in `bucket`, the one its start would take (a
    limited workflow's runs are in their concurrency key's bucket)."""
    probe = new_execution_id(bucket)
    rows = yield SQL["find_executions"], {
        "tenant": tenant, "workflow_name": workflow_name, "workflow_ids": [workflow_id],
        "probes": [probe]}
    return rows[0]["id"] if rows else None


# -- signals and updates -------------------------------------------------------------------


def deliver_signals(tenant: str, signals: Sequence[SignalDelivery]) -> Op[list[SignalResult]]:
    """One tenant's signals to runs of one shard, in one statement (shardq.deliver_signals):
    results in input order, a refused signal carrying its error."""
    relayed = any(s.origin is not None for s in signals)
    traced = any(s.trace is not None for s in signals)
    rows = yield SQL["deliver_signals"], {
        "origins": [s.origin for s in signals] if relayed else None,
        "traces": [s.trace for s in signals] if traced else None,
        "tenant": tenant,
        "ids": [s.target for s in signals],
        "names": [s.name for s in signals],
        "payloads": f"[{','.join(s.payload_json for s in signals)}]",
        "keys": [s.idempotency_key for s in signals],
        "max_pending": MAX_PENDING_SIGNALS,
        "max_pending_total": MAX_PENDING_SIGNALS_TOTAL,
    }
    return [_signal_result(s.target, s.name, row) for s, row in zip(signals, rows, strict=True)]


def signal_with_start(request: StartSignalled) -> Op[SignalWithStartResult]:
    """One statement (shardq.signal_with_start_v2); a refused signal raises SignalRefused
    (only an existing run can refuse, so nothing was created then)."""
    (new,) = request.start.runs
    yield from declare_limits(request.start.runs)
    rows = yield SQL["signal_with_start"], {
        "concurrency_key": new.concurrency[0] if new.concurrency else None,
        "concurrency_limit": new.concurrency[1] if new.concurrency else None,
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


def _locked_run(execution_id: uuid.UUID, tenant: str) -> Op[tuple[State, bool]]:
    """Fence the run's bucket and lock the run in the workers' order (task row, then
    executions row): its state and whether a worker's live lease holds it. Raises
    _TaskAppeared when the run became due between the two locks (a sender made it due and
    a worker may hold it by now: what was read of its task row is stale, and locking that
    row now would take the locks out of order), and the driver starts again."""
    yield SQL["fence_run"], {"id": execution_id}
    leases = yield SQL["lock_task"], {"id": execution_id}
    targets = yield SQL["lock_execution"], {"id": execution_id}
    lease = leases[0] if leases else None
    target = targets[0] if targets else None
    if target is None or target["tenant"] != tenant:
        raise ExecutionNotFound(f"execution {execution_id} not found")
    state = State(target["state"])
    if not state.terminal and lease is None:
        if target["concurrency_key"] is not None:
            # A run with no task row may be waiting for a slot: a promotion that
            # gives it one must not race the change (it holds this lock).
            yield SQL["admission_lock"], {}
        if (yield SQL["task_exists"], {"id": execution_id}):
            raise _TaskAppeared
    return state, lease is not None and lease["leased"]


def cancel_attempt(execution_id: uuid.UUID, *, tenant: str, actor: str | None) -> Op[State]:
    """One try at a cancel, in one transaction (the driver's)."""
    state, leased = yield from _locked_run(execution_id, tenant)
    if state.terminal:
        return state
    if leased:
        yield SQL["request_cancel"], {"id": execution_id}
        return state
    yield SQL["cancel_now"], {"id": execution_id, "actor": actor}
    return State.CANCELLED


def set_priority_attempt(execution_id: uuid.UUID, *, tenant: str, priority: int) -> Op[State]:
    """One try at changing a live run's priority, in one transaction (the driver's): its
    executions row (what every later wake copies) and its task row if it has one, which
    the lock taken first keeps from being claimed or deleted meanwhile. A finished run
    is left as it ended; its state is the answer either way."""
    state, _leased = yield from _locked_run(execution_id, tenant)
    if not state.terminal:
        yield SQL["set_priority"], {"id": execution_id, "priority": priority}
    return state


def kept_changing(shard_name: str, execution_id: uuid.UUID, what: str) -> StoreConflict:
    """What a cancel or a priority change (`what`) raises after LOCKED_RUN_ATTEMPTS tries
    found the run changing each time."""
    return StoreConflict(f"{shard_name}: execution {execution_id} kept changing under "
                         f"{what}; try again")

