"""Signals (buffering, order, idempotency, tenancy, timeouts), cancellation, non-determinism."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.errors import ExecutionNotFound, InvalidArgument, SignalRefused
from shardq.core.models import SignalRequest, State
from shardq.shards.routing import InvalidExecutionId
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import all_rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
release = threading.Event()


@pytest.fixture
def client(client: Client) -> Client:
    """The shared client, with two_payments' gate closed again for this test."""
    release.clear()
    return client


@registry.workflow("two_payments")
def two_payments(ctx: WorkflowContext) -> list[Any]:
    ctx.step("gate", release.wait, 10)
    return [ctx.wait_for_signal("paid"), ctx.wait_for_signal("paid")]


@registry.workflow("approval")
def approval(ctx: WorkflowContext) -> Any:
    got = ctx.receive("approved", timeout=float(ctx.input["timeout"]))
    return "timed_out" if got is None else got.payload


@registry.workflow("long_step")
def long_step(ctx: WorkflowContext) -> str:
    ctx.step("work", release.wait, 10)
    ctx.step("after", lambda: "should not run")
    return "finished"


@registry.workflow("last_step")
def last_step(ctx: WorkflowContext) -> str:
    ctx.step("work", release.wait, 10)
    return "finished"


@registry.workflow("step_then_park")
def step_then_park(ctx: WorkflowContext) -> Any:
    ctx.step("work", release.wait, 10)
    return ctx.wait_for_signal("never")


def state_of(client: Client, execution_id: object) -> State:
    return client.get(str(execution_id)).state


def test_early_signals_are_buffered_and_consumed_oldest_first(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("two_payments", "p-1")
    # Both arrive while the run is still in its first step.
    client.signal(run.execution_id, "paid", {"n": 1})
    client.signal(run.execution_id, "paid", {"n": 2})
    release.set()
    done = client.wait(run.execution_id, timeout=10)
    assert done.state is State.COMPLETED
    assert done.output == [{"n": 1}, {"n": 2}]
    consumed = [e for e in client.history(run.execution_id) if e.kind == "signal.consumed"]
    assert [(e.position, e.payload["payload"]) for e in consumed] == [(1, {"n": 1}), (2, {"n": 2})]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals WHERE consumed_at IS NULL") \
        == [(0,), (0,)]
    # Each signal row names the call that consumed it.
    assert all_rows(client.map, "SELECT payload, consumed_position FROM shardq.signals "
                                "WHERE execution_id = %s ORDER BY id", run.execution_id) \
        == [({"n": 1}, 1), ({"n": 2}, 2)]


def test_signal_to_a_parked_run_wakes_it(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry, poll_interval_s=60.0)
    release.set()
    run = client.start("two_payments", "p-2")
    wait_until(lambda: state_of(client, run.execution_id) is State.WAITING, what="parked")
    assert all_rows(client.map, "SELECT count(*) FROM shardq.tasks") == [(0,), (0,)]
    client.signal(run.execution_id, "paid", 1)
    wait_until(
        lambda: [e for e in client.history(run.execution_id) if e.kind == "signal.consumed"],
        what="first signal consumed",
    )
    client.signal(run.execution_id, "paid", 2)
    assert client.wait(run.execution_id, timeout=10).output == [1, 2]


def test_a_worker_whose_listen_session_was_killed_listens_again(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    release.set()
    run = client.start("two_payments", "p-relisten")
    wait_until(lambda: state_of(client, run.execution_id) is State.WAITING, what="parked")
    listeners = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                 "AND query = format('LISTEN %%I', shardq.wake_channel())")
    killed = all_rows(client.map, listeners)
    assert len(killed) == len(client.map.shards)
    all_rows(client.map, f"SELECT pg_terminate_backend(pid) FROM ({listeners}) l")
    wait_until(lambda: len(set(all_rows(client.map, listeners)) - set(killed))
               == len(client.map.shards), what="every shard listened to again")
    time.sleep(0.5)  # the claim loops are back asleep on their 60 s poll
    client.signal(run.execution_id, "paid", 1)
    # Well inside the 60 s poll: only the new LISTEN session can have woken it.
    wait_until(
        lambda: [e for e in client.history(run.execution_id) if e.kind == "signal.consumed"],
        what="the signal consumed", timeout=5,
    )


def test_idempotency_key_collapses_repeats(client: Client, start_worker: StartWorker) -> None:
    run = client.start("two_payments", "p-3")
    first = client.signal(run.execution_id, "paid", {"n": 1}, idempotency_key="evt-1")
    repeat = client.signal(run.execution_id, "paid", {"n": 1}, idempotency_key="evt-1")
    other = client.signal(run.execution_id, "paid", {"n": 2}, idempotency_key="evt-2")
    assert (first.delivered, repeat.delivered, other.delivered) == (True, False, True)
    assert repeat.signal_id == first.signal_id
    start_worker(registry)
    release.set()
    done = client.wait(run.execution_id, timeout=10)
    assert done.output == [{"n": 1}, {"n": 2}]
    # After the run finished, the keyed repeat is still a no-op success...
    late = client.signal(run.execution_id, "paid", {"n": 1}, idempotency_key="evt-1")
    assert late.delivered is False
    # ...but a new signal is refused.
    with pytest.raises(SignalRefused, match="is completed"):
        client.signal(run.execution_id, "paid", {"n": 3})
    with pytest.raises(SignalRefused):
        client.signal(run.execution_id, "paid", {"n": 3}, idempotency_key="evt-3")


def test_signal_many_lands_per_signal_and_keeps_order(
    client: Client, start_worker: StartWorker
) -> None:
    runs = [client.start("two_payments", f"m-{i}").execution_id for i in range(6)]
    finished = client.start("two_payments", "m-done").execution_id
    assert client.cancel(finished) is State.CANCELLED
    stranger = client.start("two_payments", "m-acme", tenant="acme").execution_id
    requests = [
        # Two to one run in one call: consumed in the order given.
        SignalRequest(runs[0], "paid", {"n": 1}),
        SignalRequest(runs[0], "paid", {"n": 2}),
        SignalRequest(finished, "paid", 0),
        SignalRequest(stranger, "paid", 0),
        # A key repeated inside one call collapses like a repeat across calls.
        SignalRequest(runs[1], "paid", "a", idempotency_key="k"),
        SignalRequest(runs[1], "paid", "a", idempotency_key="k"),
        SignalRequest(runs[1], "paid", "b"),
        *[SignalRequest(r, "paid", {"r": i}) for i, r in enumerate(runs[2:])],
        *[SignalRequest(r, "paid", {"r": i, "again": True}) for i, r in enumerate(runs[2:])],
    ]
    results = client.signal_many(requests)
    assert [r.execution_id for r in results] == [r.execution_id for r in requests]
    assert isinstance(results[2].error, SignalRefused) and results[2].signal_id is None
    assert isinstance(results[3].error, ExecutionNotFound)
    assert (results[4].delivered, results[5].delivered) == (True, False)
    assert results[5].signal_id == results[4].signal_id
    assert all(r.delivered and r.error is None for i, r in enumerate(results) if i not in (2, 3, 5))
    # One signal per run (the set-based path): the same refusals and collapsing.
    again = client.signal_many([
        SignalRequest(runs[1], "paid", "a", idempotency_key="k"),
        SignalRequest(finished, "paid", 0),
        SignalRequest(stranger, "paid", 0),
    ])
    assert (again[0].delivered, again[0].signal_id) == (False, results[4].signal_id)
    assert isinstance(again[1].error, SignalRefused)
    assert isinstance(again[2].error, ExecutionNotFound)
    start_worker(registry)
    release.set()
    outputs = [client.wait(r, timeout=10).output for r in runs]
    assert outputs[:2] == [[{"n": 1}, {"n": 2}], ["a", "b"]]
    assert outputs[2:] == [[{"r": i}, {"r": i, "again": True}] for i in range(4)]
    assert state_of(client, finished) is State.CANCELLED
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals WHERE execution_id = %s",
                    stranger) == [(0,), (0,)]


def test_signal_many_wakes_every_parked_run(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry, poll_interval_s=60.0)
    runs = [client.start("approval", f"mw-{i}", {"timeout": 60}).execution_id for i in range(8)]
    wait_until(lambda: all(state_of(client, r) is State.WAITING for r in runs), what="parked")
    results = client.signal_many(
        [SignalRequest(r, "approved", {"i": i}) for i, r in enumerate(runs)]
    )
    assert all(r.delivered for r in results)
    assert [client.wait(r, timeout=10).output for r in runs] == [{"i": i} for i in range(8)]


def test_signal_many_refuses_a_bad_item_and_raises_on_a_non_id(client: Client) -> None:
    run = client.start("two_payments", "m-bad").execution_id
    good, bad = client.signal_many(
        [SignalRequest(run, "paid", 1), SignalRequest(run, "bad name", 2)]
    )
    assert good.delivered and isinstance(bad.error, InvalidArgument)
    # Not an execution id at all: a caller's bug, raised before anything is sent.
    with pytest.raises(InvalidExecutionId):
        client.signal_many([SignalRequest(run, "paid", 3), SignalRequest("not-an-id", "paid")])
    assert all_rows(client.map, "SELECT payload FROM shardq.signals") == [(1,)]
    assert client.signal_many([]) == []


def test_signals_are_scoped_to_their_tenant(client: Client) -> None:
    run = client.start("two_payments", "p-4", tenant="acme")
    with pytest.raises(ExecutionNotFound):
        client.signal(run.execution_id, "paid", 1, tenant="globex")
    with pytest.raises(ExecutionNotFound):
        client.get(run.execution_id, tenant="globex")
    assert client.signal(run.execution_id, "paid", 1, tenant="acme").delivered


@pytest.mark.parametrize(
    ("name", "key", "message"),
    [
        ("", None, "non-empty"),
        ("has space", None, "invalid"),
        ("x" * 129, None, "invalid"),
        ("ok", "", "idempotency_key"),
        ("ok", "   ", "idempotency_key"),
    ],
)
def test_bad_signals_are_refused(client: Client, name: str, key: str | None, message: str) -> None:
    run = client.start("two_payments", "p-5")
    with pytest.raises(InvalidArgument, match=message):
        client.signal(run.execution_id, name, None, idempotency_key=key)
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") == [(0,), (0,)]


def test_wait_for_signal_times_out_on_the_database_clock(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    run = client.start("approval", "a-1", {"timeout": 0.5})
    done = client.wait(run.execution_id, timeout=10)
    assert done.state is State.COMPLETED and done.output == "timed_out"
    kinds = [e.kind for e in client.history(run.execution_id)]
    assert kinds == ["signal.waiting", "signal.timed_out", "run.completed"]
    answered = client.start("approval", "a-2", {"timeout": 30})
    wait_until(lambda: state_of(client, answered.execution_id) is State.WAITING, what="parked")
    client.signal(answered.execution_id, "approved", {"by": "kim"})
    assert client.wait(answered.execution_id, timeout=10).output == {"by": "kim"}
    assert all_rows(client.map, "SELECT count(*) FROM shardq.waits") == [(0,), (0,)]


def test_cancel_parked_run_takes_effect_at_once(client: Client, start_worker: StartWorker) -> None:
    queued = client.start("two_payments", "c-0")  # no worker runs yet
    assert client.cancel(queued.execution_id) is State.CANCELLED
    with pytest.raises(SignalRefused, match="is cancelled"):
        client.signal(queued.execution_id, "paid", 1)
    start_worker(registry)
    release.set()
    run = client.start("two_payments", "c-1")
    wait_until(lambda: state_of(client, run.execution_id) is State.WAITING, what="parked")
    assert client.cancel(run.execution_id) is State.CANCELLED
    assert state_of(client, run.execution_id) is State.CANCELLED
    assert client.cancel(run.execution_id) is State.CANCELLED
    assert all_rows(client.map, "SELECT count(*) FROM shardq.waits") == [(0,), (0,)]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.tasks") == [(0,), (0,)]


def test_cancel_running_run_stops_at_its_next_checkpoint(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    run = client.start("long_step", "c-3")
    wait_until(
        lambda: all_rows(client.map,
                         "SELECT 1 FROM shardq.tasks WHERE lease_token IS NOT NULL"),
        what="the run to be leased",
    )
    time.sleep(0.1)
    # Running, not pending: a worker holds it, and the cancel was taken.
    assert client.cancel(run.execution_id) is State.RUNNING
    release.set()
    done = client.wait(run.execution_id, timeout=10)
    assert done.state is State.CANCELLED
    # The step in flight finished and was recorded; the next one never ran.
    assert [(e.kind, e.name) for e in client.history(run.execution_id)] == [
        ("step.completed", "work"), ("run.cancelled", "run")
    ]


def test_changed_code_between_park_and_resume_is_a_nondeterminism_error(
    client: Client, start_worker: StartWorker
) -> None:
    original = Registry()

    @original.workflow("order", version=3)
    def order_v3(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: "r")
        return ctx.wait_for_signal("paid")

    edited = Registry()

    @edited.workflow("order", version=3)
    def order_v3_edited(ctx: WorkflowContext) -> Any:
        ctx.step("reserve", lambda: "r")
        ctx.step("fraud_check", lambda: "ok")  # inserted without a version bump
        return ctx.wait_for_signal("paid")

    first = start_worker(original)
    starter = Client(client.store, original)
    run = starter.start("order", "o-9")
    wait_until(lambda: state_of(client, run.execution_id) is State.WAITING, what="parked")
    first.stop()
    start_worker(edited)
    client.signal(run.execution_id, "paid", {"ok": True})
    done = client.wait(run.execution_id, timeout=10)
    assert done.state is State.FAILED and done.error is not None
    assert done.error["type"] == "NonDeterminismError"
    assert done.error["message"] == (
        "non-deterministic workflow at position 1: history recorded signal 'paid', "
        "the code now calls step 'fraud_check'"
    )


def test_pending_signals_per_run_are_bounded(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardq.store import statements

    monkeypatch.setattr(statements, "MAX_PENDING_SIGNALS", 3)
    run = client.start("two_payments", "b-1")
    for n in range(3):
        client.signal(run.execution_id, "paid", n)
    with pytest.raises(SignalRefused, match="already has 3 unconsumed signals"):
        client.signal(run.execution_id, "paid", 3)
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") in ([(3,), (0,)],
                                                                           [(0,), (3,)])


@pytest.mark.parametrize("workflow", ["last_step", "step_then_park"])
def test_a_cancel_taken_while_the_last_step_runs_ends_the_run_cancelled(
    client: Client, start_worker: StartWorker, workflow: str
) -> None:
    # The rule: a cancel that a worker's run accepted (answered `running`) ends
    # the run cancelled at that worker's next commit, even the commit that would
    # have completed it or parked it; the step's result stays in history.
    start_worker(registry)
    run = client.start(workflow, f"late-{workflow}")
    wait_until(lambda: state_of(client, run.execution_id) is State.RUNNING, what="running")
    assert client.cancel(run.execution_id) is State.RUNNING
    assert client.get(run.execution_id).cancel_requested
    release.set()
    done = client.wait(run.execution_id, timeout=10)
    assert (done.state, done.output) == (State.CANCELLED, None)
    parked = [("signal.waiting", "never")] if workflow == "step_then_park" else []
    assert [(e.kind, e.name) for e in client.history(run.execution_id)] == [
        ("step.completed", "work"), *parked, ("run.cancelled", "run")
    ]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.waits") == [(0,), (0,)]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.tasks") == [(0,), (0,)]
    # Too late now: the answer is the state it ended in.
    assert client.cancel(run.execution_id) is State.CANCELLED


def test_a_cancel_after_completion_says_so_and_changes_nothing(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    release.set()
    run = client.start("last_step", "done-first")
    done = client.wait(run.execution_id, timeout=10)
    assert done.state is State.COMPLETED
    assert client.cancel(run.execution_id) is State.COMPLETED
    assert client.get(run.execution_id) == done


def test_a_flood_of_one_name_does_not_crowd_out_another(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardq.store import statements

    monkeypatch.setattr(statements, "MAX_PENDING_SIGNALS", 3)
    monkeypatch.setattr(statements, "MAX_PENDING_SIGNALS_TOTAL", 5)
    run = client.start("two_payments", "flooded")
    for _ in range(3):
        assert client.signal(run.execution_id, "spam").delivered
    with pytest.raises(SignalRefused, match="3 unconsumed signals named 'spam' \\(at most 3\\)"):
        client.signal(run.execution_id, "spam")
    assert client.signal(run.execution_id, "paid", 1).delivered
    assert client.signal(run.execution_id, "paid", 2).delivered
    with pytest.raises(SignalRefused, match="5 unconsumed signals \\(at most 5\\)"):
        client.signal(run.execution_id, "other")
    assert all_rows(client.map, "SELECT name, count(*) FROM shardq.signals GROUP BY name "
                                "ORDER BY name") == [("paid", 2), ("spam", 3)]


def test_a_key_reused_with_another_name_names_the_signal_it_belongs_to(client: Client) -> None:
    run = client.start("two_payments", "reused-key")
    first = client.signal(run.execution_id, "paid", 1, idempotency_key="evt-9")
    again = client.signal(run.execution_id, "refunded", 2, idempotency_key="evt-9")
    assert (first.delivered, first.signal_name) == (True, "paid")
    assert (again.delivered, again.signal_id, again.signal_name) == (
        False, first.signal_id, "paid"
    )
    assert all_rows(client.map, "SELECT name FROM shardq.signals") == [("paid",)]


@registry.workflow("webhook_order")
def webhook_order(ctx: WorkflowContext) -> Any:
    return [ctx.input, ctx.wait_for_signal("paid")]


def test_signal_with_start_starts_signals_or_refuses_by_the_run_s_state(
    client: Client, start_worker: StartWorker
) -> None:
    first = client.signal_with_start("webhook_order", "o-1", {"n": 1}, "paid", {"amount": 5},
                                     idempotency_key="evt-1")
    assert (first.created, first.delivered, first.signal_name) == (True, True, "paid")
    # The signal was buffered before the run's first turn: it consumes it at once.
    start_worker(registry)
    assert client.wait(first.execution_id, timeout=10).output == [{"n": 1}, {"amount": 5}]
    # A finished run: a keyed repeat is a no-op success, anything else is refused.
    repeat = client.signal_with_start("webhook_order", "o-1", {"n": 2}, "paid", {"amount": 5},
                                      idempotency_key="evt-1")
    assert (repeat.execution_id, repeat.created, repeat.delivered, repeat.signal_id) == (
        first.execution_id, False, False, first.signal_id
    )
    with pytest.raises(SignalRefused, match="is completed: it takes no more signals"):
        client.signal_with_start("webhook_order", "o-1", None, "paid", idempotency_key="evt-2")
    # A live run takes the signal; its input stays the one it started with.
    parked = client.start("webhook_order", "o-2", {"n": 3})
    wait_until(lambda: state_of(client, parked.execution_id) is State.WAITING, what="parked")
    live = client.signal_with_start("webhook_order", "o-2", {"n": 4}, "paid", 7)
    assert (live.execution_id, live.created, live.delivered) == (parked.execution_id, False, True)
    assert client.wait(parked.execution_id, timeout=10).output == [{"n": 3}, 7]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.executions") in (
        [(1,), (1,)], [(2,), (0,)], [(0,), (2,)]
    )


def test_racing_signal_with_start_callers_make_one_run_and_one_delivery(
    client: Client
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    barrier = threading.Barrier(50)

    def call(_: int) -> Any:
        barrier.wait(timeout=30)
        return client.signal_with_start("webhook_order", "raced", {"n": 1}, "paid", {"ok": 1},
                                        idempotency_key="evt-raced")

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(call, range(200)))
    assert len({r.execution_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert sum(r.delivered for r in results) == 1
    assert len({r.signal_id for r in results}) == 1
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") in ([(1,), (0,)],
                                                                           [(0,), (1,)])
