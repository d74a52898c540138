"""Waits with unambiguous outcomes, conditions over signals, and signals racing completion."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from shardq.client.client import Client
from shardq.core.errors import SignalRefused, SignalTimedOut
from shardq.core.models import Signal, State
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import all_rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()


@registry.workflow("gate")
def gate(ctx: WorkflowContext) -> Any:
    got = ctx.receive("approved", timeout=float(ctx.input["timeout"]))
    # Parks again, so what receive() returned is read back from history next turn.
    ctx.sleep("settle", 0.05)
    if got is None:
        return "timed_out"
    return {"payload": got.payload, "key": got.idempotency_key, "id": got.signal_id,
            "received": got.received_at.isoformat()}


@registry.workflow("short_form")
def short_form(ctx: WorkflowContext) -> Any:
    try:
        payload = ctx.wait_for_signal("approved", timeout=float(ctx.input["timeout"]))
    except SignalTimedOut as exc:
        ctx.sleep("settle", 0.05)
        return f"caught: {exc}"
    ctx.sleep("settle", 0.05)
    return {"payload": payload}


def test_a_signal_without_payload_and_a_timeout_never_look_alike(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    empty = client.start("gate", "empty", {"timeout": 30})
    silent = client.start("gate", "silent", {"timeout": 0.5})
    wait_until(lambda: client.get(empty.execution_id).state is State.WAITING, what="parked")
    sent = client.signal(empty.execution_id, "approved", None, idempotency_key="evt-0")
    got = client.wait(empty.execution_id, timeout=10).output
    assert (got["payload"], got["key"], got["id"]) == (None, "evt-0", sent.signal_id)
    assert client.wait(silent.execution_id, timeout=10).output == "timed_out"
    kinds = {r.workflow_id: [e.kind for e in client.history(r.id) if e.position == 0]
             for r in (client.get(empty.execution_id), client.get(silent.execution_id))}
    assert kinds == {"empty": ["signal.waiting", "signal.consumed"],
                     "silent": ["signal.waiting", "signal.timed_out"]}
    # The short form raises at the deadline; a payload of None is a delivery.
    short = client.start("short_form", "short-silent", {"timeout": 0.5})
    delivered = client.start("short_form", "short-empty", {"timeout": 30})
    wait_until(lambda: client.get(delivered.execution_id).state is State.WAITING,
               what="parked")
    client.signal(delivered.execution_id, "approved")
    assert client.wait(short.execution_id, timeout=10).output == (
        "caught: no signal 'approved' arrived before the wait's deadline"
    )
    assert client.wait(delivered.execution_id, timeout=10).output == {"payload": None}


quorum_calls: list[str] = []


@registry.workflow("quorum")
def quorum(ctx: WorkflowContext) -> dict[str, Any]:
    approvers: list[Any] = []

    def approved(signal: Signal) -> None:
        approvers.append(signal.payload)

    met = ctx.wait_until(lambda: len(approvers) >= 2, on={"approved": approved},
                         timeout=float(ctx.input["timeout"]), name="quorum")
    return {"outcome": "approved" if met else "timed_out", "approvers": approvers}


def test_a_quorum_of_two_before_the_deadline(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry, poll_interval_s=60.0)
    run = client.start("quorum", "q-met", {"timeout": 30})
    wait_until(lambda: client.get(run.execution_id).state is State.WAITING, what="parked")
    client.signal(run.execution_id, "approved", "ann")
    client.signal(run.execution_id, "comment", "later")  # another name: stays buffered
    wait_until(lambda: any(e.kind == "condition.consumed"
                           for e in client.history(run.execution_id)),
               what="the first approval consumed")
    assert client.get(run.execution_id).state is State.WAITING
    client.signal(run.execution_id, "approved", "bob")
    done = client.wait(run.execution_id, timeout=10)
    assert done.output == {"outcome": "approved", "approvers": ["ann", "bob"]}
    assert [b.name for b in client.waiting(run.execution_id)[1]] == ["comment"]
    assert [e.kind for e in client.history(run.execution_id) if e.position == 0] == [
        "condition.waiting", "condition.consumed", "condition.consumed", "condition.met"
    ]


def test_one_approval_times_out_at_the_deadline_not_before(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    run = client.start("quorum", "q-missed", {"timeout": 1.0})
    wait_until(lambda: client.get(run.execution_id).state is State.WAITING, what="parked")
    client.signal(run.execution_id, "approved", "ann")
    done = client.wait(run.execution_id, timeout=10)
    assert done.output == {"outcome": "timed_out", "approvers": ["ann"]}
    events = {e.kind: e for e in client.history(run.execution_id)}
    opened = events["condition.waiting"].recorded_at
    timed_out = events["condition.timed_out"].recorded_at
    assert opened is not None and timed_out is not None
    deadline = opened + timedelta(seconds=1.0)
    assert deadline <= timed_out < deadline + timedelta(seconds=1)


@registry.workflow("clock_in_predicate")
def clock_in_predicate(ctx: WorkflowContext) -> bool:
    return ctx.wait_until(lambda: ctx.now().year > 3000, on={"approved": lambda s: None})


def test_a_predicate_that_calls_ctx_fails_the_run_loudly(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    done = client.wait(client.start("clock_in_predicate", "c-1").execution_id, timeout=10)
    assert done.state is State.FAILED and done.error is not None
    assert "must not call ctx" in done.error["message"]


@registry.workflow("quick")
def quick(ctx: WorkflowContext) -> str:
    # Long enough that senders find runs live, short enough to finish 300 quickly.
    ctx.step("only", time.sleep, 0.02)
    return "done"


def test_a_signal_racing_completion_lands_before_it_or_is_refused(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, concurrency=10, batch_size=10)
    runs = [r.execution_id for r in client.start_many("quick", [(f"r{i}", None)
                                                                for i in range(300)])]
    refused: list[str] = []
    stop = threading.Event()

    def send() -> None:
        while not stop.is_set():
            for run in runs:
                try:
                    client.signal(run, "late")
                except SignalRefused as exc:
                    refused.append(str(exc))

    senders = [threading.Thread(target=send) for _ in range(4)]
    for t in senders:
        t.start()
    try:
        for run in runs:
            assert client.wait(run, timeout=30).state is State.COMPLETED
    finally:
        stop.set()
        for t in senders:
            t.join()
    assert refused and all("is completed: it takes no more signals" in r for r in refused)
    # Every stored signal was recorded before its run's outcome, never after it.
    after = all_rows(client.map, """
        SELECT count(*) FROM shardq.events r JOIN shardq.events o
          ON o.execution_id = r.execution_id AND o.kind = 'run.completed'
        WHERE r.kind = 'signal.received' AND r.seq > o.seq""")
    assert after == [(0,), (0,)]
    stored = sum(n for (n,) in all_rows(client.map, "SELECT count(*) FROM shardq.signals"))
    assert stored > 0, "no signal landed before a completion: the race was not exercised"
