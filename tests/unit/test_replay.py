"""Replay without a database: positions, recorded calls, non-determinism."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shardq.core.errors import NonDeterminismError
from shardq.core.models import BufferedSignal, Event, HistoryEvent
from shardq.workflow.replay import Replay

_seq = iter(range(1, 1_000_000))


def recorded(position: int | None, kind: Event, name: str, **payload: Any) -> HistoryEvent:
    return HistoryEvent(next(_seq), position, kind.value, name, payload)


def test_each_call_takes_the_next_position() -> None:
    replay = Replay(())
    assert replay.position == 0
    assert [replay.next("step", n)[0] for n in ("a", "b", "c")] == [0, 1, 2]
    assert replay.position == 3
    replay.finish()


def test_a_recorded_position_returns_its_events_in_order() -> None:
    first_try = recorded(0, Event.STEP_FAILED, "charge", attempt=1)
    second_try = recorded(0, Event.STEP_FAILED, "charge", attempt=2)
    done = recorded(1, Event.STEP_COMPLETED, "ship", result="ok")
    replay = Replay((first_try, second_try, done))
    assert replay.next("step", "charge") == (0, [first_try, second_try])
    assert replay.next("step", "ship") == (1, [done])
    position, events = replay.next("sleep", "new")
    assert (position, list(events)) == (2, [])
    replay.finish()


def test_events_without_a_position_are_not_calls() -> None:
    arrived = recorded(None, Event.SIGNAL_RECEIVED, "go")
    replay = Replay((recorded(0, Event.SIGNAL_WAITING, "go"), arrived))
    assert replay.next("signal", "go")[0] == 0
    replay.finish()  # the received signal is no position the code must reach


def test_consumed_signals_are_not_pending_again() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    signals = [BufferedSignal(7, "go", None, None, at), BufferedSignal(9, "go", 2, None, at),
               BufferedSignal(8, "x", 1, None, at)]
    history = (recorded(0, Event.SIGNAL_CONSUMED, "go", signal_id=7, payload=None),)
    assert Replay(history, signals).pending == signals[1:]
    assert Replay((), signals).pending == signals


@pytest.mark.parametrize(
    ("call", "name", "message"),
    [
        ("sleep", "pay", "history recorded step 'pay', the code now calls sleep 'pay'"),
        ("step", "refund", "history recorded step 'pay', the code now calls step 'refund'"),
    ],
)
def test_another_call_where_history_recorded_one_is_non_determinism(
    call: str, name: str, message: str
) -> None:
    replay = Replay((
        recorded(0, Event.STEP_COMPLETED, "reserve", result=1),
        recorded(1, Event.STEP_COMPLETED, "pay", result=2),
    ))
    replay.next("step", "reserve")
    with pytest.raises(NonDeterminismError, match="at position 1") as found:
        replay.next(call, name)
    assert message in str(found.value)
    assert replay.fatal is found.value
    # Caught by the workflow, it comes back at every later call and at the end.
    with pytest.raises(NonDeterminismError) as again:
        replay.next("step", "anything")
    assert again.value is found.value
    with pytest.raises(NonDeterminismError) as at_the_end:
        replay.finish()
    assert at_the_end.value is found.value


def test_returning_before_a_recorded_position_is_non_determinism() -> None:
    replay = Replay((
        recorded(0, Event.STEP_COMPLETED, "a", result=1),
        recorded(1, Event.TIMER_STARTED, "nap", seconds=5),
        recorded(2, Event.STEP_COMPLETED, "b", result=2),
    ))
    replay.next("step", "a")
    assert replay.fatal is None
    with pytest.raises(
        NonDeterminismError,
        match=r"returned after 1 call\(s\) but history recorded a call at position 1",
    ):
        replay.finish()
