"""Reading runs with their derived state: one run by id, or pages with optional filters.

A run's state is not a column (see schema/0005): it is `shardq.run_state()`,
read from the run's outcome event, task row and open wait. The queries are
built with SQLAlchemy Core (optional filters compose cleanly there) and run
through the store's psycopg connection, so they share pools and errors with
every other statement.

Pages follow the execution id, whose leading bits are the creation
millisecond: an index walk in creation order that needs no created_at index.
A state filter also joins the table that holds runs in that state, so a page
of waiting runs walks `waits`, not every execution the shard ever held.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from shardq.queue.errors import InvalidArgument
from shardq.queue.models import TERMINAL_STATES, State

_metadata = sa.MetaData(schema="shardq")
executions = sa.Table(
    "executions",
    _metadata,
    sa.Column("id", postgresql.UUID(as_uuid=True), primary_key=True),
    sa.Column("tenant", sa.Text),
    sa.Column("workflow_name", sa.Text),
    sa.Column("workflow_version", sa.Integer),
    sa.Column("workflow_id", sa.Text),
    sa.Column("input", postgresql.JSONB),
    sa.Column("created_at", sa.DateTime(timezone=True)),
)
history = sa.Table(
    "history",
    _metadata,
    sa.Column("execution_id", postgresql.UUID(as_uuid=True)),
    sa.Column("kind", sa.Text),
    sa.Column("payload", postgresql.JSONB),
    sa.Column("recorded_at", sa.DateTime(timezone=True)),
)
tasks = sa.Table(
    "tasks",
    _metadata,
    sa.Column("execution_id", postgresql.UUID(as_uuid=True), primary_key=True),
    sa.Column("cancel_requested", sa.Boolean),
)
waits = sa.Table(
    "waits",
    _metadata,
    sa.Column("execution_id", postgresql.UUID(as_uuid=True), primary_key=True),
    sa.Column("kind", sa.Text),
)
_dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
OUTCOME_KINDS = tuple(f"run.{s.value}" for s in sorted(TERMINAL_STATES))
"""The history events that end a run (as in the history_outcome index)."""

DEFAULT_PAGE = 100
MAX_PAGE = 1000


@dataclass(frozen=True)
class Cursor:
    """Position after the last item of a page (its execution id), encoded opaquely."""

    id: uuid.UUID

    def encode(self) -> str:
        return base64.urlsafe_b64encode(self.id.bytes).decode().rstrip("=")

    @classmethod
    def decode(cls, value: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            return cls(uuid.UUID(bytes=raw))
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"invalid list cursor {value!r}") from exc


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MIN_MICROS = (datetime(1, 1, 2, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_MAX_MICROS = (datetime(9999, 12, 30, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class InboxCursor:
    """Position after the last open interrupt of a page: (requested at, execution id)."""

    at: datetime
    id: uuid.UUID

    def encode(self) -> str:
        micros = (self.at - _EPOCH) // timedelta(microseconds=1)
        raw = micros.to_bytes(8, "big", signed=True) + self.id.bytes
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, value: str) -> InboxCursor:
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            if len(raw) != 24:
                raise ValueError("wrong length")
            # A position, not a secret: a forged one outside the calendar is its end.
            micros = min(max(int.from_bytes(raw[:8], "big", signed=True), _MIN_MICROS),
                         _MAX_MICROS)
            at = _EPOCH + timedelta(microseconds=micros)
            return cls(at, uuid.UUID(bytes=raw[8:]))
        except (ValueError, TypeError, OverflowError) as exc:
            raise InvalidArgument(f"invalid inbox cursor {value!r}") from exc


@dataclass(frozen=True)
class ListQuery:
    tenant: str | None = None
    state: State | None = None
    workflow: str | None = None
    limit: int = DEFAULT_PAGE
    after: Cursor | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise InvalidArgument(f"page size must be within 1..{MAX_PAGE}, got {self.limit}")


def _runs() -> sa.Select[Any]:
    """Every column of `Execution`, state and outcome derived, for the rows it is given."""
    x = executions.c
    outcome = (
        sa.select(history.c.payload, history.c.recorded_at)
        .where(history.c.execution_id == x.id, history.c.kind.in_(OUTCOME_KINDS))
        .lateral("outcome")
    )
    return (
        sa.select(
            *executions.c,
            sa.func.shardq.run_state(x.id).label("state"),
            outcome.c.payload["output"].label("output"),
            outcome.c.payload["error"].label("error"),
            outcome.c.recorded_at.label("finished_at"),
            sa.func.coalesce(tasks.c.cancel_requested, False).label("cancel_requested"),
        )
        .select_from(executions)
        .outerjoin(outcome, sa.true())
        .outerjoin(tasks, tasks.c.execution_id == x.id)
    )


def compile_get(execution_id: uuid.UUID) -> tuple[str, dict[str, Any]]:
    """SQL text and parameters reading one run."""
    return _compiled(_runs().where(executions.c.id == execution_id))


def compile_list(query: ListQuery) -> tuple[str, dict[str, Any]]:
    """SQL text and parameters for one shard's page, ordered by execution id."""
    x = executions.c
    stmt = _runs().order_by(x.id).limit(query.limit)
    if query.tenant is not None:
        stmt = stmt.where(x.tenant == query.tenant)
    if query.workflow is not None:
        stmt = stmt.where(x.workflow_name == query.workflow)
    if query.after is not None:
        stmt = stmt.where(x.id > query.after.id)
    if query.state is not None:
        stmt = _in_state(stmt, query.state)
    return _compiled(stmt)


def _in_state(stmt: sa.Select[Any], state: State) -> sa.Select[Any]:
    """Filter on the derived state, driven by the table that holds runs in it."""
    x = executions.c
    if state.terminal:
        ended = history.alias("ended")
        driver: sa.FromClause = ended
        on = sa.and_(ended.c.execution_id == x.id, ended.c.kind == f"run.{state.value}")
    elif state in (State.WAITING, State.INPUT_REQUIRED):
        parked = waits.alias("parked")
        driver = parked
        interrupt = parked.c.kind == "interrupt"
        on = sa.and_(parked.c.execution_id == x.id,
                     interrupt if state is State.INPUT_REQUIRED else sa.not_(interrupt))
    else:  # running or pending: a task row
        queued = tasks.alias("queued")
        driver, on = queued, queued.c.execution_id == x.id
    return stmt.join(driver, on).where(sa.func.shardq.run_state(x.id) == state.value)


def _compiled(stmt: sa.Select[Any]) -> tuple[str, dict[str, Any]]:
    compiled = stmt.compile(dialect=_dialect, compile_kwargs={"render_postcompile": True})
    return str(compiled), dict(compiled.params)
