"""Replay without a database: positions, recorded calls, non-determinism."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shardq.core.errors import NonDeterminismError
from shardq.core.models import BufferedSignal, Event, HistoryEvent
from shardq.workflow.control import ReplayEnd
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


# -- patches (ctx.patched, ctx.deprecate_patch) ------------------------------------------


def test_a_patch_reached_on_new_code_takes_a_position_and_replays_true() -> None:
    fresh = Replay((recorded(0, Event.STEP_COMPLETED, "a", result=1),))
    fresh.next("step", "a")
    assert fresh.patch("fix") == 1  # new: the caller records the marker at 1
    assert fresh.next("step", "b")[0] == 2
    again = Replay((recorded(0, Event.STEP_COMPLETED, "a", result=1),
                    recorded(1, Event.PATCH_MARKED, "fix")))
    again.next("step", "a")
    assert again.patch("fix") == -1  # recorded: true, nothing to record
    assert again.position == 2
    again.finish()


def test_a_run_recorded_before_the_patch_takes_the_old_branch_and_no_position() -> None:
    old = Replay((recorded(0, Event.STEP_COMPLETED, "a", result=1),
                  recorded(1, Event.STEP_COMPLETED, "old", result=2)))
    old.next("step", "a")
    assert old.patch("fix") is None
    assert old.position == 1
    assert old.next("step", "old")[0] == 1
    old.finish()


def test_a_patch_past_the_end_of_a_finished_run_is_false_and_a_query_stops_there() -> None:
    ended = Replay((recorded(0, Event.STEP_COMPLETED, "a", result=1),
                    HistoryEvent(next(_seq), None, "run.completed", "run", {})))
    ended.next("step", "a")
    assert ended.ended == "run.completed"
    assert ended.patch("fix") is None
    live = Replay((recorded(0, Event.STEP_COMPLETED, "a", result=1),), read_only=True)
    live.next("step", "a")
    with pytest.raises(ReplayEnd) as stopped:
        live.patch("fix")
    assert (stopped.value.position, stopped.value.call) == (1, "patch 'fix'")


def test_a_deprecated_patch_steps_over_its_marker_and_takes_nothing_elsewhere() -> None:
    marked = Replay((recorded(0, Event.PATCH_MARKED, "fix"),
                     recorded(1, Event.STEP_COMPLETED, "new", result=1)))
    marked.patch("fix", deprecated=True)
    assert marked.next("step", "new")[0] == 1
    unmarked = Replay((recorded(0, Event.STEP_COMPLETED, "new", result=1),))
    unmarked.patch("fix", deprecated=True)
    assert unmarked.next("step", "new")[0] == 0
    fresh = Replay(())
    fresh.patch("fix", deprecated=True)
    assert fresh.position == 0


def test_a_marker_the_code_no_longer_calls_is_non_determinism_with_a_hint() -> None:
    replay = Replay((recorded(0, Event.PATCH_MARKED, "fix"),))
    with pytest.raises(NonDeterminismError, match="deprecate_patch") as found:
        replay.next("step", "new")
    assert (found.value.position, found.value.recorded, found.value.called) == (
        0, "patch 'fix'", "step 'new'")


def test_strict_replay_compares_recorded_arguments_and_lenient_replay_keeps_them() -> None:
    history = (recorded(0, Event.TIMER_STARTED, "nap", seconds=5),)
    Replay(history).argument(0, "sleep 'nap'", "seconds", 5, 60)  # a worker: no error
    strict = Replay(history, strict=True)
    with pytest.raises(NonDeterminismError, match="recorded sleep 'nap' with seconds 5, the "
                                                  "code now gives 60"):
        strict.argument(0, "sleep 'nap'", "seconds", 5, 60)
    assert strict.fatal is not None


def batch_of_starts(first: int, ids: list[str]) -> HistoryEvent:
    """What a start_children call of len(ids) children records at its first position."""
    return recorded(first, Event.CHILDREN_STARTED, "children",
                    child=[f"00000000-0000-8000-8000-{n:012d}" for n in range(len(ids))],
                    workflow=["add"] * len(ids), workflow_id=ids,
                    policy=["cancel"] * (len(ids) - 1) + ["abandon"])


def test_a_batch_of_starts_replays_as_a_start_at_each_of_its_positions() -> None:
    replay = Replay((recorded(0, Event.STEP_COMPLETED, "prepare", result=None),
                     batch_of_starts(1, ["a", "b", "c"]),
                     recorded(4, Event.CHILDREN_WAITING, "children", count=3, of=3)))
    assert replay.next("step", "prepare")[0] == 0
    starts = [replay.next("child", name) for name in ("a", "b", "c")]
    assert [position for position, _ in starts] == [1, 2, 3]
    assert [(e.kind, e.name, e.payload["workflow"], e.payload["policy"])
            for _, (e,) in starts] == [("child.started", "a", "add", "cancel"),
                                       ("child.started", "b", "add", "cancel"),
                                       ("child.started", "c", "add", "abandon")]
    assert starts[2][1][0].payload["child"] == "00000000-0000-8000-8000-000000000002"
    assert replay.next("children", "children")[0] == 4
    replay.finish()


def test_a_batch_replayed_by_code_that_starts_another_child_diverges_at_that_position(
) -> None:
    replay = Replay((batch_of_starts(0, ["a", "b", "c"]),))
    replay.next("child", "a")
    with pytest.raises(NonDeterminismError) as caught:
        replay.next("child", "x")
    assert caught.value.position == 1
    assert caught.value.recorded == "child 'b'"


def test_code_that_stops_inside_a_batch_diverges_at_the_first_start_it_skipped() -> None:
    replay = Replay((batch_of_starts(0, ["a", "b", "c"]),))
    replay.next("child", "a")
    with pytest.raises(NonDeterminismError) as caught:
        replay.finish()
    assert caught.value.position == 1


def test_the_explorer_says_a_batch_of_starts_in_one_line() -> None:
    from shardq.bin.web.explorer import timeline

    (batch,) = timeline([batch_of_starts(3, ["a", "b", "c"])])
    assert (batch["call"], batch["summary"]) == ("children", "3 children of add: a .. c")
