"""The one seam between shardq and a shard's tables.

Every statement comes from store/queries.sql (the listing's dynamic filters
from store/listing.py). Each method takes the shard it acts on (the caller
routes; batches through shards/fanout.py) and, for values that travel through
layers, the parameter objects of store/params.py. Each is one transaction on
that shard, and as few round trips as the statement shapes allow: the
hot paths (claim, commit, signal) are one statement each, calls of the
functions in schema/functions/ on an autocommit connection. The driver's errors
stop here: callers see ShardUnavailable, StoreRejected, StoreConflict, NotOwner and
Fenced, and the engine's own errors.

The operations the clients call are written once in store/statements.py, as
generators of (statement, parameters) that parse the rows they get back; a
method here drives one over a pooled connection, as store/async_store.py does
over an async one. The worker's own paths (claim, leases, commit) and the
operator's reads are written here: only this sync store runs them.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from shardq.core.errors import StoreRejected
from shardq.core.models import (
    BufferedSignal,
    Claim,
    CommitOutcome,
    Event,
    Execution,
    HistoryEvent,
    NewEvent,
    PendingInterrupt,
    ShardHealth,
    SignalResult,
    SignalWithStartResult,
    StaleBounds,
    StaleWait,
    StartResult,
    State,
    TurnCommit,
    WaitInfo,
)
from shardq.shards.config import Shard, ShardMap
from shardq.shards.connections import DictConnection
from shardq.shards.pools import ShardPools
from shardq.store import listing, statements
from shardq.store.flow import FlowControlStore
from shardq.store.params import InterruptDecision, Lease, SignalDelivery, StartBatch, StartSignalled
from shardq.store.statements import (
    LOCKED_RUN_ATTEMPTS,
    MAX_PENDING_SIGNALS,
    MAX_PENDING_SIGNALS_TOTAL,
    SQL,
    _TaskAppeared,
    buckets_of,
)

log = logging.getLogger(__name__)


class Store(FlowControlStore):
    """Shard-aware access to the queue tables; one instance per process is enough."""

    def __init__(self, pools: ShardPools) -> None:
        self.pools = pools
        # Per shard, the tenant this process's last claim stopped at: its next
        # claim's walk over tenants starts after it (schema/functions/claim_tasks.sql).
        self._fair_cursor: dict[str, str | None] = {}

    @property
    def map(self) -> ShardMap:
        """The map the pools route by now: it follows newer versions as moves switch them."""
        return self.pools.map

    @contextmanager
    def connection(self, shard: Shard) -> Iterator[DictConnection]:
        """An autocommit connection to `shard`: a lone statement is one round trip.

        Every driver error leaves as a ShardqError (statements.translated, unmapped).
        """
        try:
            with self.pools.connection(shard) as conn:
                try:
                    yield conn
                except psycopg.Error as exc:
                    mapped = statements.translated(shard, exc)
                    if mapped is None:
                        raise  # a lost connection: the pool reports it and marks the shard down
                    raise mapped from exc
        except psycopg.Error as exc:
            raise statements.unmapped(shard, exc) from exc

    @contextmanager
    def transaction(
        self, shard: Shard, *, timeout_s: float | None = None,
    ) -> Iterator[DictConnection]:
        """One transaction on `shard`, for operations of several statements; with
        `timeout_s`, the server stops each of its statements after that long (a
        scrape's bound)."""
        with self.connection(shard) as conn, conn.transaction():
            if timeout_s is not None:
                conn.execute(SQL["local_statement_timeout"], {"ms": str(int(timeout_s * 1000))})
            yield conn

    # -- starting and reading ------------------------------------------------

    def start_executions(self, shard: Shard, batch: StartBatch) -> list[StartResult]:
        """Insert the batch's runs whose workflow key has none yet, in one commit.

        Results come back in `batch.runs` order; an existing workflow_id returns
        its execution with `created=False`.
        """
        with self.connection(shard) as conn:
            return statements.run(conn, statements.start_executions(batch))

    def get_execution(self, shard: Shard, execution_id: uuid.UUID) -> Execution | None:
        with self.connection(shard) as conn:
            return statements.run(conn, statements.get_execution(execution_id))

    def read_history(self, shard: Shard, execution_id: uuid.UUID) -> list[HistoryEvent]:
        with self.connection(shard) as conn:
            return statements.run(conn, statements.read_history(execution_id))

    def list_executions(
        self, shard: Shard, query: listing.ListQuery, *, shard_map: ShardMap | None = None
    ) -> list[Execution]:
        """A page of `shard`'s runs, of the buckets `shard_map` (by default the store's
        current map) gives it: a reader of several shards passes the one map it read them by,
        so a run a move has on two shards is listed once."""
        mine = buckets_of(shard_map or self.map, shard)
        with self.connection(shard) as conn:
            return statements.run(conn, statements.list_executions(query, mine))

    # -- claiming and leases -------------------------------------------------

    def claim(
        self, shard: Shard, *, owner: str, limit: int, lease_s: float, min_priority: int = 0,
    ) -> tuple[list[Claim], float | None]:
        """Lease up to `limit` due tasks, each with a fresh token, history and pending signals,
        higher priority first (of `min_priority` and up only, when it is above 0).

        Also returns the seconds until the next task is due (None when there is
        none), read in the same round trip.
        """
        with self.connection(shard) as conn, conn.cursor(row_factory=tuple_row) as cur:
            # Tuples: a batch of rows is parsed on the worker's hot path.
            rows = cur.execute(SQL["claim_tasks"], {
                "owner": owner, "limit": limit, "lease_s": lease_s,
                "min_priority": min_priority,
                "after_tenant": self._fair_cursor.get(shard.name)}).fetchall()
        # The function's last row: the cursor of its walk over tenants, next_due_in.
        last = rows.pop()
        self._fair_cursor[shard.name] = last[3]
        seconds = last[-1]
        return [_claim(r) for r in rows], None if seconds is None else float(seconds)

    def extend_leases(
        self, shard: Shard, leases: Sequence[Lease], lease_s: float
    ) -> set[uuid.UUID]:
        """Push back the expiry of leases still held; returns the ids that were extended."""
        return self._lease_update(shard, SQL["extend_leases"], leases, {"lease_s": lease_s})

    def release_leases(self, shard: Shard, leases: Sequence[Lease]) -> set[uuid.UUID]:
        """Make leased tasks due now (shutdown); returns the ids released."""
        return self._lease_update(shard, SQL["release_leases"], leases, {}, notify=True)

    def _lease_update(
        self,
        shard: Shard,
        statement: str,
        leases: Sequence[Lease],
        extra: dict[str, Any],
        *,
        notify: bool = False,
    ) -> set[uuid.UUID]:
        if not leases:
            return set()
        params = {"ids": [x.execution_id for x in leases], "tokens": [x.token for x in leases],
                  **extra}
        with self.transaction(shard) as conn:
            done = {r["execution_id"] for r in conn.execute(statement, params)}
            if notify and done:
                conn.execute(SQL["notify_wake"])
        return done

    # -- committing turns ----------------------------------------------------

    def commit_turns(
        self, shard: Shard, commits: Sequence[TurnCommit], *, lease_s: float
    ) -> dict[uuid.UUID, CommitOutcome]:
        """Apply many executions' turn commits in one transaction, each fenced by its lease.

        At most one commit per execution per call. A commit whose lease was lost
        writes nothing and comes back `landed=False`. After a connection broke
        mid-commit, ask `landed_commits` before retrying: a retried commit that
        had landed would find its lease token rotated and report a lost lease.
        """
        with self.connection(shard) as conn:
            return _commit_turns(conn, commits, lease_s)

    def landed_commits(self, shard: Shard, commits: Sequence[TurnCommit]) -> set[uuid.UUID]:
        """Which of `commits` are durable: asked after a connection broke mid-commit."""
        with self.connection(shard) as conn:
            found = conn.execute(SQL["landed_commits"], {
                "ids": [c.execution_id for c in commits],
                "tokens": [c.lease_token for c in commits],
            })
            return {r["id"] for r in found}

    # -- signals and cancellation ----------------------------------------------

    def deliver_signals(
        self, shard: Shard, tenant: str, signals: Sequence[SignalDelivery]
    ) -> list[SignalResult]:
        """Deliver one tenant's signals to runs of `shard` in one commit.

        Each is stored, recorded in its run's history and wakes the run if it
        waits on that name. Results come back in input order; a refused signal
        (unknown run, finished run, a gate already taken, too many pending)
        carries its error and the others land. One statement: shardq.deliver_signals().
        It locks every target run before inserting, so one run's signals commit
        in id order: replay relies on that to consume the same one again.
        """
        with self.connection(shard) as conn:
            return statements.run(conn, statements.deliver_signals(tenant, signals))

    def signal_with_start(self, shard: Shard, request: StartSignalled) -> SignalWithStartResult:
        """Start the key's run unless it exists, then deliver the signal to it.

        One statement: shardq.signal_with_start_v2(). A refused signal raises
        (SignalRefused); only an existing run can refuse (a new one has the
        caller's tenant, no signals and no outcome), so nothing was created then.
        """
        with self.connection(shard) as conn:
            return statements.run(conn, statements.signal_with_start(request))

    def takes_writes(self, shard: Shard) -> bool:
        """Whether `shard` answers and would accept a write (not read-only, not a standby)."""
        with self.connection(shard) as conn:
            row = conn.execute(SQL["takes_writes"]).fetchone()
        return bool(row and row["writable"])

    # -- operations ------------------------------------------------------------

    def stale_waits(
        self, shard: Shard, bounds: StaleBounds, *, kind: str | None = None,
        workflow: str | None = None, tenant: str | None = None, limit: int = 100,
    ) -> list[StaleWait]:
        """`shard`'s stale waits (see StaleBounds), oldest first."""
        with self.connection(shard) as conn:
            found = conn.execute(SQL["stale_waits"], {
                **bounds.params(), "kind": kind, "workflow": workflow, "tenant": tenant,
                "limit": limit, "mine": buckets_of(self.map, shard),
            })
            return [StaleWait(**r) for r in found]

    def health(
        self, shard: Shard, bounds: StaleBounds, *, overdue_grace_s: float, timeout_s: float,
        shard_map: ShardMap | None = None,
    ) -> ShardHealth:
        """Every family the store exporter reports for `shard`, each one indexed query,
        in one read-only transaction whose statements stop after `timeout_s`; the runs of
        the buckets `shard_map` (by default the store's) gives it."""
        mine = {"mine": buckets_of(shard_map or self.map, shard)}
        with self.transaction(shard, timeout_s=timeout_s) as conn:
            waits = [(r["kind"], r["workflow_name"], r["n"])
                     for r in conn.execute(SQL["open_waits_by_workflow"], mine)]
            stale = [(r["kind"], r["workflow_name"], r["n"], r["oldest_s"])
                     for r in conn.execute(SQL["stale_wait_counts"], {**bounds.params(), **mine})]
            signals = conn.execute(SQL["pending_signal_count"], mine).fetchone()
            overdue = conn.execute(SQL["overdue_tasks"],
                                   {"grace_s": overdue_grace_s, **mine}).fetchone()
            states = {r["state"]: r["n"] for r in conn.execute(SQL["runs_by_state"], mine)}
            due = {r["priority"]: r["n"] for r in conn.execute(SQL["due_by_priority"], mine)}
            waiting = conn.execute(SQL["concurrency_waiting"], mine).fetchone()
            tenants = conn.execute(SQL["tenants_due"]).fetchone()
            # Rows only on the home shard, which holds every limiter.
            limiters = [(r["name"], r["waiting"], r["backlog_s"])
                        for r in conn.execute(SQL["rate_limiters"], {"name": None})]
        assert signals is not None and overdue is not None and waiting is not None
        assert tenants is not None
        return ShardHealth(waits, stale, signals["n"], overdue["n"], overdue["oldest_s"], states,
                           due, waiting["runs"], waiting["keys"], tenants["n"], limiters)

    def purge_batch(
        self, shard: Shard, *, retention_s: float, workflows: Sequence[str], listed: bool,
        limit: int,
    ) -> int | None:
        """Delete up to `limit` finished runs past `retention_s` (of `workflows` when
        `listed`, of every other workflow when not) in one short transaction; how many, or
        None when another purger holds this shard."""
        with self.transaction(shard) as conn:
            held = conn.execute(SQL["purge_lock"]).fetchone()
            if held is None or not held["held"]:
                return None
            gone = conn.execute(SQL["purge_batch"], {
                "retention_s": retention_s, "workflows": list(workflows), "listed": listed,
                "limit": limit,
            }).fetchall()
        return len(gone)

    def purge_idle_keys(self, shard: Shard, *, idle_s: float, limit: int) -> int:
        """Delete up to `limit` concurrency keys idle for `idle_s` (no slot held, no run
        waiting, no operator limit, not declared since), in one short transaction; how
        many."""
        with self.transaction(shard) as conn:
            return len(conn.execute(SQL["purge_idle_keys"], {
                "idle_s": idle_s, "limit": limit}).fetchall())

    def purge_count(
        self, shard: Shard, *, retention_s: float, workflows: Sequence[str], listed: bool
    ) -> int:
        """How many runs a purge with these settings would delete now."""
        with self.connection(shard) as conn:
            row = conn.execute(SQL["purge_count"], {
                "retention_s": retention_s, "workflows": list(workflows), "listed": listed,
            }).fetchone()
        return 0 if row is None else int(row["n"])

    def waits_and_signals(
        self, shard: Shard, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[WaitInfo | None, list[BufferedSignal]]]:
        """Each of these runs of `shard`: its open wait and the signals buffered for it,
        oldest first. Two statements however many runs."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.waits_and_signals(ids))

    # -- contracts: updates and signal schemas -------------------------------------

    def update_outcome(
        self, shard: Shard, execution_id: uuid.UUID, update_id: int
    ) -> tuple[dict[str, Any] | None, State | None]:
        """(the update's recorded outcome or None, the run's state; None: no run)."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.update_outcome(execution_id, update_id))

    def find_run(
        self, shard: Shard, *, tenant: str, workflow_name: str, workflow_id: str, bucket: int
    ) -> uuid.UUID | None:
        """The run of this workflow key, if one was started."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.find_run(
                tenant=tenant, workflow_name=workflow_name, workflow_id=workflow_id,
                bucket=bucket))

    def signal_by_key(
        self, shard: Shard, execution_id: uuid.UUID, key: str
    ) -> tuple[int, str] | None:
        """(id, name) of the signal `key` landed as on this run, if it did."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.signal_by_key(execution_id, key))

    def workflows_of(
        self, shard: Shard, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[str, int]]:
        """The (workflow name, version) of each of these runs of `shard` that exists."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.workflows_of(ids))

    # -- interrupts --------------------------------------------------------------

    def open_interrupt(
        self, shard: Shard, execution_id: uuid.UUID, name: str
    ) -> tuple[str, int | None, dict[str, Any] | None] | None:
        """(the run's tenant, position, request) of its open interrupt `name`; None: no run.

        Position and request are None when the run waits for no such interrupt.
        """
        with self.connection(shard) as conn:
            return statements.run(conn, statements.open_interrupt(execution_id, name))

    def decide_interrupt(
        self, shard: Shard, decision: InterruptDecision
    ) -> tuple[str, dict[str, Any] | None, str | None]:
        """(outcome, decision, detail): one statement, shardq.decide_interrupt()."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.decide_interrupt(decision))

    def pending_interrupts(
        self, shard: Shard, *, tenant: str, workflow: str | None,
        after: tuple[datetime, uuid.UUID] | None, limit: int, newest_first: bool = False,
        waited_s: float = 0.0,
    ) -> list[PendingInterrupt]:
        """A page of `shard`'s open interrupts of `tenant`, oldest (or newest) first, past
        the keyset position `after`; only those open at least `waited_s` seconds."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.pending_interrupts(
                mine=buckets_of(self.map, shard), tenant=tenant, workflow=workflow, after=after,
                limit=limit, newest_first=newest_first, waited_s=waited_s))

    def cancel(
        self, shard: Shard, execution_id: uuid.UUID, *, tenant: str, actor: str | None = None
    ) -> State:
        """Cancel now if no worker holds the run, else have it end cancelled at its next commit.

        Returns `cancelled` when it ended here, `running` when its worker ends it
        (always `cancelled`: see request_cancel), or the state it had already
        finished in, when the cancel came too late.
        """
        return self._locking(shard, execution_id, "cancel", lambda: statements.cancel_attempt(
            execution_id, tenant=tenant, actor=actor))

    def set_priority(
        self, shard: Shard, execution_id: uuid.UUID, *, tenant: str, priority: int
    ) -> State:
        """Give a live run a new priority, for its current task and every later wake; a
        finished run is left as it is. Returns the run's state."""
        return self._locking(shard, execution_id, "a priority change",
                             lambda: statements.set_priority_attempt(
                                 execution_id, tenant=tenant, priority=priority))

    def _locking(self, shard: Shard, execution_id: uuid.UUID, what: str,
                 attempt: Callable[[], statements.Op[State]]) -> State:
        """`attempt` in a transaction of its own, started again while the run becomes due
        between its two locks (statements._locked_run)."""
        for _ in range(LOCKED_RUN_ATTEMPTS):
            try:
                with self.transaction(shard) as conn:
                    return statements.run(conn, attempt())
            except _TaskAppeared:
                continue
        raise statements.kept_changing(shard.name, execution_id, what)


def listen_for_wakes(conn: DictConnection) -> None:
    """Make `conn` (autocommit, outside any pool) receive the shard's wake NOTIFYs."""
    listen(conn, SQL["listen_statement"])


def ping(conn: DictConnection) -> None:
    """One round trip on `conn` (a LISTEN connection's check that its server answers)."""
    conn.execute(SQL["ping"]).fetchone()


def listen(conn: DictConnection, query: str) -> None:
    """Run the LISTEN that `query` builds (the channel's name is defined in SQL)."""
    statement = conn.execute(query, {}).fetchone()
    assert statement is not None
    conn.execute(statement["statement"])


def _commit_turns(
    conn: DictConnection, commits: Sequence[TurnCommit], lease_s: float
) -> dict[uuid.UUID, CommitOutcome]:
    """The whole batch as one statement: shardq.commit_turns_v2().

    At most one commit per execution, so the writes, grouped by table, keep
    each execution's own order. Each column of each kind of write goes as one
    text (queries.sql says why and how); the rare signals to other runs go as
    a JSON document.
    """
    ids = {c.execution_id for c in commits}
    if len(ids) != len(commits):
        raise ValueError("commit_turns takes at most one commit per execution")
    # A commit that ends its run stores its turn's last step inside the
    # outcome event: one history row fewer per finished run (schema/0017).
    folded = {c.execution_id: c.events[-1] for c in commits if _folds(c)}
    events = [(c.execution_id, e) for c in commits
              for e in (c.events[:-1] if c.execution_id in folded else c.events)]
    waits = [(c.execution_id, c.open_wait) for c in commits if c.open_wait is not None]
    consumed = [s for c in commits for s in c.consumed_signals]
    parking = [(c.execution_id, name) for c in commits for name in c.wake_on_signals]
    externals = [
        [c.execution_id.hex, x.position, x.target.hex, x.name, json.loads(x.payload_json),
         x.idempotency_key, MAX_PENDING_SIGNALS, MAX_PENDING_SIGNALS_TOTAL]
        for c in commits for x in c.externals
    ]
    outbox = [
        [c.execution_id.hex, o.position, o.target.hex, o.target_bucket, o.name,
         json.loads(o.payload_json), o.idempotency_key]
        for c in commits for o in c.outbox
    ]
    rare = {k: v for k, v in (("local", externals), ("outbox", outbox)) if v}
    # Every relative time a turn chose (its task's delay, a timer's wake, a wait's
    # deadline) counts from when it chose it, less the time its commit queued since:
    # a run parked for a rate limiter's slot is due at the slot, and its timer's
    # wake_at agrees with its task's due time.
    now = time.monotonic()
    queued = {c.execution_id: now - c.decided_at for c in commits}

    def left(run: uuid.UUID, seconds: float | None) -> str:
        return "-" if seconds is None else repr(max(0.0, seconds - queued[run]))

    params = {
        "lease_s": lease_s,
        "c_ids": ",".join([c.execution_id.hex for c in commits]),
        "c_tokens": ",".join([c.lease_token.hex for c in commits]),
        "c_next": ",".join([c.next_token.hex for c in commits]),
        "c_states": ",".join([c.state or "-" for c in commits]),
        # The output's JSON text wrapped as is: SQL NULL (none set) stays apart
        # from a workflow's null.
        "c_outputs": "[" + ",".join(["null" if c.output_json is None
                                     else '{"v":' + c.output_json + "}" for c in commits]) + "]",
        "c_errors": json.dumps([c.error for c in commits]),
        "c_actions": ",".join([c.task for c in commits]),
        "c_delays": ",".join([left(c.execution_id, c.delay) if c.delay else "0.0"
                              for c in commits]),
        "c_close_wait": ",".join(["t" if c.close_wait and c.open_wait is None else "f"
                                  for c in commits]),
        "e_ids": ",".join([run.hex for run, _ in events]),
        "e_positions": ",".join(["-" if e.position is None else str(e.position)
                                 for _, e in events]),
        "e_kinds": ",".join([e.kind for _, e in events]),
        "e_names": _names([e.name for _, e in events]),
        "e_payloads": json.dumps([e.payload for _, e in events]),
        "e_wake_ins": ",".join([left(run, e.wake_in) for run, e in events]),
        "w_ids": ",".join([run.hex for run, _ in waits]),
        "w_positions": ",".join([str(w.position) for _, w in waits]),
        "w_kinds": ",".join([w.kind for _, w in waits]),
        "w_names": _names([w.name for _, w in waits]),
        "w_deadline_ins": ",".join([left(run, w.deadline_in) for run, w in waits]),
        "w_requests": json.dumps([w.request for _, w in waits]),
        "s_ids": ",".join([str(signal_id) for signal_id, _ in consumed]),
        "s_positions": ",".join([str(position) for _, position in consumed]),
        "p_ids": ",".join([run.hex for run, _ in parking]),
        "p_names": _names([name for _, name in parking]),
        "rare": json.dumps(rare) if rare else None,
        "c_steps": json.dumps([_folded(folded.get(c.execution_id)) for c in commits]),
    }
    with conn.cursor(row_factory=tuple_row) as cur:
        # (position in the batch from 1, cancel requested, signals' outcomes) of each
        # commit that landed
        landed: dict[int, tuple[bool, list[dict[str, Any]] | None]] = {
            ord_: (cancel, sent) for ord_, cancel, sent in cur.execute(SQL["commit_turns"], params)
        }
    return {c.execution_id: _outcome(landed.get(i)) for i, c in enumerate(commits, 1)}


def _folds(c: TurnCommit) -> bool:
    """Whether `c` ends its run in the turn of its last event, a step's result.

    Any state that writes an outcome folds: a cancellation asked meanwhile turns
    a completing commit into `run.cancelled`, which then carries the step.
    """
    if c.state is None or not c.state.terminal or not c.events:
        return False
    last = c.events[-1]
    return last.kind == Event.STEP_COMPLETED and last.wake_in is None and last.position is not None


def _folded(event: NewEvent | None) -> list[Any] | None:
    return None if event is None else [event.position, event.name, event.payload]


def _names(names: list[str]) -> str:
    """Names joined by commas; a name holds none (core/rules.py), checked anyway."""
    joined = ",".join(names)
    if names and joined.count(",") != len(names) - 1:
        raise StoreRejected(f"a name holds a comma: {names!r}")
    return joined


def _outcome(landed: tuple[bool, list[dict[str, Any]] | None] | None) -> CommitOutcome:
    if landed is None:
        return _LOST
    cancel, sent = landed
    if sent is not None:
        return CommitOutcome(True, cancel, tuple(sent))
    return _CANCEL if cancel else _LANDED


_LANDED, _CANCEL, _LOST = CommitOutcome(True), CommitOutcome(True, True), CommitOutcome(False)


def _claim(row: tuple[Any, ...]) -> Claim:
    """A claim_tasks() row (columns in the function's order) as a Claim."""
    (execution_id, lease_token, claims, tenant, workflow_name, workflow_version, workflow_id,
     input_json, cancel_requested, db_now, history, signals, _) = row
    return Claim(
        execution_id=execution_id,
        lease_token=lease_token,
        claims=claims,
        tenant=tenant,
        workflow_name=workflow_name,
        workflow_version=workflow_version,
        workflow_id=workflow_id,
        input=json.loads(input_json),
        cancel_requested=cancel_requested,
        db_now=db_now,
        history=tuple(
            HistoryEvent(seq, position, kind, name, payload)
            for seq, position, kind, name, payload in json.loads(history)
        ) if history else (),
        signals=tuple(
            BufferedSignal(sid, name, payload, key, datetime.fromisoformat(received_at))
            for sid, name, payload, key, received_at in json.loads(signals)
        ) if signals else (),
    )
