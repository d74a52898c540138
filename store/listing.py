"""Finding pages of runs by filter: the ids of one shard's page, in id order.

A page's filters are built with SQLAlchemy Core (optional filters compose cleanly
there) into one statement per filter shape (which filters are set, which state),
compiled once per process with the values as parameters, and run through the
store's psycopg connection, so they share pools and errors with every other
statement. SQLAlchemy is imported on the first page, not with this module: it
costs a command-line process 0.15 s of start-up that most commands never use.

Pages follow the execution id, whose leading bits are the creation millisecond:
an index walk in creation order that needs no created_at index, and a creation
window is an id range. Every filter is a range of one index that yields its runs
in id order (`_driver`, schema/0028), so a page reads about `limit` entries a
shard at a million runs a shard (tests/integration/test_listing.py holds it).
The page's rows, state and outcome derived, are read by id afterwards, and only
for the ids the page keeps (queries.sql, `executions_of`): over many shards, the
ids of every shard's page are merged first, and rows are read for the winners.
"""
from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from shardq.core.attributes import MAX_FILTERS, AttributeFilter
from shardq.core.errors import InvalidArgument
from shardq.core.models import Execution, InterruptPage, Page, State

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
class ShardPage:
    """One shard's page: its ids in order, and the rows of the first `read` of them
    (a run purged since its id was read has none)."""

    ids: list[uuid.UUID]
    runs: list[Execution]
    read: int


@dataclass(frozen=True)
class ListQuery:
    tenant: str | None = None
    state: State | None = None
    workflow: str | None = None
    limit: int = DEFAULT_PAGE
    after: Cursor | None = None
    priority: int | None = None
    created_after: datetime | None = None
    """Runs created at or after this time (by their id's millisecond), if set."""
    created_before: datetime | None = None
    """Runs created before this time, if set."""
    where: tuple[AttributeFilter, ...] = ()
    """Conditions on search attributes, all of which a run meets (core/attributes.py)."""

    def __post_init__(self) -> None:
        # An equality drives the page when there is one: its runs are one range in id order.
        object.__setattr__(self, "where", tuple(sorted(self.where, key=lambda f: f.op != "=")))
        if not 1 <= self.limit <= MAX_PAGE:
            raise InvalidArgument(f"page size must be within 1..{MAX_PAGE}, got {self.limit}")
        for name in ("created_after", "created_before"):
            at = getattr(self, name)
            if at is not None and (not isinstance(at, datetime) or at.utcoffset() is None):
                raise InvalidArgument(f"{name} must be a datetime with a time zone, got {at!r}")


def id_floor(at: datetime) -> uuid.UUID:
    """The smallest execution id minted at `at`'s millisecond or later: ids lead with
    their creation millisecond (shards/routing.new_execution_id), so a time window is
    an id range. Times outside the ids' 48 bits of milliseconds are their ends."""
    ms = (at - _EPOCH) // timedelta(milliseconds=1)
    return uuid.UUID(int=min(max(ms, 0), (1 << 48) - 1) << 80)


class _Shape(NamedTuple):
    """Which filters a page has: what its compiled text depends on."""

    tenant: bool
    workflow: bool
    after: bool
    state: State | None
    priority: bool = False
    since: bool = False
    until: bool = False
    where: tuple[tuple[str, bool], ...] = ()
    """Each attribute filter's operator and whether it compares numbers."""


def compile_list(query: ListQuery) -> tuple[str, dict[str, Any]]:
    """SQL text and parameters for one shard's page, ordered by execution id."""
    shape = _shape_of(query)
    params: dict[str, Any] = {"limit": query.limit, **_where_params(query.where)}
    if query.tenant is not None:
        params["tenant"] = query.tenant
    if query.workflow is not None:
        params["workflow"] = query.workflow
    if query.after is not None:
        params["after"] = query.after.id
    if query.priority is not None:
        params["priority"] = query.priority
    if query.created_after is not None:
        params["since"] = id_floor(query.created_after)
    if query.created_before is not None:
        params["until"] = id_floor(query.created_before)
    text, constants = _page_statement(shape)
    return text, {**constants, **params}


def _shape_of(query: ListQuery) -> _Shape:
    return _Shape(query.tenant is not None, query.workflow is not None,
                  query.after is not None, query.state, query.priority is not None,
                  query.created_after is not None, query.created_before is not None,
                  tuple((f.op, f.numeric) for f in query.where))


def _where_params(where: tuple[AttributeFilter, ...]) -> dict[str, Any]:
    return {k: v for n, f in enumerate(where)
            for k, v in ((f"attr_{n}", f.name), (f"value_{n}", f.value))}


def compile_count(query: ListQuery) -> tuple[str, dict[str, Any]]:
    """SQL text and parameters counting one shard's runs of a query with attribute
    filters, as (workflow, state, n) rows: the runs its page would walk, with no limit,
    each with its state (no counters are kept per value: a count reads its matches)."""
    params: dict[str, Any] = {"limit": None, **_where_params(query.where)}
    if query.tenant is not None:
        params["tenant"] = query.tenant
    if query.workflow is not None:
        params["workflow"] = query.workflow
    text, constants = _count_statement(_shape_of(query))
    return text, {**constants, **params}


_PER_PAGE = frozenset({"limit", "tenant", "workflow", "after", "mine", "priority", "since",
                       "until", *(f"{k}_{n}" for k in ("attr", "value")
                                  for n in range(MAX_FILTERS))})
"""The parameters a caller gives each page; every other one is a constant of the shape."""


@cache
def _page_statement(shape: _Shape) -> tuple[str, dict[str, Any]]:
    """The page's SQL text (its ids, in order) and its constant parameters."""
    import sqlalchemy as sa  # noqa: PLC0415 - see the module docstring
    from sqlalchemy.dialects import postgresql  # noqa: PLC0415

    return _compiled(postgresql, _driver(sa, postgresql, _tables(sa, postgresql), shape))


@cache
def _count_statement(shape: _Shape) -> tuple[str, dict[str, Any]]:
    """The count's SQL text ((workflow, state, n) rows) and its constant parameters."""
    import sqlalchemy as sa  # noqa: PLC0415 - see the module docstring
    from sqlalchemy.dialects import postgresql  # noqa: PLC0415

    t = _tables(sa, postgresql)
    matched = _driver(sa, postgresql, t, shape).subquery("matched")  # with no limit
    run = t.executions.alias("run")
    state = sa.func.shardq.run_state(run.c.id).label("state")
    return _compiled(postgresql, sa.select(run.c.workflow_name, state,
                                           sa.func.count().label("n"))
                     .select_from(matched).join(run, run.c.id == matched.c.id)
                     .group_by(run.c.workflow_name, state))


def _compiled(postgresql: Any, stmt: Any) -> tuple[str, dict[str, Any]]:
    compiled = stmt.compile(
        dialect=postgresql.psycopg.dialect(),
        compile_kwargs={"render_postcompile": True},
    )
    return str(compiled), {k: v for k, v in compiled.params.items() if k not in _PER_PAGE}


class _Tables(NamedTuple):
    executions: Any
    tasks: Any
    waits: Any
    key_queue: Any
    ended_runs: Any
    run_attributes: Any


@cache
def _tables(sa: Any, postgresql: Any) -> _Tables:
    """The columns of shardq's tables that a page's filters read (schema/current.sql)."""
    uuid_type = postgresql.UUID(as_uuid=True)
    metadata = sa.MetaData(schema="shardq")
    executions = sa.Table(
        "executions", metadata,
        sa.Column("id", uuid_type, primary_key=True),
        sa.Column("tenant", sa.Text),
        sa.Column("workflow_name", sa.Text),
        sa.Column("priority", sa.SmallInteger),
    )
    tasks = sa.Table(
        "tasks", metadata,
        sa.Column("execution_id", uuid_type, primary_key=True),
        sa.Column("leased_until", sa.DateTime(timezone=True)),
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
    run_attributes = sa.Table(
        "run_attributes", metadata,
        sa.Column("execution_id", uuid_type, primary_key=True),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("tenant", sa.Text),
        sa.Column("text_value", sa.Text),
        sa.Column("num_value", sa.Float),
    )
    ended_runs = sa.Table(
        "ended_runs", metadata,
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("state", sa.Text, primary_key=True),
        sa.Column("execution_id", uuid_type, primary_key=True),
        sa.Column("workflow_name", sa.Text),
    )
    return _Tables(executions, tasks, waits, key_queue, ended_runs, run_attributes)


def _driver(sa: Any, postgresql: Any, t: _Tables, shape: _Shape) -> Any:
    """The page's ids, in order, from the one index whose range holds them (schema/0028):

    - no state: `executions_tenant (tenant, id)`, `executions_workflow (tenant,
      workflow_name, id)`, or the primary key for every tenant;
    - an ended state: `ended_runs`' primary key `(tenant, state, id)` or
      `ended_runs_workflow (tenant, workflow_name, state, id)`;
    - a live state: the table that holds runs in it (waits, tasks, key_queue), whose
      rows are the shard's live runs only, each checked with `shardq.run_state` (`_live`).

    A time window and the cursor bound the id within that range, so a page reads
    about `limit` entries and a range with no run reads one descent. The priority
    filter alone is not a range: a page of a rare priority reads past the others; nor
    is a workflow combined with a live state (the state's live rows are read until the
    page is full), nor `running` (the task rows are read: leases are not indexed).
    Every tenant's page of an indexed range that leads with the tenant walks the
    range once per tenant (found by a loose scan of executions_tenant, one descent
    each) and merges them: a page per tenant, not a scan of every tenant's runs.
    """
    state = shape.state
    per_tenant = not shape.tenant and (
        bool(shape.where) or (state.terminal if state is not None else shape.workflow))
    tenants = None
    if per_tenant:
        found = t.executions.alias("found")
        first = sa.select(sa.func.min(found.c.tenant).label("tenant")).cte(
            "tenants", recursive=True)
        later = t.executions.alias("later")
        tenants = first.union_all(
            sa.select(sa.select(sa.func.min(later.c.tenant))
                      .where(later.c.tenant > first.c.tenant).scalar_subquery())
            .where(first.c.tenant.is_not(None)))
    tenant = (tenants.c.tenant if tenants is not None
              else sa.bindparam("tenant", "", type_=sa.Text) if shape.tenant else None)
    src, ident = _source(sa, postgresql, t, shape, tenant)
    uuid_type = postgresql.UUID(as_uuid=True)
    for name, bound in (("after", shape.after), ("since", shape.since), ("until", shape.until)):
        if bound:
            param = sa.bindparam(name, None, type_=uuid_type)
            src = src.where(ident > param if name == "after"
                            else ident >= param if name == "since" else ident < param)
    src = src.where(_mine(sa, postgresql, ident))
    limit = sa.bindparam("limit", 0, type_=sa.Integer)
    src = src.order_by(ident).limit(limit)
    if tenants is None:
        return src
    each = src.lateral("each")
    return sa.select(each.c.id).select_from(tenants).join(each, sa.true()).order_by(
        each.c.id).limit(limit)


def _mine(sa: Any, postgresql: Any, ident: Any) -> Any:
    """The buckets the reader's map gives this shard: a run being moved, on two shards
    for a while, is read on one (schema/functions/holds_exactly.sql)."""
    mine = sa.cast(sa.bindparam("mine", "", type_=sa.Text), postgresql.BIT(4096))
    return sa.or_(sa.select(sa.func.shardq.holds_exactly(mine)).scalar_subquery(),
                  sa.func.get_bit(mine, sa.func.shardq.bucket(ident)) == 1)


def _source(sa: Any, postgresql: Any, t: _Tables, shape: _Shape,
            tenant: Any) -> tuple[Any, Any]:
    """The page's ids before the bounds, and the id column they are ordered by."""
    if shape.where:
        return _attributed(sa, postgresql, t, shape, tenant)
    state = shape.state
    run = t.executions.alias("run")
    workflow = sa.bindparam("workflow", "", type_=sa.Text)
    priority = sa.bindparam("priority", 0, type_=sa.SmallInteger)
    if state is not None and state.terminal:
        ended = t.ended_runs.alias("ended")
        ident = ended.c.execution_id
        src = sa.select(ident.label("id")).select_from(ended).where(ended.c.state == state.value)
        if tenant is not None:
            src = src.where(ended.c.tenant == tenant)
        if shape.workflow:
            src = src.where(ended.c.workflow_name == workflow)
        if shape.priority:
            src = src.join(run, run.c.id == ident).where(run.c.priority == priority)
        return src, ident
    if state is not None:
        return _live(sa, postgresql, t, shape, tenant)
    ident = run.c.id
    src = sa.select(ident.label("id")).select_from(run)
    if tenant is not None:
        src = src.where(run.c.tenant == tenant)
    if shape.workflow:
        src = src.where(run.c.workflow_name == workflow)
    if shape.priority:
        src = src.where(run.c.priority == priority)
    return src, ident


def _live(sa: Any, postgresql: Any, t: _Tables, shape: _Shape, tenant: Any) -> tuple[Any, Any]:
    """A live `state`'s page: the table that holds runs in it (waits; tasks; tasks and a
    key's queue for pending), walked in id order, each row's run probed for the other
    filters and its run_state. The probe is a subquery kept apart (OFFSET 0), so it runs
    for the rows the walk reaches before the page is full and no further: joined, the
    planner merged the run's index with the live table's and checked the state of every
    run it passed, live or not (a 1 s page at a million runs); as a filter of the live
    table, run_state ran for each of its rows before they were sorted."""
    state = shape.state
    driver: Any
    if state in (State.WAITING, State.INPUT_REQUIRED):
        parked = t.waits.alias("parked")
        interrupt = parked.c.kind == "interrupt"
        ident = parked.c.execution_id
        driver = sa.select(ident.label("id")).where(
            interrupt if state is State.INPUT_REQUIRED else sa.not_(interrupt))
    elif state is State.RUNNING:  # a task row under a live lease (the queue's rows are
        # read: leases are not indexed, so that a claim updates its rows in place)
        ident = t.tasks.c.execution_id
        driver = sa.select(ident.label("id")).where(t.tasks.c.leased_until > sa.func.now())
    else:  # pending: a task row, or a place in its concurrency key's queue (both walked
        # by their keys and merged: a filter on the lease here made the planner read and
        # sort every task; a leased one is left out by its state in the probe)
        due = sa.union_all(sa.select(t.tasks.c.execution_id.label("id")),
                           sa.select(t.key_queue.c.execution_id.label("id"))).subquery("due")
        ident = due.c.id
        driver = sa.select(ident.label("id"))
    run = t.executions.alias("run")
    probe = sa.select(sa.func.shardq.run_state(run.c.id).label("state")).where(run.c.id == ident)
    # The filters inside the probe: a run they leave out costs no run_state.
    if tenant is not None:
        probe = probe.where(run.c.tenant == tenant)
    if shape.workflow:
        probe = probe.where(run.c.workflow_name == sa.bindparam("workflow", "", type_=sa.Text))
    if shape.priority:
        probe = probe.where(run.c.priority == sa.bindparam("priority", 0, type_=sa.SmallInteger))
    probe = probe.offset(sa.literal_column("0")).lateral("probe")
    src = driver.join_from(driver.get_final_froms()[0], probe, sa.true())
    # The state, exactly, as "none of the others": the planner takes an equality on
    # a function for 0.5% of rows, so a page of 100 would look like the whole table's
    # matches and be read whole and sorted; as 7 inequalities it looks like most rows,
    # and the walk in id order stops at the page's last row.
    others = sa.literal([s.value for s in State if s is not state], postgresql.ARRAY(sa.Text))
    return src.where(probe.c.state != sa.all_(others)), ident


def _compare(sa: Any, attributes: Any, n: int, op: str, numeric: bool) -> Any:
    """Attribute filter `n`: its name, and its value compared with the column of its type."""
    column = attributes.c.num_value if numeric else attributes.c.text_value
    value = sa.bindparam(f"value_{n}", 0.0 if numeric else "",
                         type_=sa.Float if numeric else sa.Text)
    compared = {"=": column == value, "<": column < value, "<=": column <= value,
                ">": column > value, ">=": column >= value}[op]
    return sa.and_(attributes.c.name == sa.bindparam(f"attr_{n}", "", type_=sa.Text), compared)


def _attributed(sa: Any, postgresql: Any, t: _Tables, shape: _Shape,
                tenant: Any) -> tuple[Any, Any]:
    """A page with attribute filters: its first filter's range of `run_attributes_text`
    or `run_attributes_num` (schema/0030), led by the tenant and the attribute's name.
    An equality (the first when there is one) yields its runs in id order, so the
    page reads about `limit` entries; a range of values is read whole and its runs
    sorted by id. The other filters are probes of each run the walk reaches: its
    other attributes and an ended state by their tables' primary keys; its workflow,
    priority and live state from its row, probed apart (OFFSET 0, as `_live`'s). A
    page thus reads its first filter's runs until the others have kept `limit` of
    them: give the most selective equality first."""
    first = t.run_attributes.alias("attr_0")
    op, numeric = shape.where[0]
    ident = first.c.execution_id
    src = sa.select(ident.label("id")).select_from(first).where(
        _compare(sa, first, 0, op, numeric))
    if tenant is not None:
        src = src.where(first.c.tenant == tenant)
    state = shape.state
    if state is not None and state.terminal:  # one probe of ended_runs' primary key
        ended = t.ended_runs.alias("ended")
        src = src.where(sa.exists().where(ended.c.tenant == first.c.tenant,
                                          ended.c.state == state.value,
                                          ended.c.execution_id == ident))
        state = None
    for n, (op, numeric) in enumerate(shape.where[1:], 1):
        other = t.run_attributes.alias(f"attr_{n}")
        src = src.where(sa.exists().where(other.c.execution_id == ident,
                                          _compare(sa, other, n, op, numeric)))
    if not (shape.workflow or shape.priority or state):
        return src, ident
    run = t.executions.alias("run")
    probe = sa.select(sa.func.shardq.run_state(run.c.id).label("state") if state
                      else run.c.id).where(run.c.id == ident)
    if shape.workflow:
        probe = probe.where(run.c.workflow_name == sa.bindparam("workflow", "", type_=sa.Text))
    if shape.priority:
        probe = probe.where(run.c.priority == sa.bindparam("priority", 0, type_=sa.SmallInteger))
    probe = probe.offset(sa.literal_column("0")).lateral("probe")
    src = src.join(probe, sa.true())
    if state is not None:
        others = sa.literal([s.value for s in State if s is not state], postgresql.ARRAY(sa.Text))
        src = src.where(probe.c.state != sa.all_(others))
    return src, ident
