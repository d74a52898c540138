"""The turn's API: the commits a turn asks for, through a fake checkpoint (no database),
and a refused checkpoint through a real worker."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shardq.core.errors import StoreRejected
from shardq.core.models import (
    Claim,
    CommitOutcome,
    Event,
    HistoryEvent,
    State,
    TaskAction,
    TurnCommit,
)
from shardq.worker.turn import failing_commit, run_turn
from shardq.workflow.context import WorkflowContext
from shardq.workflow.control import CommitRejected
from shardq.workflow.registry import Registry

registry = Registry()
LANDED = CommitOutcome(landed=True)


@registry.workflow("one")
def one(ctx: WorkflowContext) -> Any:
    return ctx.step("a", lambda: 1)


@registry.workflow("two")
def two(ctx: WorkflowContext) -> Any:
    return [ctx.step("a", lambda: 1), ctx.step("b", lambda: 2)]


ran: list[str] = []


@registry.workflow("refused_midway")
def refused_midway(ctx: WorkflowContext) -> Any:
    # PostgreSQL's jsonb cannot store NUL: the checkpoint before "after" is refused.
    ctx.step("nul", lambda: "nul\u0000")
    return ctx.step("after", lambda: ran.append("after"))


def claim(workflow: str, *history: HistoryEvent) -> Claim:
    return Claim(
        uuid.uuid4(), uuid.uuid4(), 1, "default", workflow, 1, "k", None, False,
        datetime.now(UTC), history, (),
    )


class Checkpoints:
    """A fake completer: records checkpoints and answers each with `answer`."""

    def __init__(self, answer: CommitOutcome | Exception = LANDED) -> None:
        self.answer = answer
        self.made: list[TurnCommit] = []

    def __call__(self, commit: TurnCommit) -> CommitOutcome:
        self.made.append(commit)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_one_step_turn_makes_no_checkpoint() -> None:
    checkpoints = Checkpoints()
    run = claim("one")
    final = run_turn(run, registry, checkpoints)
    assert checkpoints.made == []
    assert final is not None and final.lease_token == run.lease_token
    assert (final.state, final.task, final.output_json) == (State.COMPLETED, TaskAction.DELETE, "1")
    assert [(e.position, e.kind, e.name) for e in final.events] == [
        (0, Event.STEP_COMPLETED, "a")
    ]


def test_a_step_commits_its_predecessors_first_and_the_token_rotates() -> None:
    checkpoints = Checkpoints()
    final = run_turn(claim("two"), registry, checkpoints)
    (first,) = checkpoints.made
    assert (first.state, first.task) == (None, TaskAction.KEEP)  # a claimed run reads running
    assert [e.name for e in first.events] == ["a"]
    assert final is not None and final.lease_token == first.next_token
    assert [e.name for e in final.events] == ["b"] and final.output_json == "[1, 2]"


def test_a_lost_lease_at_a_checkpoint_ends_the_turn_with_nothing_to_commit() -> None:
    assert run_turn(claim("two"), registry, Checkpoints(CommitOutcome(landed=False))) is None
    assert run_turn(claim("two"), registry, Checkpoints(ConnectionError("down"))) is None


def test_a_refused_checkpoint_is_handed_to_the_caller_and_fails_the_run_once() -> None:
    checkpoints = Checkpoints(StoreRejected("unsupported Unicode escape sequence"))
    with pytest.raises(CommitRejected) as rejected:
        run_turn(claim("two"), registry, checkpoints)
    assert rejected.value.commit is checkpoints.made[0]
    failure = failing_commit(rejected.value.commit, rejected.value.error)
    assert failure.lease_token == checkpoints.made[0].lease_token
    assert (failure.state, failure.task, failure.events) == (State.FAILED, TaskAction.DELETE, [])
    assert failure.error is not None and failure.error["type"] == "StoreRejected"


def test_a_diverging_replay_fails_the_run() -> None:
    history = HistoryEvent(1, 0, Event.TIMER_STARTED.value, "nap", {"seconds": 5})
    final = run_turn(claim("one", history), registry, Checkpoints())
    assert final is not None and final.state is State.FAILED and final.error is not None
    assert final.error["type"] == "NonDeterminismError"
    assert "history recorded sleep 'nap', the code now calls step 'a'" in final.error["message"]
