"""ctx.signal_external across shards: an outbox row in the sender's commit, the relay delivers."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import psycopg

from shardq.client.client import Client
from shardq.core.models import State
from shardq.outbox.relay import Relay
from shardq.outbox.store import OutboxStore
from shardq.shards.config import ShardMap
from shardq.shards.routing import new_execution_id
from shardq.store.params import SignalDelivery
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import key_on, rows, run_cli, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
keys = itertools.count()


@registry.workflow("inbox")
def inbox(ctx: WorkflowContext) -> list[Any]:
    """Collect `count` signals named "item", in the order they are consumed."""
    return [ctx.wait_for_signal("item") for _ in range(ctx.input["count"])]


@registry.workflow("sender")
def sender(ctx: WorkflowContext) -> list[Any]:
    """Send `count` numbered signals to `target`; the key expression changes every turn."""
    sent = []
    for seq in range(ctx.input["count"]):
        key = ctx.input.get("key") or (f"k{seq}-{next(keys)}" if ctx.input.get("keyed") else None)
        result = ctx.signal_external(ctx.input["target"], "item", {"seq": seq},
                                     idempotency_key=key)
        sent.append({"queued": result.queued, "key": result.idempotency_key})
    ctx.sleep("settle", 0.05)  # a second turn: replay must send nothing again
    return sent


def outbox_rows(client: Client, shard_index: int) -> list[tuple[Any, ...]]:
    return rows(client.map.shards[shard_index].url,
                "SELECT state, failure_reason, attempts FROM shardq.outbox ORDER BY id")


def test_a_signal_to_another_shard_waits_in_the_outbox_until_the_relay_delivers_it(
    client: Client, start_worker: StartWorker, relay: Callable[..., Relay]
) -> None:
    start_worker(registry)
    target = client.start("inbox", key_on(client.map, 1, "inbox", "t"), {"count": 3})
    source = client.start("sender", key_on(client.map, 0, "sender", "s"),
                          {"target": str(target.execution_id), "count": 3, "keyed": True})
    done = client.wait(source.execution_id, timeout=10)
    assert done.state is State.COMPLETED, done.error
    # Keys as first computed: the replay after the sleep computed others.
    assert [s["key"].split("-")[0] for s in done.output] == ["k0", "k1", "k2"]
    assert all(s["queued"] for s in done.output)
    assert outbox_rows(client, 0) == [("pending", None, 0)] * 3
    assert client.get(target.execution_id).state is State.WAITING

    relay()
    finished = client.wait(target.execution_id, timeout=10)
    assert finished.output == [{"seq": 0}, {"seq": 1}, {"seq": 2}]
    wait_until(lambda: outbox_rows(client, 0) == [], what="delivered rows deleted")
    history = client.history(source.execution_id)
    queued = [(e.position, e.kind, e.payload["idempotency_key"]) for e in history
              if e.kind.startswith("external.")]
    assert queued == [(i, "external.queued", done.output[i]["key"]) for i in range(3)]
    stored = rows(client.map.shards[1].url,
                  "SELECT idempotency_key, origin FROM shardq.signals ORDER BY id")
    assert stored == [(done.output[i]["key"], f"{source.execution_id}/{i}") for i in range(3)]


def test_one_sender_s_signals_to_one_target_arrive_in_send_order(
    client: Client, start_worker: StartWorker, relay: Callable[..., Relay]
) -> None:
    relay(batch_size=7)  # several rounds, relaying while the sender still sends
    start_worker(registry)
    target = client.start("inbox", key_on(client.map, 1, "inbox", "t"), {"count": 40})
    client.start("sender", key_on(client.map, 0, "sender", "s"),
                 {"target": str(target.execution_id), "count": 40})
    finished = client.wait(target.execution_id, timeout=20)
    assert finished.output == [{"seq": i} for i in range(40)]


def test_a_target_that_finished_fails_the_row_for_good_and_the_sender_is_told(
    client: Client, start_worker: StartWorker, relay: Callable[..., Relay], shard_map: ShardMap
) -> None:
    start_worker(registry)
    target = client.start("inbox", key_on(client.map, 1, "inbox", "t"), {"count": 1})
    unknown = new_execution_id(client.map.shards[1].first_bucket)
    source = client.start("sender", key_on(client.map, 0, "sender", "s"),
                          {"target": str(target.execution_id), "count": 1})
    other = client.start("sender", key_on(client.map, 0, "sender", "u"),
                         {"target": str(unknown), "count": 1})
    client.wait(source.execution_id, timeout=10)
    client.wait(other.execution_id, timeout=10)
    # The target ends before the relay gets to its row.
    client.signal(target.execution_id, "item", "direct")
    assert client.wait(target.execution_id, timeout=10).output == ["direct"]

    running = relay()
    wait_until(lambda: len(outbox_rows(client, 0)) == 2
               and all(r[0] == "failed" for r in outbox_rows(client, 0)), what="failed rows")
    assert sorted(r[1] for r in outbox_rows(client, 0)) == ["target_finished",
                                                             "target_not_found"]
    failed = [e for e in client.history(source.execution_id) if e.kind == "external.failed"]
    assert len(failed) == 1
    assert failed[0].position is None
    assert failed[0].payload["reason_code"] == "target_finished"
    assert failed[0].payload["position"] == 0
    assert running.counts["failed:target_finished"] == 1
    assert running.counts["failed:target_not_found"] == 1

    urls = ",".join(s.url for s in shard_map.shards)
    shown = run_cli("--shards", urls, "workflow", "show", str(source.execution_id))
    assert shown.returncode == 0, shown.stderr
    assert "external.failed" in shown.stdout and "target_finished" in shown.stdout

    listed = run_cli("--shards", urls, "outbox", "failed", "--json")
    assert listed.returncode == 0, listed.stderr
    status = run_cli("--shards", urls, "outbox", "--json")
    assert status.returncode == 0, status.stderr
    assert '"failed": 2' in status.stdout


def test_one_event_from_a_webhook_and_a_workflow_lands_once_by_its_key(
    client: Client, start_worker: StartWorker, relay: Callable[..., Relay]
) -> None:
    start_worker(registry)
    target = client.start("inbox", key_on(client.map, 1, "inbox", "t"), {"count": 2})
    client.signal(target.execution_id, "item", {"seq": "webhook"}, idempotency_key="evt-1")
    source = client.start("sender", key_on(client.map, 0, "sender", "s"),
                          {"target": str(target.execution_id), "count": 1, "key": "evt-1"})
    client.wait(source.execution_id, timeout=10)
    running = relay()
    wait_until(lambda: outbox_rows(client, 0) == [], what="row settled")
    assert running.counts == {"duplicate": 1}
    assert rows(client.map.shards[1].url, "SELECT payload FROM shardq.signals") == [
        ({"seq": "webhook"},)
    ]


def test_a_relayed_signal_delivered_twice_lands_once_by_its_origin(client: Client) -> None:
    """What a relay killed between the target's commit and the source's mark does."""
    target = client.start("inbox", key_on(client.map, 1, "inbox", "t"), {"count": 1})
    shard = client.map.shards[1]
    for attempt in range(2):
        (result,) = client.store.deliver_signals(
            shard, "default", [SignalDelivery(target.execution_id, "item", "1", None,
                                              origin="some-sender/0")],
        )
        assert result.delivered is (attempt == 0)
    assert rows(shard.url, "SELECT count(*) FROM shardq.signals") == [(1,)]


def test_a_row_waits_behind_an_earlier_row_of_its_pair_until_that_one_is_settled(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    target = client.start("inbox", key_on(client.map, 1, "inbox", "t"), {"count": 2})
    other = client.start("inbox", key_on(client.map, 1, "inbox", "o"), {"count": 1})
    senders = []
    for name, to, count in (("s", target, 2), ("x", other, 1)):
        started = client.start("sender", key_on(client.map, 0, "sender", name),
                               {"target": str(to.execution_id), "count": count})
        client.wait(started.execution_id, timeout=10)
        senders.append(started.execution_id)
    source, store = client.map.shards[0], OutboxStore(client.store)

    def claimable() -> list[tuple[str, int]]:
        with store.claim(source, limit=10) as (claimed, _):
            return [(str(r.target), r.source_position) for r in claimed]

    first = (str(target.execution_id), 0)
    assert sorted(claimable()) == sorted([first, (str(other.execution_id), 0)])
    with store.claim(source, limit=10) as (claimed, settlement):
        head = next(r for r in claimed if (str(r.target), r.source_position) == first)
        settlement.retry.append((head.id, 60.0, "transient", "target down"))
        settlement.delivered += [r.id for r in claimed if r is not head]
    # The second row of the pair is due, but its predecessor waits for a retry.
    assert claimable() == []
    # The relay sleeps until the first row's retry, instead of claiming again and
    # again in the meantime, finding nothing.
    assert 55 < (store.next_due(source) or 0) <= 60
    with store.claim(source, limit=10) as (claimed, settlement):
        assert claimed == []
    store.requeue(source, [head.id])  # not failed: nothing happens
    assert rows(source.url, "SELECT source_position, state, attempts, failure_detail "
                            "FROM shardq.outbox ORDER BY id") == [
        (0, "pending", 1, "target down"), (1, "pending", 0, None)]
    with psycopg.connect(source.url) as conn:
        conn.execute("UPDATE shardq.outbox SET next_attempt_at = now() WHERE id = %s", [head.id])
    with store.claim(source, limit=10) as (claimed, settlement):
        assert [r.source_position for r in claimed] == [0]
        settlement.failed.append((claimed[0].id, "target_refused", "bounds"))
    assert claimable() == [(str(target.execution_id), 1)]
    assert store.requeue(source, [head.id]) == {head.id}
    assert [e.kind for e in client.history(senders[0])
            if e.position is None and e.kind.startswith("external.")] == [
        "external.failed", "external.requeued"]


def test_a_retry_s_backoff_counts_from_the_settle_not_the_claim(client: Client) -> None:
    """A round that waited on a slow target must not have spent the backoff it sets."""
    store = OutboxStore(client.store)
    source = client.map.shards[0]
    target = new_execution_id(client.map.shards[1].first_bucket)
    with psycopg.connect(source.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO shardq.outbox (source_execution_id, source_position, "
            "target_execution_id, target_bucket, tenant, signal_name, payload) "
            "VALUES (%s, 0, %s, %s, 'default', 'go', 'null')",
            [new_execution_id(source.first_bucket), target, client.map.shards[1].first_bucket])
    with store.claim(source, limit=10) as (claimed, settlement):
        assert len(claimed) == 1
        time.sleep(1.5)  # a round spent on a target that did not answer
        settlement.retry.append((claimed[0].id, 5.0, "transient", "target silent"))
    (wait,) = rows(source.url, "SELECT extract(epoch FROM next_attempt_at - now())::float8 "
                               "FROM shardq.outbox")[0]
    assert 4.5 < wait <= 5.0, wait
