"""Worker parts on tests/memory_store.py's MemoryStore: no database, as a unit test
should be. The fake's own behaviour is checked against PostgreSQL in
tests/store/test_conformance.py; here it only stands in for the store."""

from __future__ import annotations

from shardq.core.models import State, TaskAction, TurnCommit
from shardq.worker.completer import Completer
from shardq.worker.retention import RetentionPlan, purge

from ..memory_store import MemoryStore


def _finish(store: MemoryStore, workflow_id: str, workflow: str = "job") -> None:
    store.start(workflow_id, workflow=workflow)
    shard = store.map.shards[0]
    (claim,) = store.claim(shard, owner="t", limit=1, lease_s=30)[0]
    store.commit_turns(shard, [TurnCommit(claim.execution_id, claim.lease_token,
                                          state=State.COMPLETED, task=TaskAction.DELETE)],
                       lease_s=30)


def test_purge_keeps_each_workflow_for_its_own_retention_and_loops_over_batches() -> None:
    store = MemoryStore()
    shard = store.map.shards[0]
    for n in range(3):
        _finish(store, f"s{n}", workflow="short")
    _finish(store, "j", workflow="job")
    plan = RetentionPlan(default_s=100.0, explicit={10.0: ("short",)})
    store.advance(50)
    # A batch of one: purge() must keep asking until a batch comes back short.
    assert purge(store, shard, plan, batch=1) == 3
    store.advance(60)
    assert purge(store, shard, plan, batch=1) == 1
    store.purger_busy = True
    assert purge(store, shard, plan) is None


def test_a_completer_reports_a_lost_lease_as_not_landed() -> None:
    store = MemoryStore()
    shard = store.map.shards[0]
    store.start("a")
    (old,) = store.claim(shard, owner="w1", limit=1, lease_s=30)[0]
    store.advance(31)
    (new,) = store.claim(shard, owner="w2", limit=1, lease_s=30)[0]
    completer = Completer(store, shard, lease_s=30).start()
    try:
        done = TurnCommit(old.execution_id, old.lease_token, state=State.COMPLETED,
                          task=TaskAction.DELETE)
        assert not completer.submit(done).landed
        done.lease_token = new.lease_token
        assert completer.submit(done).landed
    finally:
        completer.close()
