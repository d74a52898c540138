"""The fence of a move, in every write path: a shard writes a run only while the run's
bucket is writable by its own ownership row.

A move freezes a bucket range on its source (owned, not writable) while it copies
it, then releases it (not owned). Each test here freezes or releases the bucket of
one run by hand, on the shard's ownership row, and asserts what a caller sees (the
refusal, with the map version or the move) and that nothing was stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import StoreConflict
from shardq.core.models import Claim, ExternalRequest, State, TaskAction, TurnCommit
from shardq.outbox.store import OutboxStore
from shardq.shards.config import ShardMap
from shardq.shards.errors import Fenced, NotOwner
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for, bucket_of, new_execution_id
from shardq.store.params import (
    InterruptDecision,
    Lease,
    NewRun,
    SignalDelivery,
    StartBatch,
    StartSignalled,
)
from shardq.store.store import Store
from shardq.worker.completer import Completer
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import in_thread, key_on, keys_on, rows, wait_until, waiting_on_a_lock

registry = Registry()


@registry.workflow("fence_parked")
def fence_parked(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go")


@registry.workflow("fence_review")
def fence_review(ctx: WorkflowContext) -> Any:
    return ctx.interrupt("approve", prompt="ok?")


@pytest.fixture
def ownership(shard_map: ShardMap) -> Iterator[Callable[[str, uuid.UUID], None]]:
    """`change("freeze" | "release", run)` on the run's shard; every shard's ownership
    row is put back after the test (the session's shards outlive it)."""
    saved = {s.url: rows(s.url, "SELECT writable::text, owned::text FROM shardq.ownership")[0]
             for s in shard_map.shards}

    def change(how: str, run: uuid.UUID) -> None:
        bucket = bucket_of(run)
        url = shard_map.for_execution(run).url
        if how == "freeze":
            rows(url, "UPDATE shardq.ownership SET writable = set_bit(writable, %s, 0), "
                      "unclean = true, fence_move = 7, fence_target = 'shard-1' RETURNING 1",
                 bucket)
        else:
            rows(url, "UPDATE shardq.ownership SET writable = set_bit(writable, %s, 0), "
                      "owned = set_bit(owned, %s, 0), unclean = true RETURNING 1",
                 bucket, bucket)

    yield change
    for url, (writable, owned) in saved.items():
        rows(url, "UPDATE shardq.ownership SET writable = %s::bit(4096), owned = %s::bit(4096),"
                  " unclean = false, fence_move = NULL, fence_target = NULL RETURNING 1",
             writable, owned)


def _history(shard_map: ShardMap, run: uuid.UUID) -> list[tuple[Any, ...]]:
    url = shard_map.for_execution(run).url
    return rows(url, "SELECT seq, kind, name FROM shardq.events WHERE execution_id = %s "
                     "ORDER BY position NULLS LAST, seq", run)


def _count(shard_map: ShardMap, table: str, column: str, run: uuid.UUID) -> int:
    url = shard_map.for_execution(run).url
    return int(rows(url, f"SELECT count(*) FROM shardq.{table} WHERE {column} = %s", run)[0][0])


def _new_run(shard_map: ShardMap, workflow: str, prefix: str) -> NewRun:
    workflow_id = key_on(shard_map, 0, workflow, prefix)
    bucket = bucket_for("default", workflow, workflow_id)
    return NewRun(new_execution_id(bucket), workflow_id, "null", bucket)


# -- refusals of client writes ---------------------------------------------------

REFUSALS: dict[str, type[NotOwner]] = {"freeze": Fenced, "release": NotOwner}
"""What a write meets: a bucket frozen by a move, or one that moved away."""


@pytest.mark.parametrize("how, refusal", [("freeze", Fenced), ("release", NotOwner)])
def test_a_start_in_a_bucket_not_writable_stores_no_run(
    shard_map: ShardMap, pools: ShardPools, ownership: Any, how: str, refusal: type[NotOwner]
) -> None:
    store = Store(pools)
    run = _new_run(shard_map, "fence_parked", "start")
    other = _new_run(shard_map, "fence_parked", "start-other")
    ownership(how, run.execution_id)
    shard = shard_map.for_execution(run.execution_id)
    with pytest.raises(refusal) as caught:
        store.start_executions(shard, StartBatch("default", "fence_parked", 1, [other, run]))
    assert type(caught.value) is refusal
    assert caught.value.bucket == run.bucket and caught.value.map_version == 1
    if refusal is Fenced:
        assert (caught.value.move, caught.value.target) == (7, "shard-1")  # type: ignore[attr-defined]
    # Neither run of the batch: the refusal rolls back the whole statement.
    assert _count(shard_map, "executions", "id", run.execution_id) == 0
    assert _count(shard_map, "executions", "id", other.execution_id) == 0


def _parked_run(client: Client, workflow: str, prefix: str) -> uuid.UUID:
    """A run of `workflow` with its task row gone, as a parked run has."""
    run = client.start(workflow, key_on(client.map, 0, workflow, prefix)).execution_id
    rows(client.map.for_execution(run).url,
         "DELETE FROM shardq.tasks WHERE execution_id = %s RETURNING 1", run)
    return run


Write = Callable[[Store, Client, uuid.UUID], object]

WRITES: dict[str, Write] = {
    "signal": lambda store, client, run: store.deliver_signals(
        client.map.for_execution(run), "default",
        [SignalDelivery(run, "go", '"x"', "key-1")]),
    "relayed signal": lambda store, client, run: store.deliver_signals(
        client.map.for_execution(run), "default",
        [SignalDelivery(run, "go", '"x"', None, f"{uuid.uuid4()}/3")]),
    "signal_with_start": lambda store, client, run: store.signal_with_start(
        client.map.for_execution(run), StartSignalled(
            StartBatch("default", "fence_parked", 1, [NewRun(
                new_execution_id(bucket_of(run)),
                rows(client.map.for_execution(run).url,
                     "SELECT workflow_id FROM shardq.executions WHERE id = %s", run)[0][0],
                "null", bucket_of(run))]),
            "go", '"x"', None)),
    "cancel": lambda store, client, run: store.cancel(
        client.map.for_execution(run), run, tenant="default"),
    "decide": lambda store, client, run: store.decide_interrupt(
        client.map.for_execution(run), InterruptDecision(
            run, "default", "approve", None, "approve", "null", "d-1", "alice")),
}


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("how", list(REFUSALS))
def test_a_write_to_a_run_whose_bucket_is_not_writable_is_refused_and_stores_nothing(
    client: Client, pools: ShardPools, ownership: Any, write: str, how: str
) -> None:
    refusal = REFUSALS[how]
    store = Store(pools)
    run = _parked_run(client, "fence_parked", f"w-{write}")
    before = (_history(client.map, run), _count(client.map, "signals", "execution_id", run),
              _count(client.map, "tasks", "execution_id", run))
    ownership(how, run)
    with pytest.raises(refusal) as caught:
        WRITES[write](store, client, run)
    assert type(caught.value) is refusal and caught.value.bucket == bucket_of(run)
    after = (_history(client.map, run), _count(client.map, "signals", "execution_id", run),
             _count(client.map, "tasks", "execution_id", run))
    assert after == before


def test_a_signal_batch_with_one_target_not_writable_delivers_none(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    """The whole call is refused: the caller re-routes it by the newer map, and the
    targets that did not move get theirs then, once."""
    store = Store(pools)
    runs = [_parked_run(client, "fence_parked", f"batch-{i}") for i in range(3)]
    ownership("release", runs[1])
    with pytest.raises(NotOwner):
        store.deliver_signals(client.map.for_execution(runs[0]), "default",
                              [SignalDelivery(r, "go", '"x"', None) for r in runs])
    assert [_count(client.map, "signals", "execution_id", r) for r in runs] == [0, 0, 0]


# -- the worker's and the relay's paths: skipped per run, not refused -------------

def test_a_claim_skips_runs_of_frozen_buckets_and_does_not_count_them_due(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    store = Store(pools)
    shard = client.map.shards[0]
    frozen, free = (client.start("fence_parked", key).execution_id
                    for key in keys_on(client.map, 0, "fence_parked", "claim", 2))
    rows(shard.url, "UPDATE shardq.tasks SET run_at = now() + interval '1 hour' "
                    "WHERE execution_id = %s RETURNING 1", free)
    ownership("freeze", frozen)
    claims, next_due = store.claim(shard, owner="test", limit=10, lease_s=30)
    assert claims == []
    # The frozen run's due task is not "due now": a claim loop would spin on it.
    assert next_due is not None and next_due > 3000
    assert _count(client.map, "tasks", "execution_id", frozen) == 1


def _two_claimed(client: Client, store: Store, prefix: str
                 ) -> tuple[uuid.UUID, uuid.UUID, list[Claim]]:
    """Two runs of shard 0, the first to be frozen, both claimed: (frozen, free, claims)."""
    frozen, free = (client.start("fence_parked", key).execution_id
                    for key in keys_on(client.map, 0, "fence_parked", prefix, 2))
    claims, _ = store.claim(client.map.shards[0], owner="test", limit=10, lease_s=30)
    assert {c.execution_id for c in claims} == {frozen, free}
    return frozen, free, claims


def test_a_commit_of_a_run_frozen_after_its_claim_is_a_lost_lease(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    store = Store(pools)
    shard = client.map.shards[0]
    frozen, free, claims = _two_claimed(client, store, "commit")
    ownership("freeze", frozen)
    # The heartbeat tells the worker first: the frozen run's lease is not extended.
    leases = [Lease(c.execution_id, c.lease_token) for c in claims]
    assert store.extend_leases(shard, leases, lease_s=30) == {free}
    commits = [TurnCommit(c.execution_id, c.lease_token, state=State.COMPLETED,
                          output_json="1", task=TaskAction.DELETE) for c in claims]
    outcome = store.commit_turns(shard, commits, lease_s=30)
    assert outcome[free].landed and not outcome[frozen].landed
    assert [k for _, k, _ in _history(client.map, frozen)] == []
    assert [k for _, k, _ in _history(client.map, free)] == ["run.completed"]


def test_a_same_shard_send_to_a_run_that_moved_goes_through_the_outbox(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    """The worker chose "same shard" from its map; the target's bucket moved since.
    The commit queues the signal for the relay (which finds the owner), records it as
    queued and answers so, instead of refusing the whole batch."""
    store = Store(pools)
    shard = client.map.shards[0]
    stay, moved = (_parked_run(client, "fence_parked", f"target-{i}") for i in range(2))
    sender = client.start("fence_parked", key_on(client.map, 0, "fence_parked", "sender"))
    (claim,), _ = store.claim(shard, owner="test", limit=10, lease_s=30)
    ownership("release", moved)
    sends = [ExternalRequest(0, moved, "go", '"a"', "k-a"),
             ExternalRequest(1, stay, "go", '"b"', None),
             ExternalRequest(2, moved, "go", '"c"', None)]
    commit = TurnCommit(claim.execution_id, claim.lease_token, state=State.COMPLETED,
                        output_json="1", task=TaskAction.DELETE, externals=sends)
    outcome = store.commit_turns(shard, [commit], lease_s=30)[sender.execution_id]
    assert outcome.landed
    assert [("queued" in o, o.get("delivered")) for o in outcome.externals or ()] == [
        (True, None), (False, True), (True, None)]
    assert [(k, n) for _, k, n in _history(client.map, sender.execution_id)] == [
        ("external.queued", "go"), ("external.sent", "go"), ("external.queued", "go"),
        ("run.completed", "run")]
    queued = rows(shard.url, "SELECT source_position, target_execution_id, target_bucket, "
                             "payload::text, idempotency_key FROM shardq.outbox ORDER BY id")
    assert queued == [(0, moved, bucket_of(moved), '"a"', "k-a"),
                      (2, moved, bucket_of(moved), '"c"', None)]
    assert _count(client.map, "signals", "execution_id", stay) == 1
    assert _count(client.map, "signals", "execution_id", moved) == 0


def test_a_send_whose_target_is_frozen_during_the_commit_is_queued_on_the_retry(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    """The commit reads which buckets it can write, then delivers its same-shard
    sends, each fenced again. A freeze that commits in between refuses the delivery
    (Fenced) and with it the batch, which stored nothing; the completer retries it,
    and the retry, reading the freeze, queues the send for the relay."""
    store = Store(pools)
    shard = client.map.shards[0]
    target = _parked_run(client, "fence_parked", "frozen-mid-commit")
    sender = client.start("fence_parked", key_on(client.map, 0, "fence_parked", "mid")
                          ).execution_id
    (claim,), _ = store.claim(shard, owner="test", limit=10, lease_s=30)
    # The sender's open wait, which its commit closes after reading the ownership row.
    rows(shard.url, "INSERT INTO shardq.waits (execution_id, position, kind, name) "
                    "VALUES (%s, 0, 'signal', 'go') RETURNING 1", sender)
    commit = TurnCommit(claim.execution_id, claim.lease_token, state=State.COMPLETED,
                        output_json="1", task=TaskAction.DELETE, close_wait=True,
                        externals=[ExternalRequest(1, target, "go", '"x"', "k-x")])
    completer = Completer(store, shard, lease_s=30).start()
    try:
        with psycopg.connect(shard.url) as holder:
            holder.execute("SELECT 1 FROM shardq.waits WHERE execution_id = %s FOR UPDATE",
                           [sender])
            committer, outcome = in_thread(lambda: completer.submit(commit))
            wait_until(lambda: waiting_on_a_lock(shard.url, holder.info.backend_pid),
                       what="the commit waiting to close the sender's wait")
            ownership("freeze", target)
            holder.rollback()
        committer.join(15)
    finally:
        completer.close()
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert outcome[0].landed
    assert [o.get("queued") for o in outcome[0].externals or ()] == [True]
    assert [(k, n) for _, k, n in _history(client.map, sender)] == [
        ("external.queued", "go"), ("run.completed", "run")]
    assert rows(shard.url, "SELECT target_execution_id, idempotency_key FROM shardq.outbox"
                ) == [(target, "k-x")]
    assert _count(client.map, "signals", "execution_id", target) == 0


def test_the_relay_does_not_claim_rows_of_a_frozen_sender(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    store = Store(pools)
    shard = client.map.shards[0]
    sender = _parked_run(client, "fence_parked", "relay-sender")
    target = new_execution_id(4095)  # the last shard's
    rows(shard.url, "INSERT INTO shardq.outbox (source_execution_id, source_position, "
                    "target_execution_id, target_bucket, tenant, signal_name, payload) "
                    "VALUES (%s, 0, %s, %s, 'default', 'go', '1') RETURNING 1",
         sender, target, bucket_of(target))
    outbox = OutboxStore(store)
    ownership("freeze", sender)
    with outbox.claim(shard, limit=10) as (claimed, _):
        assert claimed == []
    assert outbox.next_due(shard) is None
    assert rows(shard.url, "SELECT state FROM shardq.outbox") == [("pending",)]


# -- reads by id -----------------------------------------------------------------

READS: dict[str, Write] = {
    "get": lambda store, client, run: store.get_execution(client.map.for_execution(run), run),
    "history": lambda store, client, run: store.read_history(
        client.map.for_execution(run), run),
    "waits": lambda store, client, run: store.waits_and_signals(
        client.map.for_execution(run), [run]),
    "signal by key": lambda store, client, run: store.signal_by_key(
        client.map.for_execution(run), run, "k"),
    "update outcome": lambda store, client, run: store.update_outcome(
        client.map.for_execution(run), run, 1),
    "find by key": lambda store, client, run: store.find_run(
        client.map.for_execution(run), tenant="default", workflow_name="fence_parked",
        workflow_id=_workflow_id(client, run), bucket=bucket_of(run)),
}


def _workflow_id(client: Client, run: uuid.UUID) -> str:
    return str(rows(client.map.for_execution(run).url,
                    "SELECT workflow_id FROM shardq.executions WHERE id = %s", run)[0][0])


def test_a_lookup_by_key_of_a_run_cleaned_up_after_it_moved_away_is_refused(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    """Once the source's cleanup deleted a moved run, a reader with an older map finds
    nothing there: it must be sent on to the owner, not told the key has no run."""
    store = Store(pools)
    run = _parked_run(client, "fence_parked", "lookup-cleaned")
    key = _workflow_id(client, run)
    shard = client.map.for_execution(run)
    ownership("release", run)
    rows(shard.url, "DELETE FROM shardq.executions WHERE id = %s RETURNING 1", run)
    with pytest.raises(NotOwner) as caught:
        store.find_run(shard, tenant="default", workflow_name="fence_parked", workflow_id=key,
                       bucket=bucket_of(run))
    assert caught.value.bucket == bucket_of(run)


@pytest.mark.parametrize("read", list(READS))
def test_a_read_of_a_run_that_moved_away_is_refused_and_one_frozen_is_served(
    client: Client, pools: ShardPools, ownership: Any, read: str
) -> None:
    """The source keeps a moved run's rows until its cleanup: a reader routed there by an
    older map is sent on (NotOwner), not served that copy. A frozen run's rows cannot
    change until the switch, so they are read where they are."""
    store = Store(pools)
    frozen, moved = (_parked_run(client, "fence_parked", f"read-{read}-{i}") for i in range(2))
    ownership("freeze", frozen)
    ownership("release", moved)
    READS[read](store, client, frozen)
    with pytest.raises(NotOwner) as caught:
        READS[read](store, client, moved)
    assert type(caught.value) is NotOwner and caught.value.bucket == bucket_of(moved)


def test_a_batch_finishing_runs_frozen_while_it_deleted_their_tasks_lands_nothing(
    client: Client, pools: ShardPools, ownership: Any
) -> None:
    """A batch whose every commit ends its run reads the shard clean, then deletes
    its task rows (the fused fence). A freeze that commits in between, before the
    DELETE took an xid for the mover to wait on, must not let the frozen run's
    commit land: the whole batch is refused as a serialization failure, which the
    worker retries, and the retry drops the frozen run's commit as a lost lease."""
    store = Store(pools)
    shard = client.map.shards[0]
    frozen, free, claims = _two_claimed(client, store, "fused")
    commits = [TurnCommit(c.execution_id, c.lease_token, state=State.COMPLETED,
                          output_json="1", task=TaskAction.DELETE) for c in claims]
    with psycopg.connect(shard.url) as holder:
        # The batch's DELETE, past its check of the shard, waits on this lock.
        holder.execute("SELECT 1 FROM shardq.tasks WHERE execution_id = %s FOR UPDATE",
                       [max(frozen, free)])
        committer, first = in_thread(lambda: store.commit_turns(shard, commits, lease_s=30))
        wait_until(lambda: waiting_on_a_lock(shard.url, holder.info.backend_pid),
                   what="the batch's DELETE waiting on a task row")
        ownership("freeze", frozen)
        holder.rollback()
    committer.join(15)
    assert len(first) == 1 and isinstance(first[0], StoreConflict), first
    assert _history(client.map, frozen) == [] and _history(client.map, free) == []
    assert _count(client.map, "tasks", "execution_id", frozen) == 1
    retried = store.commit_turns(shard, commits, lease_s=30)
    assert retried[free].landed and not retried[frozen].landed
    assert [k for _, k, _ in _history(client.map, frozen)] == []
    assert [k for _, k, _ in _history(client.map, free)] == ["run.completed"]
