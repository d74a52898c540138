"""ctx.signal_external between runs of one shard: delivered in the sender's own commit."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from shardq.queue.client import Client
from shardq.queue.context import WorkflowContext
from shardq.queue.errors import ExternalSignalFailed
from shardq.queue.models import State
from shardq.queue.registry import Registry
from shardq.queue.worker import Worker
from shardq.shards.routing import bucket_for, new_execution_id

from ..support import all_rows, wait_until

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


def _key_on(
    client: Client, shard_index: int, workflow: str, prefix: str, tenant: str = "default"
) -> str:
    target = client.map.shards[shard_index]
    return next(k for k in (f"{prefix}-{i}" for i in range(10_000))
                if client.map.for_bucket(bucket_for(tenant, workflow, k)) == target)


def test_a_signal_to_a_run_of_the_same_shard_wakes_it_in_the_sender_s_commit(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    target = client.start("receiver", _key_on(client, 0, "receiver", "t"))
    finished = client.start("receiver", _key_on(client, 0, "receiver", "f"))
    wait_until(lambda: client.get(finished.execution_id).state is State.WAITING, what="parked")
    client.signal(finished.execution_id, "go", "earlier")
    assert client.wait(finished.execution_id, timeout=10).state is State.COMPLETED
    wait_until(lambda: client.get(target.execution_id).state is State.WAITING, what="parked")
    unknown = new_execution_id(client.map.shards[0].first_bucket)
    elsewhere = client.start("receiver", _key_on(client, 1, "receiver", "e"))
    sender = client.start("fan_out", _key_on(client, 0, "fan_out", "s"), {"targets": [
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
    theirs = client.start("receiver", _key_on(client, 0, "receiver", "x", tenant="other"),
                          tenant="other")
    sender = client.start("fan_out", _key_on(client, 0, "fan_out", "y"),
                          {"targets": [str(theirs.execution_id)]})
    assert client.wait(sender.execution_id, timeout=10).output == [
        {"skipped": "target_not_found"}
    ]
    assert all_rows(client.map, "SELECT count(*) FROM shardq.signals") == [(0,), (0,)]
