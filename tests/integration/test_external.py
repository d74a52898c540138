"""ctx.signal_external between runs of one shard: delivered in the sender's own commit."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from shardq.client.client import Client
from shardq.core.errors import ExternalSignalFailed
from shardq.core.models import SignalRequest, State
from shardq.core.rules import Limits
from shardq.shards.routing import new_execution_id
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import all_rows, key_on, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
keys = itertools.count()


@registry.workflow("receiver")
def receiver(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go")


@registry.workflow("fan_out")
def fan_out(ctx: WorkflowContext) -> list[Any]:
    """Signal every target; a finished or unknown one is skipped by its reason code."""
    results: list[Any] = []
    for target in ctx.input["targets"]:
        # A key computed differently on every turn: replay must not send again.
        key = f"{ctx.input.get('key', 'k')}-{next(keys)}"
        try:
            sent = ctx.signal_external(target, "go", {"from": ctx.workflow_id},
                                       idempotency_key=key)
            if sent.queued:
                results.append({"queued": True})
            else:
                results.append({"delivered": sent.delivered, "signal_id": sent.signal_id})
        except ExternalSignalFailed as exc:
            results.append({"skipped": exc.reason_code})
    ctx.sleep("settle", 0.05)  # the output is computed again on the replay after this
    return results


def test_a_signal_to_a_run_of_the_same_shard_wakes_it_in_the_sender_s_commit(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    target = client.start("receiver", key_on(client.map, 0, "receiver", "t"))
    finished = client.start("receiver", key_on(client.map, 0, "receiver", "f"))
    wait_until(lambda: client.get(finished.execution_id).state is State.WAITING, what="parked")
    client.signal(finished.execution_id, "go", "earlier")
    assert client.wait(finished.execution_id, timeout=10).state is State.COMPLETED
    wait_until(lambda: client.get(target.execution_id).state is State.WAITING, what="parked")
    unknown = new_execution_id(client.map.shards[0].first_bucket)
    elsewhere = client.start("receiver", key_on(client.map, 1, "receiver", "e"))
    sender = client.start("fan_out", key_on(client.map, 0, "fan_out", "s"), {"targets": [
        str(target.execution_id), str(finished.execution_id), str(unknown),
        str(elsewhere.execution_id),
    ]})
    done = client.wait(sender.execution_id, timeout=10)
    assert done.state is State.COMPLETED, done.error
    delivered, *skipped = done.output
    assert delivered["delivered"] is True
    # The run of the other shard gets it through the outbox (tests/integration/test_outbox.py).
    assert skipped == [{"skipped": "target_finished"}, {"skipped": "target_not_found"},
                       {"queued": True}]
    assert client.wait(target.execution_id, timeout=10).output == {
        "from": client.get(sender.execution_id).workflow_id
    }
    # The sender recorded each outcome at its call; replay (after the sleep)
    # computed other keys and sent nothing again.
    events = [(e.position, e.kind) for e in client.history(sender.execution_id)
              if e.kind.startswith("external.")]
    assert events == [(0, "external.sent"), (1, "external.failed"), (2, "external.failed"),
                      (3, "external.queued")]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals "
                                "WHERE execution_id = %s", target.execution_id) == [(1,), (0,)]
    signal_row = all_rows(client.map, "SELECT id, idempotency_key FROM shardq.signals "
                                      "WHERE execution_id = %s", target.execution_id)
    assert signal_row[0][0] == delivered["signal_id"]
    assert signal_row[0][1].startswith("k-")


def test_another_tenant_s_run_is_not_found(client: Client, start_worker: StartWorker) -> None:
    start_worker(registry)
    theirs = client.start("receiver", key_on(client.map, 0, "receiver", "x", tenant="other"),
                          tenant="other")
    sender = client.start("fan_out", key_on(client.map, 0, "fan_out", "y"),
                          {"targets": [str(theirs.execution_id)]})
    assert client.wait(sender.execution_id, timeout=10).output == [
        {"skipped": "target_not_found"}
    ]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") == [(0,), (0,)]


@registry.workflow("fan_out_many")
def fan_out_many(ctx: WorkflowContext) -> list[Any]:
    """Every target in one call; keys computed anew on every turn (replay must not resend)."""
    sent = ctx.signal_external_many([
        SignalRequest(t, "go", {"from": ctx.workflow_id}, f"m-{next(keys)}")
        for t in ctx.input["targets"]])
    ctx.sleep("settle", 0.05)  # the output is computed again on the replay after this
    return [{"skipped": s.error.reason_code} if s.error else
            {"queued": True} if s.queued else {"delivered": s.delivered} for s in sent]


@registry.workflow("fan_out_bad")
def fan_out_bad(ctx: WorkflowContext) -> Any:
    return ctx.signal_external_many([
        SignalRequest(ctx.input["target"], "go", "fine"),
        SignalRequest(ctx.input["target"], "go", float("nan")),
    ])


def test_a_fan_out_in_one_call_sends_every_signal_in_one_commit(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    here = [client.start("receiver", key_on(client.map, 0, "receiver", f"many-{i}"))
            for i in range(5)]
    wait_until(lambda: all(client.get(r.execution_id).state is State.WAITING for r in here),
               what="parked")
    elsewhere = client.start("receiver", key_on(client.map, 1, "receiver", "many-e"))
    unknown = new_execution_id(client.map.shards[0].first_bucket)
    targets = [str(r.execution_id) for r in here] + [str(unknown),
                                                     str(elsewhere.execution_id)]
    sender = client.start("fan_out_many", key_on(client.map, 0, "fan_out_many", "s"),
                          {"targets": targets})
    done = client.wait(sender.execution_id, timeout=10)
    assert done.state is State.COMPLETED, done.error
    assert done.output == [{"delivered": True}] * 5 + [{"skipped": "target_not_found"},
                                                       {"queued": True}]
    for run in here:
        assert client.wait(run.execution_id, timeout=10).output == {
            "from": client.get(sender.execution_id).workflow_id}
    events = [e for e in client.history(sender.execution_id) if e.kind.startswith("external.")]
    assert sorted((e.position, e.kind) for e in events) == [
        *((i, "external.sent") for i in range(5)), (5, "external.failed"),
        (6, "external.queued")]
    # One commit: every call's event was written by the same transaction.
    assert len({e.recorded_at for e in events}) == 1


def test_a_bad_signal_in_a_fan_out_sends_none_of_them(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    _sender_fails_sending_nothing(client, "fan_out_bad", "not JSON")


HOSTILE: dict[str, tuple[Callable[[str], list[SignalRequest]], str]] = {
    "not an id": (lambda t: [SignalRequest("not-an-id", "go")], "execution id"),
    "empty name": (lambda t: [SignalRequest(t, "")], "signal name"),
    "reserved name": (lambda t: [SignalRequest(t, "shardq:update:x")], "reserved"),
    "empty key": (lambda t: [SignalRequest(t, "go", None, " ")], "idempotency_key"),
    "NUL in key": (lambda t: [SignalRequest(t, "go", None, "a\x00b")], "NUL"),
    "lone surrogate": (lambda t: [SignalRequest(t, "go", None, "a\ud800")], "surrogate"),
    "NaN payload": (lambda t: [SignalRequest(t, "go", float("nan"))], "not JSON"),
    "payload too big": (lambda t: [SignalRequest(t, "go", "x" * 2_000_000)], "bytes"),
    "too many": (lambda t: [SignalRequest(t, "go")] * 10_001, "at most 10000"),
}


@registry.workflow("fan_out_hostile")
def fan_out_hostile(ctx: WorkflowContext) -> Any:
    make, _ = HOSTILE[ctx.input["case"]]
    return ctx.signal_external_many(make(ctx.input["target"]))


def test_hostile_fan_outs_fail_the_sender_and_send_nothing(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    target = str(client.start("receiver", key_on(client.map, 0, "receiver", "h-t")).execution_id)
    senders = {case: client.start("fan_out_hostile", key_on(client.map, 0, "fan_out_hostile",
                                                             f"h-{i}"),
                                  {"case": case, "target": target}).execution_id
               for i, case in enumerate(HOSTILE)}
    for case, sender in senders.items():
        done = client.wait(sender, timeout=15)
        assert done.state is State.FAILED, case
        assert HOSTILE[case][1] in str(done.error), (case, done.error)
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") == [(0,), (0,)]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.outbox") == [(0,), (0,)]


@registry.workflow("send_big")
def send_big(ctx: WorkflowContext) -> Any:
    return ctx.signal_external(ctx.input["target"], "go", "x" * 200).delivered


def test_a_worker_s_limits_bound_what_its_runs_send(
    client: Client, start_worker: StartWorker
) -> None:
    """The limits a worker is given bound ctx.signal_external as a Client's bound signal."""
    start_worker(registry, limits=Limits(max_payload_bytes=100))
    _sender_fails_sending_nothing(client, "send_big", "at most 100 (Limits.max_payload_bytes)")


def _sender_fails_sending_nothing(client: Client, workflow: str, says: str) -> None:
    """A run of `workflow` told to signal a parked run of its shard fails saying `says`,
    and no signal was stored."""
    target = client.start("receiver", key_on(client.map, 0, "receiver", f"{workflow}-t"))
    sender = client.start(workflow, key_on(client.map, 0, workflow, f"{workflow}-s"),
                          {"target": str(target.execution_id)})
    done = client.wait(sender.execution_id, timeout=10)
    assert done.state is State.FAILED
    assert says in str(done.error), done.error
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") == [(0,), (0,)]
