"""What the store is asked to write: the parameter objects of `Store`'s methods.

Each is frozen and already checked (names, bounds, payload JSON) by whoever
built it: the client, the relay or a workflow's turn. The store trusts them
and only translates them into one statement's parameters. Values that travel
through several layers (a run being started, a signal on its way, a lease from
claim to heartbeat) get a named object here rather than a positional tuple, so
a reader of any layer sees the same field names the SQL uses.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from shardq.shards.routing import bucket_for, bucket_for_key, new_execution_id


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to insert unless its workflow key already has one."""

    execution_id: uuid.UUID
    workflow_id: str
    input_json: str
    bucket: int
    """The bucket `execution_id` was minted for: it routes the run to its shard."""
    concurrency: tuple[str, int] | None = None
    """The run's concurrency key and its limit, checked; the bucket is then the key's."""


@dataclass(frozen=True)
class StartBatch:
    """Runs of one workflow and tenant to start in one commit on one shard."""

    tenant: str
    workflow_name: str
    workflow_version: int
    runs: Sequence[NewRun]
    gates: Sequence[str] = ()
    """The signal names each new run takes once (a declarative workflow's gates)."""
    priority: int = 0
    """The new runs' priority, checked (core/rules.py's check_priority)."""
    trace: str | None = None
    """The starting span's traceparent (core/tracing.py): the runs' first turns continue it."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed run and the token that fences its writes."""

    execution_id: uuid.UUID
    token: uuid.UUID


@dataclass(frozen=True, slots=True)
class SignalDelivery:
    """A signal whose name, payload and key passed the checks; ready to deliver."""

    target: uuid.UUID
    name: str
    payload_json: str
    idempotency_key: str | None
    origin: str | None = None
    """The outbox row a relayed signal is delivered under: a repeat of one is
    collapsed like a repeated idempotency key."""
    trace: str | None = None
    """The sender's traceparent (core/tracing.py): the turn that consumes it continues it."""


@dataclass(frozen=True)
class StartSignalled:
    """signal_with_start's request: start `run` unless its key has a run, then signal it."""

    start: StartBatch
    """Exactly one run."""
    name: str
    payload_json: str
    idempotency_key: str | None


@dataclass(frozen=True)
class InterruptDecision:
    """A person's answer to a run's open interrupt, as the store records it."""

    execution_id: uuid.UUID
    tenant: str
    name: str
    position: int | None
    """The interrupt's position in the run's history, as read just before: the
    decision lands only on that very wait."""
    action: str
    payload_json: str
    decision_id: str
    actor: str


def placed_run(tenant: str, workflow: str, workflow_id: str, input_json: str,
               concurrency: tuple[str, int] | None) -> NewRun:
    """A run of this key under a fresh id of its bucket: the key's, or its concurrency
    key's when it has one (every run of a key, its limit and its queue on one shard)."""
    bucket = (bucket_for(tenant, workflow, workflow_id) if concurrency is None
              else bucket_for_key(concurrency[0]))
    return NewRun(new_execution_id(bucket), workflow_id, input_json, bucket, concurrency)
