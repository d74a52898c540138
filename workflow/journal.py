"""What a turn has to write, and the lease token that fences it.

The context buffers a turn's events here. They are committed before anything
else can have an effect outside the workflow: before the next step runs (a
checkpoint, `flush`) and with the commit that ends the turn (parking,
completion, failure; built by `commit` and made by the worker). A one-step job
therefore costs one commit, and no step ever starts before its predecessors
are durable.

Events a replay would record again, identically, from what is already durable
need no commit of their own before a step: a consumed signal (a run's signals
become visible in id order, so a replay after a crash consumes the same one)
and a fired timer (the database clock only moves on). A run resumed by a signal
thus commits the consumption with its next step's result, one commit instead of
two on the signal -> step path. (A condition's consumed signals and its being
met are replayed alike.)
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from shardq.core.children import ChildStart
from shardq.core.errors import StoreRejected
from shardq.core.models import (
    Claim,
    CommitOutcome,
    Event,
    ExternalRequest,
    NewEvent,
    OpenWait,
    OutboxRequest,
    State,
    TaskAction,
    TurnCommit,
)
from shardq.workflow.control import CommitRejected, TurnAborted

log = logging.getLogger(__name__)

Checkpoint = Callable[[TurnCommit], CommitOutcome]
"""Makes a mid-turn commit and blocks until it is durable; raises on store errors."""
REPLAYABLE = frozenset({
    Event.SIGNAL_CONSUMED, Event.TIMER_FIRED, Event.CONDITION_CONSUMED, Event.CONDITION_MET,
})
"""Event kinds a replay records identically from durable state (see the module doc)."""


class Journal:
    """A turn's buffered writes (`events`, `consumed`, `close_wait`) and its lease token.

    Used by one turn thread only: the context appends, the turn builds the
    ending commit.
    """

    __slots__ = (
        "_checkpoint", "_execution_id", "_stored_state", "_token",
        "cancel_requested", "children", "close_wait", "consumed", "events", "externals",
        "family", "outbox", "sent", "trace",
    )

    def __init__(self, claim: Claim, checkpoint: Checkpoint) -> None:
        self._checkpoint = checkpoint
        self._execution_id = claim.execution_id
        self._token = claim.lease_token  # rotated by every commit that lands
        self._stored_state = State.RUNNING  # what a claimed run reads as
        self.events: list[NewEvent] = []
        """Recorded since the last commit."""
        self.consumed: list[tuple[int, int]] = []
        """(signal id, position) pairs consumed since the last commit."""
        self.close_wait = False
        """The wait the run resumed from was closed by a call since the last commit."""
        self.externals: list[ExternalRequest] = []
        """Signals to other runs of the shard, to deliver with the next commit."""
        self.outbox: list[OutboxRequest] = []
        """Signals to runs of other shards, to write to the outbox with the next commit."""
        self.sent: tuple[dict[str, Any], ...] = ()
        """The outcomes of the externals the last checkpoint delivered."""
        self.cancel_requested = False
        """A checkpoint that landed found the run's cancellation requested."""
        self.children: list[ChildStart] = []
        """Child runs to start with the next commit."""
        self.family = family_of(claim)
        """The run's parent ((None,) for a parent that is no child), if it is in a family."""
        self.trace: str | None = None
        """The turn's traceparent (core/tracing.py): the signals its commits send carry it."""

    @property
    def lease_token(self) -> uuid.UUID:
        """The token the next commit is fenced by."""
        return self._token

    def commit(
        self,
        *,
        state: State | None,
        task: TaskAction,
        delay: float = 0.0,
        output_json: str | None = None,
        error: dict[str, Any] | None = None,
        open_wait: OpenWait | None = None,
        wake_on_signals: tuple[str, ...] = (),
        close_wait: bool = False,
        continued: tuple[str, int, int] | None = None,
    ) -> TurnCommit:
        """A commit of everything buffered, with this state and task; the buffer starts over.

        The state is left out when the run is already in it (a checkpoint of a
        running run writes no state).
        """
        commit = TurnCommit(
            execution_id=self._execution_id,
            lease_token=self._token,
            events=self.events,
            state=None if state == self._stored_state and output_json is None else state,
            output_json=output_json,
            error=error,
            task=task,
            delay=delay,
            open_wait=open_wait,
            close_wait=close_wait or self.close_wait,
            consumed_signals=self.consumed,
            wake_on_signals=wake_on_signals,
            externals=self.externals,
            outbox=self.outbox,
            children=self.children,
            family=self.family,
            continued=continued,
            trace=self.trace,
        )
        self.events, self.consumed, self.close_wait = [], [], False
        self.externals, self.outbox, self.children = [], [], []
        return commit

    def start_child(self, start: ChildStart) -> None:
        """Buffer a child's start: the next commit makes it, and tells the run's end to it."""
        self.children.append(start)
        if self.family is None:
            self.family = (None,)

    def flush(self) -> None:
        """Checkpoint before a side effect: commit what is buffered, blocking until durable.

        Nothing to commit when a replay would buffer the same events again. A
        landed commit also reads whether the run's cancellation has been
        requested since (`cancel_requested`). Raises
        TurnAborted when the lease was lost or the store stayed unavailable, and
        CommitRejected when the database refused a value of the commit.
        """
        events = self.events
        if not self.externals and not self.outbox and not self.children and (
            not events or all(e.kind in REPLAYABLE for e in events)
        ):
            return
        commit = self.commit(state=State.RUNNING, task=TaskAction.KEEP)
        try:
            outcome = self._checkpoint(commit)
        except StoreRejected as exc:
            raise CommitRejected(commit, exc) from exc
        except Exception as exc:
            # The store stayed unavailable through the completer's retries: the
            # turn is abandoned, never blamed on the workflow; the lease expires
            # and the run resumes from its last durable commit.
            log.warning("commit failed; turn abandoned",
                        extra={"execution_id": str(self._execution_id), "error": str(exc)})
            raise TurnAborted() from exc
        if not outcome.landed:
            raise TurnAborted()
        if commit.externals:
            if outcome.externals is None:
                # It landed, but a retry after a broken connection found that
                # out and not what it delivered: the replay reads it from history.
                raise TurnAborted()
            self.sent = outcome.externals
        self._token = commit.next_token
        if commit.state is not None:
            self._stored_state = commit.state
        self.cancel_requested = self.cancel_requested or outcome.cancel_requested


def family_of(claim: Claim) -> tuple[uuid.UUID | None] | None:
    """The claimed run's place in a family: (its parent,) for a child (its history's
    child.of event), (None,) for a run that started children, else None."""
    family: tuple[uuid.UUID | None] | None = None
    for event in claim.history:
        if event.kind == Event.CHILD_OF:
            return (uuid.UUID(event.payload["parent"]),)
        if event.kind in (Event.CHILD_STARTED, Event.CHILDREN_STARTED):
            family = (None,)
    return family
