"""A run's state rebuilt from its committed history, writing nothing.

Queries and update validators (shardq.workflow.contracts) read a class-based
workflow's instance as the run's committed history makes it: the workflow's
code runs again, every recorded call returns what it recorded, and the first
call history has not recorded (a step not yet run, a wait still open, a timer
not yet fired) stops it. Nothing can be written on the way: the journal refuses
every event and every checkpoint, and no pending signal is offered. So no
worker is needed, and parked, running and finished runs read alike.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from shardq.core.errors import NonDeterminismError, QueryFailed
from shardq.core.models import Claim, CommitOutcome, Execution, HistoryEvent, TurnCommit
from shardq.workflow.context import WorkflowContext
from shardq.workflow.control import Cancelled, Park, ReplayEnd
from shardq.workflow.exported import RecordedRun
from shardq.workflow.journal import Journal
from shardq.workflow.registry import Registry, WorkflowDef
from shardq.workflow.replay import Replay


class _Refusing(list[Any]):
    """A journal buffer that stops the replay instead of taking anything new."""

    def append(self, item: Any) -> NoReturn:
        raise ReplayEnd()


def _no_checkpoint(commit: TurnCommit) -> CommitOutcome:
    raise ReplayEnd()


class _ReadOnlyJournal(Journal):
    def __init__(self, claim: Claim) -> None:
        super().__init__(claim, _no_checkpoint)
        self.events, self.consumed = _Refusing(), _Refusing()
        self.externals, self.outbox = _Refusing(), _Refusing()

    def flush(self) -> None:
        raise ReplayEnd()


def read_only_context(
    definition: WorkflowDef, run: RecordedRun, *, registry: Registry | None = None,
    strict: bool = False,
) -> tuple[WorkflowContext, Replay]:
    """A context that replays `run`'s history and can do nothing new (ReplayEnd), and
    its replay (`strict`: see Replay)."""
    claim = Claim(
        run.execution_id, uuid.UUID(int=0), 0, run.tenant, run.workflow_name,
        run.workflow_version, run.workflow_id, run.input,
        cancel_requested=False, db_now=datetime.now(UTC), history=run.history, signals=(),
    )
    replay = Replay(claim.history, (), max_calls=definition.max_history, read_only=True,
                    strict=strict)
    ctx = WorkflowContext(claim, replay, _ReadOnlyJournal(claim), None,
                          state=definition.new_state(), updates=definition.updates,
                          registry=registry)
    return ctx, replay


def rebuild_state(
    definition: WorkflowDef, execution: Execution, history: Sequence[HistoryEvent]
) -> Any:
    """The instance of a class-based workflow as the run's committed history leaves it.

    Raises QueryFailed when history does not replay (the code diverged from it).
    """
    ctx, replay = read_only_context(definition, RecordedRun.of(execution, tuple(history)))
    try:
        definition.fn(ctx)
    except (ReplayEnd, Park, Cancelled):
        pass  # where history ends for now
    except Exception:  # noqa: S110 - a failed run's code raised again: its state stands
        pass
    if isinstance(replay.fatal, NonDeterminismError):
        raise QueryFailed(f"the run's history does not replay: {replay.fatal}")
    return ctx.state


def call_handler(what: str, handler: Any, state: Any, argument: Any) -> Any:
    """`handler(state, argument)` for a query or a validator; QueryFailed when it tries to
    call ctx (nothing may happen here)."""
    try:
        return handler(state, argument)
    except ReplayEnd:
        raise QueryFailed(f"{what} called the workflow context: a handler may only read "
                          "the workflow's state") from None
