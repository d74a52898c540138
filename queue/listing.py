"""The one dynamic query: listing executions with optional filters and a keyset cursor.

Built with SQLAlchemy Core (optional filters compose cleanly there) and run
through the store's psycopg connection, so listing shares pools and errors
with every other statement.
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from shardq.queue.errors import InvalidArgument
from shardq.queue.models import State

_metadata = sa.MetaData(schema="shardq")
executions = sa.Table(
    "executions",
    _metadata,
    sa.Column("id", postgresql.UUID(as_uuid=True), primary_key=True),
    sa.Column("tenant", sa.Text),
    sa.Column("workflow_name", sa.Text),
    sa.Column("workflow_version", sa.Integer),
    sa.Column("workflow_id", sa.Text),
    sa.Column("state", sa.Text),
    sa.Column("input", postgresql.JSONB),
    sa.Column("output", postgresql.JSONB),
    sa.Column("error", postgresql.JSONB),
    sa.Column("cancel_requested", sa.Boolean),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
)
_dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]

DEFAULT_PAGE = 100
MAX_PAGE = 1000


@dataclass(frozen=True)
class Cursor:
    """Position after the last item of a page: (created_at, id), encoded opaquely."""

    created_at: datetime
    id: uuid.UUID

    def encode(self) -> str:
        raw = json.dumps([self.created_at.isoformat(), str(self.id)]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, value: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            created_at, ident = json.loads(raw)
            return cls(datetime.fromisoformat(created_at), uuid.UUID(ident))
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"invalid list cursor {value!r}") from exc


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


def compile_list(query: ListQuery) -> tuple[str, dict[str, Any]]:
    """SQL text and parameters for one shard's page, ordered by (created_at, id)."""
    c = executions.c
    stmt = sa.select(executions).order_by(c.created_at, c.id).limit(query.limit)
    if query.tenant is not None:
        stmt = stmt.where(c.tenant == query.tenant)
    if query.state is not None:
        stmt = stmt.where(c.state == query.state.value)
    if query.workflow is not None:
        stmt = stmt.where(c.workflow_name == query.workflow)
    if query.after is not None:
        stmt = stmt.where(sa.tuple_(c.created_at, c.id) > (query.after.created_at, query.after.id))
    compiled = stmt.compile(dialect=_dialect)
    return str(compiled), dict(compiled.params)
