"""Reading runs with their derived state: one run by id, or pages with optional filters.

A run's state is not a column: it is `shardq.run_state()`, read from the
run's outcome event, task row and open wait. The page queries are built with
SQLAlchemy Core (optional filters compose cleanly there) and run through the
store's psycopg connection, so they share pools and errors with every other
statement. A filter's shape (which filters are set, which state) compiles once
per process, with the values as parameters: compiling cost ~1 ms a page.
SQLAlchemy is imported on the first page, not with this module: it costs a
command-line process 0.15 s of start-up that most commands never use. One run
by id is a fixed statement of queries.sql (`get_execution`).

Pages follow the execution id, whose leading bits are the creation
millisecond: an index walk in creation order that needs no created_at index.
A state filter also joins the table that holds runs in that state, so a page
of waiting runs walks `waits`, not every execution the shard ever held.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from shardq.core.errors import InvalidArgument
from shardq.core.models import TERMINAL_STATES, InterruptPage, Page, State

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
class PartialInterruptPage(InterruptPage):
    """A page of open interrupts from the shards that answered; `unavailable_shards`
    names the others (by name only), whose interrupts the page lacks.

    Its cursor is a position, so a page after it skips what an unavailable shard
    holds before that position: start again from the first page once it is back.
    """

    unavailable_shards: tuple[str, ...] = ()
    causes: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """Why each of `unavailable_shards` could not be read, in its order. They name hosts
    and ports: for an operator's eyes (the command line), never an API caller's."""


@dataclass(frozen=True)
class PartialPage(Page):
    """A page of runs from the shards that answered; `unavailable_shards` names the others,
    whose runs the page lacks, and `causes` says why (as PartialInterruptPage's).

    Its cursor is a position, so a page after it skips what an unavailable shard
    holds before that position: start again from the first page once it is back.
    """

    unavailable_shards: tuple[str, ...] = ()
    causes: tuple[str, ...] = field(default=(), repr=False, compare=False)


@dataclass(frozen=True)
class ListQuery:
    tenant: str | None = None
    state: State | None = None
    workflow: str | None = None
    limit: int = DEFAULT_PAGE
    after: Cursor | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise InvalidArgument(f"page size must be within 1..{MAX_PAGE}, got {self.limit}")


class _Shape(NamedTuple):
    """Which filters a page has: what its compiled text depends on."""

    tenant: bool
    workflow: bool
    after: bool
    state: State | None
    priority: bool = False


def compile_list(query: ListQuery) -> tuple[str, dict[str, Any]]:
    """SQL text and parameters for one shard's page, ordered by execution id."""
    shape = _Shape(query.tenant is not None, query.workflow is not None,
                   query.after is not None, query.state, query.priority is not None)
    params: dict[str, Any] = {"limit": query.limit}
    if query.tenant is not None:
        params["tenant"] = query.tenant
    if query.workflow is not None:
        params["workflow"] = query.workflow
    if query.after is not None:
        params["after"] = query.after.id
    if query.priority is not None:
        params["priority"] = query.priority
    text, constants = _page_statement(shape)
    return text, {**constants, **params}


@cache
def _page_statement(shape: _Shape) -> tuple[str, dict[str, Any]]:
    """The page's SQL text and its constant parameters (outcome kinds, state names)."""
    import sqlalchemy as sa  # noqa: PLC0415 - see the module docstring
    from sqlalchemy.dialects import postgresql  # noqa: PLC0415

    uuid_type = postgresql.UUID(as_uuid=True)
    metadata = sa.MetaData(schema="shardq")
    executions = sa.Table(
        "executions", metadata,
        sa.Column("id", uuid_type, primary_key=True),
        sa.Column("tenant", sa.Text),
        sa.Column("workflow_name", sa.Text),
        sa.Column("workflow_version", sa.Integer),
        sa.Column("workflow_id", sa.Text),
        sa.Column("input", postgresql.JSONB),
        sa.Column("created_at", sa.DateTime(timezone=True)),
        sa.Column("priority", sa.SmallInteger),
        sa.Column("build_id", sa.Text),
        sa.Column("pinned", sa.Boolean),
    )
    history = sa.Table(
        "history", metadata,
        sa.Column("execution_id", uuid_type),
        sa.Column("kind", sa.Text),
        sa.Column("payload", postgresql.JSONB),
        sa.Column("recorded_at", sa.DateTime(timezone=True)),
    )
    tasks = sa.Table(
        "tasks", metadata,
        sa.Column("execution_id", uuid_type, primary_key=True),
        sa.Column("cancel_requested", sa.Boolean),
    )
    waits = sa.Table(
        "waits", metadata,
        sa.Column("execution_id", uuid_type, primary_key=True),
        sa.Column("kind", sa.Text),
    )
    key_queue = sa.Table(
        "key_queue", metadata,
        sa.Column("execution_id", uuid_type, primary_key=True),
    )
    x = executions.c
    # Every column of `Execution`, state and outcome derived.
    outcome = (
        sa.select(history.c.payload, history.c.recorded_at)
        .where(history.c.execution_id == x.id, history.c.kind.in_(OUTCOME_KINDS))
        .lateral("outcome")
    )
    stmt = (
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
        .order_by(x.id)
        .limit(sa.bindparam("limit", 0, type_=sa.Integer))
    )
    # The buckets the reader's map gives this shard: a run being moved, on two
    # shards for a while, is read on one (schema/functions/holds_exactly.sql).
    mine = sa.cast(sa.bindparam("mine", "", type_=sa.Text), postgresql.BIT(4096))
    stmt = stmt.where(sa.or_(
        sa.select(sa.func.shardq.holds_exactly(mine)).scalar_subquery(),
        sa.func.get_bit(mine, sa.func.shardq.bucket(x.id)) == 1,
    ))
    if shape.tenant:
        stmt = stmt.where(x.tenant == sa.bindparam("tenant", "", type_=sa.Text))
    if shape.workflow:
        stmt = stmt.where(x.workflow_name == sa.bindparam("workflow", "", type_=sa.Text))
    if shape.after:
        stmt = stmt.where(x.id > sa.bindparam("after", None, type_=uuid_type))
    if shape.priority:
        stmt = stmt.where(x.priority == sa.bindparam("priority", 0, type_=sa.SmallInteger))
    state = shape.state
    if state is not None:
        # The filter is driven by the table that holds runs in that state.
        driver: sa.FromClause
        if state.terminal:
            ended = history.alias("ended")
            driver = ended
            on = sa.and_(ended.c.execution_id == x.id, ended.c.kind == f"run.{state.value}")
        elif state in (State.WAITING, State.INPUT_REQUIRED):
            parked = waits.alias("parked")
            driver = parked
            interrupt = parked.c.kind == "interrupt"
            on = sa.and_(parked.c.execution_id == x.id,
                         interrupt if state is State.INPUT_REQUIRED else sa.not_(interrupt))
        elif state is State.RUNNING:  # a task row
            queued = tasks.alias("queued")
            driver, on = queued, queued.c.execution_id == x.id
        else:  # pending: a task row, or a place in its concurrency key's queue
            due = sa.union_all(sa.select(tasks.c.execution_id),
                               sa.select(key_queue.c.execution_id)).subquery("due")
            driver, on = due, due.c.execution_id == x.id
        stmt = stmt.join(driver, on).where(sa.func.shardq.run_state(x.id) == state.value)
    compiled = stmt.compile(
        dialect=postgresql.psycopg.dialect(),  # type: ignore[no-untyped-call]
        compile_kwargs={"render_postcompile": True},
    )
    values = {"limit", "tenant", "workflow", "after", "mine", "priority"}  # the caller's, per page
    return str(compiled), {k: v for k, v in compiled.params.items() if k not in values}
