"""One refusal, one reason code, whoever sends: a client, a run of the target's shard, the relay."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.errors import ExternalSignalFailed, SignalRefused
from shardq.core.models import State
from shardq.outbox.relay import Relay, RelayConfig
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker
from shardq.workflow.builder import Workflow
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import key_on, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
registry.register_definition(
    Workflow("two_gates")
    .step("prepare", lambda run: None)
    .wait_for("manager")
    .wait_for("finance")
    .step("pay", lambda run: run.signals)
    .build()
)


@registry.workflow("notifier")
def notifier(ctx: WorkflowContext) -> dict[str, Any]:
    """Signal `finance` to the target once; say how it went."""
    try:
        sent = ctx.signal_external(ctx.input["target"], "finance", {"by": ctx.workflow_id})
    except ExternalSignalFailed as exc:
        return {"reason_code": exc.reason_code, "detail": str(exc)}
    return {"queued": sent.queued, "delivered": sent.delivered}


@pytest.fixture
def relay(pools: ShardPools) -> Iterator[Callable[[], Relay]]:
    started: list[Relay] = []

    def start() -> Relay:
        config = RelayConfig(poll_interval_s=0.2, initial_backoff_s=0.05, max_backoff_s=0.2)
        started.append(Relay(Store(pools), config=config).start())
        return started[-1]

    yield start
    for running in started:
        running.stop()


def test_a_closed_gate_refuses_a_client_a_same_shard_run_and_the_relay_alike(
    client: Client, start_worker: StartWorker, relay: Callable[[], Relay]
) -> None:
    start_worker(registry)
    gated = client.start("two_gates", key_on(client.map, 1, "two_gates", "g")).execution_id
    # The finance gate takes this one (kept until the run reaches it) and closes.
    client.signal(gated, "finance", {"by": "first"})

    with pytest.raises(SignalRefused) as by_client:
        client.signal(gated, "finance", {"by": "client"})

    near = client.start("notifier", key_on(client.map, 1, "notifier", "near"),
                        {"target": str(gated)}).execution_id
    same_shard = client.wait(near, timeout=10)
    assert same_shard.state is State.COMPLETED, same_shard.error

    far = client.start("notifier", key_on(client.map, 0, "notifier", "far"),
                       {"target": str(gated)}).execution_id
    assert client.wait(far, timeout=10).output == {"queued": True, "delivered": False}
    relay()
    wait_until(lambda: any(e.kind == "external.failed" for e in client.history(far)),
               what="the relay's refusal in the sender's history")
    (relayed,) = [e.payload for e in client.history(far) if e.kind == "external.failed"]

    codes = {by_client.value.reason_code, same_shard.output["reason_code"],
             relayed["reason_code"]}
    assert codes == {"gate_closed"}
    assert str(by_client.value) in same_shard.output["detail"]
    assert relayed["detail"] == str(by_client.value)
    # None of them reached the run: the first signal stands.
    client.signal(gated, "manager")
    done = client.wait(gated, timeout=10)
    assert done.state is State.COMPLETED, done.error
    assert done.output["steps"]["pay"] == {"manager": None, "finance": {"by": "first"}}
