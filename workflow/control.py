"""The exceptions that steer a turn rather than report an error.

All six derive from BaseException, not Exception: they unwind through
workflow code, and an `except Exception` in a workflow must not swallow them.
The context raises Park, ContinueAsNew and Cancelled; the journal raises TurnAborted and
CommitRejected at a checkpoint; the turn turns the first three into the commit
that ends it, and hands CommitRejected to its caller. ReplayEnd stops a
query's read-only replay (shardq.workflow.rebuild) where history ends.
"""

from __future__ import annotations

from shardq.core.errors import StoreRejected
from shardq.core.models import OpenWait, State, TaskAction, TurnCommit


class Park(BaseException):
    """The run must wait; a BaseException so that workflow code cannot catch the wait away."""

    def __init__(
        self,
        *,
        state: State,
        task: TaskAction,
        delay: float = 0.0,
        open_wait: OpenWait | None = None,
        wake_on_signals: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.state, self.task, self.delay = state, task, delay
        self.open_wait, self.wake_on_signals = open_wait, wake_on_signals


class ContinueAsNew(BaseException):
    """The run goes on as a new generation with this input (ctx.continue_as_new); a
    BaseException so that workflow code cannot catch it away."""

    def __init__(self, input_json: str) -> None:
        super().__init__()
        self.input_json = input_json


class Cancelled(BaseException):
    """Cancellation was requested; a BaseException so that workflow code cannot go on."""


class TurnAborted(BaseException):
    """Lease lost or store down mid-turn; a BaseException so no workflow code runs unfenced."""


class CommitRejected(BaseException):
    """The database refused a checkpoint; a BaseException so workflow code stops right there."""

    def __init__(self, commit: TurnCommit, error: StoreRejected) -> None:
        super().__init__(str(error))
        self.commit = commit
        """The refused commit; nothing of it was written."""
        self.error = error


class ReplayEnd(BaseException):
    """A read-only replay reached a call history has not recorded; a BaseException so that
    workflow code cannot catch it and go on to do something new. `position` and `call`
    name that call when it is one (a refused write has neither)."""

    def __init__(self, position: int | None = None, call: str | None = None) -> None:
        super().__init__()
        self.position, self.call = position, call
