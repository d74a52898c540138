"""The outbox's values: a claimed row, what a relay round settles, and what an operator
reads (the backlog per target bucket, a failed row). No SQL, no driver types."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class OutboxRow:
    """A claimed outbox row: one signal a relay owes a run of another shard."""

    id: int
    source_execution_id: uuid.UUID
    source_position: int
    target: uuid.UUID
    target_bucket: int
    tenant: str
    name: str
    payload_json: str
    idempotency_key: str | None
    attempts: int
    """Failed attempts so far."""
    queued_s: float
    """Seconds since the row entered the queue (written, or re-queued by an operator)."""
    trace: str | None = None
    """The sending turn's traceparent (core/tracing.py), when it was traced."""

    @property
    def origin(self) -> str:
        """The identity the relay delivers under; the target collapses a repeat of it."""
        return f"{self.source_execution_id}/{self.source_position}"


@dataclass
class OutboxSettlement:
    """What a relay round did with its claimed rows, written when its claim ends."""

    delivered: list[int] = field(default_factory=list)
    retry: list[tuple[int, float, str, str]] = field(default_factory=list)
    """(row id, seconds until the next attempt, reason code, detail)."""
    failed: list[tuple[int, str, str]] = field(default_factory=list)
    """(row id, reason code, detail): failed for good."""


@dataclass(frozen=True)
class OutboxBacklog:
    """One source shard's outbox rows owed to one target bucket."""

    target_bucket: int
    pending: int
    retrying: int
    failed: int
    oldest_pending_s: float | None


@dataclass(frozen=True)
class OutboxFailure:
    """A permanently failed outbox row, as an operator sees it."""

    id: int
    source_execution_id: uuid.UUID
    source_position: int
    target_execution_id: uuid.UUID
    tenant: str
    signal_name: str
    idempotency_key: str | None
    attempts: int
    failure_reason: str
    failure_detail: str | None
    created_at: datetime
    finished_at: datetime | None
