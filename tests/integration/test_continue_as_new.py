"""ctx.continue_as_new: a run starts its next generation in place, with a bounded history,
its unconsumed signals carried over, still found by its id and its workflow id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import key_on, rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()


@registry.workflow("counter")
def counter(ctx: WorkflowContext) -> Any:
    """Take one "tick" per generation and go on as new until `until` ticks are counted."""
    n = ctx.input["n"]
    if n == ctx.input["until"]:
        return {"n": n, "ticks": ctx.input["ticks"]}
    tick = ctx.wait_for_signal("tick")
    ctx.step("count", lambda: None)
    ctx.continue_as_new({**ctx.input, "n": n + 1, "ticks": [*ctx.input["ticks"], tick]})


@registry.workflow("looping_child")
def looping_child(ctx: WorkflowContext) -> Any:
    n = ctx.input["n"]
    if n == 3:
        return "child done after 3 generations"
    ctx.sleep("beat", 0.01)
    ctx.continue_as_new({"n": n + 1})


@registry.workflow("child_of_loop")
def child_of_loop(ctx: WorkflowContext) -> Any:
    return ctx.wait_child(ctx.start_child("looping_child", ctx.input["child"], {"n": 0}))


@registry.workflow("bad_continue", input_schema={"type": "object",
                                                 "required": ["n"]})
def bad_continue(ctx: WorkflowContext) -> Any:
    """Continue with the bad next input the case names."""
    ctx.continue_as_new({"schema": {"m": 1}, "nan": float("nan"),
                         "too big": "x" * (2 << 20)}[ctx.input["case"]])


def test_a_run_counts_ticks_over_generations_with_a_bounded_history(
    client: Client, start_worker: StartWorker
) -> None:
    run = client.start("counter", key_on(client.map, 0, "counter", "c"),
                       {"n": 0, "until": 5, "ticks": []})
    # Ticks sent before any worker runs: every one is buffered, and each generation
    # takes the oldest left, so the later ones carry over four times.
    for n in range(5):
        client.signal(run.execution_id, "tick", n)
    start_worker(registry)
    done = client.wait(run.execution_id, timeout=20)
    assert done.state is State.COMPLETED, done.error
    assert done.output == {"n": 5, "ticks": [0, 1, 2, 3, 4]}
    history = client.history(run.execution_id)
    # The last generation's history only: its marker and its ending.
    assert [e.kind for e in history] == ["run.continued", "run.completed"]
    assert history[0].payload["generation"] == 5
    # Every consumed tick went with its generation; the run is the one it started as.
    url = client.map.shards[0].url
    assert rows(url, "SELECT count(*) FROM shardq.signals WHERE execution_id = %s",
                run.execution_id) == [(0,)]
    assert client.start("counter", client.get(run.execution_id).workflow_id,
                        {"n": 0, "until": 1, "ticks": []}).created is False


def test_a_parent_gets_the_outcome_of_a_child_that_continued_as_new(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("child_of_loop", key_on(client.map, 0, "child_of_loop", "p"),
                       {"child": key_on(client.map, 0, "looping_child", "k")})
    done = client.wait(run.execution_id, timeout=20)
    assert done.state is State.COMPLETED, done.error
    assert done.output == "child done after 3 generations"


@pytest.mark.parametrize(("case", "message"), [
    ("schema", "does not match its schema"),
    ("nan", "is not JSON-serialisable"),
    ("too big", "at most 1,048,576"),
])
def test_a_bad_next_input_fails_the_run_and_keeps_its_history(
    client: Client, start_worker: StartWorker, case: str, message: str
) -> None:
    start_worker(registry)
    run = client.start("bad_continue", key_on(client.map, 0, "bad_continue", case[:3]),
                       {"n": 1, "case": case})
    done = client.wait(run.execution_id, timeout=20)
    assert done.state is State.FAILED
    assert done.error is not None and message in done.error["message"], done.error
    assert "run.continued" not in [e.kind for e in client.history(run.execution_id)]


def test_a_cancel_between_generations_ends_the_run(
    client: Client, start_worker: StartWorker
) -> None:
    run = client.start("counter", key_on(client.map, 0, "counter", "x"),
                       {"n": 0, "until": 100, "ticks": []})
    start_worker(registry)
    client.signal(run.execution_id, "tick", "a")
    wait_until(lambda: any(e.kind == "run.continued"
                           for e in client.history(run.execution_id)), what="generation 1")
    client.cancel(run.execution_id)
    assert client.wait(run.execution_id, timeout=20).state is State.CANCELLED
