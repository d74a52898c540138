"""Replay: a run's recorded history, walked position by position as its code runs again.

A turn re-runs the workflow function from the top. Every ctx call takes the
next position; a position already in history hands back its recorded events, so
code before the first new call is pure replay. A recorded call of another kind
or name than the code now makes, or a recorded position the code never reaches
(it returned earlier), is a non-determinism error naming the position.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shardq.core.errors import LimitExceeded, NonDeterminismError, WorkflowError
from shardq.core.models import BufferedSignal, Event, HistoryEvent
from shardq.workflow.control import ReplayEnd

_NOTHING: tuple[HistoryEvent, ...] = ()
_CONSUMING = frozenset({Event.SIGNAL_CONSUMED, Event.CONDITION_CONSUMED, Event.UPDATE_COMPLETED})


class Replay:
    """The history of one run, indexed by position, and how far the code has come.

    Once a call diverged from history, every later call and `finish()` raise the
    same NonDeterminismError, so workflow code that catches it cannot go on.
    """

    __slots__ = ("_base", "_fatal", "_limit", "_position", "_read_only", "_recorded",
                 "generation", "pending")

    def __init__(
        self, history: Iterable[HistoryEvent], signals: Iterable[BufferedSignal] = (),
        *, max_calls: int | None = None, read_only: bool = False,
    ) -> None:
        """`read_only`: a call past what history recorded raises ReplayEnd (a query's
        replay stops there instead of doing anything new)."""
        self._position = 0
        self._base = 0
        self._read_only = read_only
        self._limit = max_calls
        self._fatal: WorkflowError | None = None
        self._recorded: dict[int, list[HistoryEvent]] = {}
        consumed: set[int] = set()
        self.generation = 0
        """How many times the run continued as new (ctx.continue_as_new): each generation's
        calls take positions after the last one's, so nothing keyed by a position (an
        outbox row, a child's id, a rate limiter's slot) meets an earlier generation's."""
        for event in history:
            if event.kind == Event.RUN_CONTINUED:
                self.generation = int(event.payload["generation"])
                self._position = self._base = int(event.payload["base"])
            if event.position is not None:
                self._recorded.setdefault(event.position, []).append(event)
            if event.kind in _CONSUMING:
                consumed.add(int(event.payload["signal_id"]))
        self.pending = [s for s in signals if s.id not in consumed]
        """Of the run's unconsumed `signals`, those no recorded call consumed either, oldest
        first: what the code's new calls may consume."""

    @property
    def position(self) -> int:
        """The position the next call takes (how many calls the code has made)."""
        return self._position

    @property
    def fatal(self) -> WorkflowError | None:
        """The divergence from history found so far, if any."""
        return self._fatal

    def next(self, call: str, name: str) -> tuple[int, Sequence[HistoryEvent]]:
        """Take the next position for `call` `name`: (position, the events recorded there).

        Raises NonDeterminismError when history recorded another call there.
        """
        if self._fatal is not None:
            raise self._fatal
        position = self._position
        if self._limit is not None and position - self._base >= self._limit:
            self._fatal = LimitExceeded(
                f"the run reached its definition's limit of {self._limit} recorded calls "
                f"(max_history) at {call} {name!r}: a loop that never ends?"
            )
            raise self._fatal
        self._position += 1
        recorded = self._recorded.get(position, _NOTHING)
        if not recorded and self._read_only:
            raise ReplayEnd()
        first = recorded[0] if recorded else None
        if first is not None and first.kind == Event.UPDATE_COMPLETED:
            # An update handled at a wait is recorded at the wait's position: the
            # wait's own events say which call that is.
            first = next((e for e in recorded if e.kind != Event.UPDATE_COMPLETED), None)
        if first is not None:
            recorded_call = first.kind.split(".", 1)[0]
            if recorded_call != call or first.name != name:
                self._fatal = NonDeterminismError(
                    f"non-deterministic workflow at position {position}: history recorded "
                    f"{recorded_call} {first.name!r}, the code now calls {call} {name!r}"
                )
                raise self._fatal
        return position, recorded

    def finish(self) -> None:
        """Check a run whose code returned: raises NonDeterminismError if it diverged.

        That is the divergence already found, or a recorded position beyond the
        last call the code made.
        """
        if self._fatal is not None:
            raise self._fatal
        position = self._position
        if self._recorded and max(self._recorded) >= position:
            leftover = min(p for p in self._recorded if p >= position)
            raise NonDeterminismError(
                f"non-deterministic workflow: it returned after {position} call(s) but "
                f"history recorded a call at position {leftover}"
            )
