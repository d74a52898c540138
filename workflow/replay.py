"""Replay: a run's recorded history, walked position by position as its code runs again.

A turn re-runs the workflow function from the top. Every ctx call takes the
next position; a position already in history hands back its recorded events, so
code before the first new call is pure replay. A recorded call of another kind
or name than the code now makes, or a recorded position the code never reaches
(it returned earlier), is a non-determinism error naming the position.

A patch marker (ctx.patched) is the one call that may be absent: at a position
where history recorded something else, the run predates the patch and takes
no position for it (docs/versioning.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NoReturn

from shardq.core.errors import LimitExceeded, NonDeterminismError, WorkflowError
from shardq.core.models import BufferedSignal, Event, HistoryEvent
from shardq.workflow.control import ReplayEnd

_NOTHING: tuple[HistoryEvent, ...] = ()
_CONSUMING = frozenset({Event.SIGNAL_CONSUMED, Event.CONDITION_CONSUMED, Event.UPDATE_COMPLETED})
RUN_ENDS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.timed_out"})
"""The events that end a run's history (written by the store, not by a call)."""


class Replay:
    """The history of one run, indexed by position, and how far the code has come.

    Once a call diverged from history, every later call and `finish()` raise the
    same NonDeterminismError, so workflow code that catches it cannot go on.
    """

    __slots__ = ("_base", "_fatal", "_limit", "_position", "_read_only", "_recorded",
                 "ended", "generation", "pending", "strict")

    def __init__(
        self, history: Iterable[HistoryEvent], signals: Iterable[BufferedSignal] = (),
        *, max_calls: int | None = None, read_only: bool = False, strict: bool = False,
    ) -> None:
        """`read_only`: a call past what history recorded raises ReplayEnd (a query's
        replay stops there instead of doing anything new). `strict` (`shardq replay`):
        an argument history recorded (a timer's seconds, a child's workflow) that
        the code now gives otherwise is a divergence too; a running worker keeps
        what was recorded instead."""
        self.strict = strict
        self.ended: str | None = None
        """The event that ended the run (`run.completed`, ...), when history holds it."""
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
            if event.kind == Event.CHILDREN_STARTED:
                for start in each_child_started(event):
                    assert start.position is not None
                    self._recorded.setdefault(start.position, []).append(start)
            elif event.position is not None:
                self._recorded.setdefault(event.position, []).append(event)
            if event.kind in _CONSUMING:
                consumed.add(int(event.payload["signal_id"]))
            if event.kind in RUN_ENDS:
                self.ended = event.kind
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
        position = self._take(call, name)
        recorded = self._recorded.get(position, _NOTHING)
        if not recorded and self._read_only:
            raise ReplayEnd(position, f"{call} {name!r}")
        first = recorded[0] if recorded else None
        if first is not None and first.kind == Event.UPDATE_COMPLETED:
            # An update handled at a wait is recorded at the wait's position: the
            # wait's own events say which call that is.
            first = next((e for e in recorded if e.kind != Event.UPDATE_COMPLETED), None)
        if first is not None:
            recorded_call = first.kind.split(".", 1)[0]
            if recorded_call != call or first.name != name:
                hint = (" (a patch's marker: keep the call as ctx.deprecate_patch until no "
                        "run that recorded it is left)" if first.kind == Event.PATCH_MARKED
                        else "")
                self._diverge(position, f"{recorded_call} {first.name!r}", f"{call} {name!r}",
                              f"the code now calls {call} {name!r}{hint}")
        return position, recorded

    def patch(self, change_id: str, *, deprecated: bool = False) -> int | None:
        """ctx.patched / ctx.deprecate_patch at the next position: whether the run takes
        the patched code path, as -1 (yes, recorded: replayed), a position (yes, new:
        the caller records the marker there) or None (no: the run predates the patch,
        or, for a deprecated patch, it never recorded the marker). Only a marker
        history recorded here, or a new marker, takes a position."""
        if self._fatal is not None:
            raise self._fatal
        recorded = self._recorded.get(self._position, _NOTHING)
        if any(e.kind == Event.PATCH_MARKED and e.name == change_id for e in recorded):
            self._position += 1
            return -1
        if recorded or deprecated or self.ended is not None:
            # History went on without the marker (or ended before it): older code's run.
            return None
        if self._read_only:
            raise ReplayEnd(self._position, f"patch {change_id!r}")
        return self._take("patch", change_id)

    def argument(self, position: int, call: str, what: str, recorded: object,
                 given: object) -> None:
        """In strict replay, a divergence when the code gives `what` otherwise than history
        recorded it at `position`."""
        if self.strict and recorded != given:
            self._diverge(position, f"{call} with {what} {recorded!r}",
                          f"{call} with {what} {given!r}", f"the code now gives {given!r}")

    def _diverge(self, position: int, recorded: str, called: str, said: str) -> NoReturn:
        self._fatal = NonDeterminismError(
            f"non-deterministic workflow at position {position}: history recorded "
            f"{recorded}, {said}", position=position, recorded=recorded, called=called)
        raise self._fatal

    def _take(self, call: str, name: str) -> int:
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
        return position

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
            first = self._recorded[leftover][0]
            raise NonDeterminismError(
                f"non-deterministic workflow: it returned after {position} call(s) but "
                f"history recorded a call at position {leftover}",
                position=leftover, recorded=f"{first.kind.split('.', 1)[0]} {first.name!r}",
            )


def each_child_started(batch: HistoryEvent) -> list[HistoryEvent]:
    """A `children.started` event as the `child.started` event of each of its children,
    at their positions: what a start_children call of one child records, and what every
    call recorded before this event existed."""
    first = batch.position if batch.position is not None else 0
    payload = batch.payload
    return [HistoryEvent(batch.seq, first + i, Event.CHILD_STARTED, workflow_id,
                         {"child": child, "workflow": workflow, "workflow_id": workflow_id,
                          "policy": policy}, batch.recorded_at)
            for i, (child, workflow, workflow_id, policy) in enumerate(zip(
                payload["child"], payload["workflow"], payload["workflow_id"],
                payload["policy"], strict=True))]
