"""What a workflow's child calls take and give back (docs/composition.md)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from shardq.core.errors import ChildFailed

ParentClosePolicy = Literal["cancel", "abandon", "wait"]
POLICIES: tuple[ParentClosePolicy, ...] = ("cancel", "abandon", "wait")
"""What becomes of a child its parent outlives it not: `cancel` (the default) asks it to
cancel when the parent ends first; `abandon` lets it run on; `wait` keeps a completing
parent open until the child ended (a cancelled or failed parent leaves it running)."""

CHILD_SIGNAL = "shardq:run:child"
"""The reserved signal name a child's outcome reaches its parent under (schema/0023)."""

MAX_CHILDREN_BATCH = 10_000
"""Children one `start_children` call may start: they go in one commit."""


@dataclass(frozen=True)
class ChildRequest:
    """A child to start: `ctx.start_children` takes a list of them."""

    workflow: str
    workflow_id: str
    input: Any = None
    policy: ParentClosePolicy = "cancel"


@dataclass(frozen=True)
class ChildHandle:
    """A started child: what `ctx.wait_child` and `ctx.wait_children` wait for."""

    execution_id: uuid.UUID
    workflow: str
    workflow_id: str
    policy: ParentClosePolicy = "cancel"


@dataclass(frozen=True)
class ChildOutcome:
    """How a child ended: `state` is completed, failed, cancelled or timed_out; `output`
    is its return value (completed only), `error` the type and message of its failure."""

    handle: ChildHandle
    state: str
    output: Any = None
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.state == "completed"

    def result(self) -> Any:
        """The child's output; ChildFailed (catchable) when it did not complete."""
        if self.state != "completed":
            raise ChildFailed(self.handle.workflow, self.handle.workflow_id, self.state,
                              self.error)
        return self.output

    @classmethod
    def of(cls, handle: ChildHandle, payload: dict[str, Any]) -> ChildOutcome:
        """From the outcome a child's end sent its parent (deliver_control)."""
        return cls(handle, payload["state"], payload.get("output"), payload.get("error"))


@dataclass(frozen=True)
class ChildInfo:
    """A child as its parent's run view lists it: `ended` is its end state once its
    outcome reached the parent, None while it runs."""

    child_id: uuid.UUID
    workflow: str
    workflow_id: str
    position: int
    policy: str
    ended: str | None


@dataclass(frozen=True)
class ChildStart:
    """A child run a turn's commit starts: on the parent's shard (`here`) or through the
    outbox."""

    position: int
    child_id: uuid.UUID
    here: bool
    workflow: str
    version: int
    workflow_id: str
    input_json: str
    priority: int
    policy: str
    gates: tuple[str, ...] | None
