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
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row

from shardq.core.attributes import AttributeFilter
from shardq.core.children import ChildInfo
from shardq.core.models import (
    BufferedSignal,
    Claim,
    CommitOutcome,
    Execution,
    HistoryEvent,
    OutboxEntry,
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
from shardq.store import commits as commits_sql
from shardq.store import listing, statements
from shardq.store.builds import BuildStore
from shardq.store.flow import FlowControlStore
from shardq.store.params import InterruptDecision, Lease, SignalDelivery, StartBatch, StartSignalled
from shardq.store.schedules import ScheduleStore
from shardq.store.statements import (
    LOCKED_RUN_ATTEMPTS,
    SQL,
    _TaskAppeared,
    buckets_of,
)

log = logging.getLogger(__name__)
R = TypeVar("R")


class Store(FlowControlStore, ScheduleStore, BuildStore):
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

    def _run(self, shard: Shard, op: statements.Op[R]) -> R:
        with self.connection(shard) as conn:
            return statements.run(conn, op)

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

    def read_histories(
        self, shard: Shard, ids: Sequence[uuid.UUID],
    ) -> dict[uuid.UUID, list[HistoryEvent]]:
        """The events of many runs of `shard` in one statement (`shardq replay`'s pages)."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.read_histories(ids))

    def list_executions(
        self, shard: Shard, query: listing.ListQuery, *, rows: int | None = None,
        shard_map: ShardMap | None = None,
    ) -> listing.ShardPage:
        """A page of `shard`'s runs (the rows of its first `rows` ids, or all), of the
        buckets `shard_map` (by default the store's current map) gives it: a reader of
        several shards passes the one map it read them by, so a run a move has on two
        shards is listed once."""
        return self._run(shard, statements.list_executions(
            query, buckets_of(shard_map or self.map, shard), rows))

    def executions_of(self, shard: Shard, ids: Sequence[uuid.UUID]) -> list[Execution]:
        """The runs of these ids `shard` holds, in id order (a listing page's rows)."""
        return self._run(shard, statements.executions_of(ids))

    def count_runs(
        self, shard: Shard, *, tenant: str | None, workflow: str | None,
        where: tuple[AttributeFilter, ...] = (), shard_map: ShardMap | None = None,
    ) -> list[tuple[str, str, int]]:
        """`shard`'s runs as (workflow, kind, n) rows (store/counts.py); with attribute
        filters, of the buckets `shard_map` gives it, as list_executions'."""
        return self._run(shard, statements.count_runs(
            tenant, workflow, where, buckets_of(shard_map or self.map, shard) if where else ""))

    def fold_run_counts(self, shard: Shard) -> int:
        """Fold `shard`'s appended count changes into its counters; how many (0 when
        another worker is folding them)."""
        with self.transaction(shard) as conn:
            row = conn.execute(SQL["fold_run_counts"]).fetchone()
        return int(row["folded"]) if row else 0

    # -- claiming and leases -------------------------------------------------

    def claim(
        self, shard: Shard, *, owner: str, limit: int, lease_s: float, min_priority: int = 0,
        build: str | None = None,
    ) -> tuple[list[Claim], float | None]:
        """Lease up to `limit` due tasks, each with a fresh token, history and pending signals,
        higher priority first (of `min_priority` and up only, when it is above 0): unpinned
        ones, and those pinned to `build` when the worker runs one (schema/0026).

        Also returns the seconds until the next task is due (None when there is
        none), read in the same round trip.
        """
        with self.connection(shard) as conn, conn.cursor(row_factory=tuple_row) as cur:
            # Tuples: a batch of rows is parsed on the worker's hot path.
            rows = cur.execute(SQL["claim_tasks"], {
                "owner": owner, "limit": limit, "lease_s": lease_s,
                "min_priority": min_priority,
                "after_tenant": self._fair_cursor.get(shard.name), "build": build}).fetchall()
        # The function's last row: the cursor of its walk over tenants (as its tenant),
        # next_due_in (in the column before the trace).
        last = rows.pop()
        self._fair_cursor[shard.name] = last[3]
        seconds = last[12]
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
            return commits_sql.commit_turns(conn, commits, lease_s)

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

    def outbox_of(self, shard: Shard, execution_id: uuid.UUID,
                  tenant: str) -> list[OutboxEntry]:
        """The outbox rows `shard` holds that `execution_id` sent or is sent, oldest first."""
        return self._run(shard, statements.outbox_of(execution_id, tenant))

    def children_of(self, shard: Shard, execution_id: uuid.UUID) -> list[ChildInfo]:
        with self.connection(shard) as conn:
            return statements.run(conn, statements.children_of(execution_id))

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


def listen_for_wakes(conn: DictConnection) -> str:
    """Make `conn` (autocommit, outside any pool) receive the shard's wake NOTIFYs;
    returns the channel's name."""
    return listen(conn, SQL["listen_statement"])


def ping(conn: DictConnection) -> None:
    """One round trip on `conn` (a LISTEN connection's check that its server answers)."""
    conn.execute(SQL["ping"]).fetchone()


def listen(conn: DictConnection, query: str) -> str:
    """Run the LISTEN that `query` builds (the channel's name is defined in SQL); returns
    the channel's name."""
    statement = conn.execute(query, {}).fetchone()
    assert statement is not None
    conn.execute(statement["statement"])
    return str(statement["channel"])


def _claim(row: tuple[Any, ...]) -> Claim:
    """A claim_tasks() row (columns in the function's order) as a Claim."""
    (execution_id, lease_token, claims, tenant, workflow_name, workflow_version, workflow_id,
     input_json, cancel_requested, db_now, history, signals, _, trace) = row
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
            BufferedSignal(sid, name, payload, key, datetime.fromisoformat(received_at), sent)
            for sid, name, payload, key, received_at, sent in json.loads(signals)
        ) if signals else (),
        trace=trace,
    )
