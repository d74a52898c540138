"""A fan-out and fan-in through real crashes: a `shardq worker` process and the outbox
relay are SIGKILLed while a parent's children run across two shards; the parent still
gets every outcome once, and no child is started twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.children import ChildRequest
from shardq.core.models import State
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import Daemon, all_rows, key_on, wait_until

pytestmark = pytest.mark.slow
APP = "shardq.tests.acceptance.test_children_crashes:registry"
CHILDREN = 60
registry = Registry()


@registry.workflow("crash_child")
def crash_child(ctx: WorkflowContext) -> int:
    ctx.step("work", time.sleep, 0.05)  # long enough for a kill to land mid-fan-out
    return int(ctx.input["n"])


@registry.workflow("crash_parent")
def crash_parent(ctx: WorkflowContext) -> int:
    handles = ctx.start_children([ChildRequest("crash_child", f"{ctx.workflow_id}.{n}",
                                               {"n": n}) for n in range(CHILDREN)])
    return sum(o.result() for o in ctx.wait_children(handles) if o is not None)


def test_a_fan_in_survives_a_killed_worker_and_a_killed_relay(
    client: Client, daemons: Callable[..., Daemon],
) -> None:
    shards = ",".join(s.url for s in client.map.shards)

    def worker() -> Daemon:
        return daemons(["--shards", shards, "worker", "--app", APP, "--lease", "2",
                        "--poll-interval", "0.5", "--concurrency", "4"])

    def relay() -> Daemon:
        return daemons(["--shards", shards, "outbox-relay", "--poll-interval", "0.5"])

    first, relaying = worker(), relay()
    run = client.start("crash_parent", key_on(client.map, 0, "crash_parent", "p"))
    ended = ("SELECT count(*) FROM shardq.executions x JOIN shardq.history h "
             "ON h.execution_id = x.id AND h.kind = 'run.completed' "
             "WHERE x.workflow_name = 'crash_child'")

    def children_done() -> int:
        return int(sum(r[0] for r in all_rows(client.map, ended)))

    wait_until(lambda: children_done() >= 10, timeout=60, what="ten children done")
    first.kill()
    relaying.kill()
    worker(), relay()
    done = client.wait(run.execution_id, timeout=90)
    assert done.state is State.COMPLETED, done.error
    assert done.output == sum(range(CHILDREN))
    # One run per child, one outcome per child, all taken by the one wait.
    per_key = all_rows(client.map, "SELECT workflow_id, count(*) FROM shardq.executions "
                       "WHERE workflow_name = 'crash_child' GROUP BY 1")
    assert len(per_key) == CHILDREN and {n for _, n in per_key} == {1}
    outcomes = all_rows(client.map, "SELECT count(*), count(consumed_at) FROM shardq.signals"
                        " WHERE name = 'shardq:run:child'")
    assert [sum(r[0] for r in outcomes), sum(r[1] for r in outcomes)] == [CHILDREN, CHILDREN]
    ends: list[Any] = [e for e in client.history(run.execution_id)
                       if e.kind == "children.ended"]
    assert len(ends) == 1 and len(ends[0].payload["outcomes"]) == CHILDREN
