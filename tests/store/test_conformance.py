"""One table of WorkerStore behaviours, each row run against the real Store on a
PostgreSQL shard and against tests/memory_store.py's MemoryStore.

The fake is only worth its speed while it behaves as the store does: a row
that passes on PostgreSQL and fails on the fake is a bug in the fake (or a
simplification its docstring must own up to). Rows use only the protocol's
calls plus three handles of the rig: start a run, move the clock on (ageing
the stored times on PostgreSQL), and hold the purge lock as another purger.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

import psycopg
import pytest

from shardq.core.models import Claim, Event, NewEvent, State, TaskAction, TurnCommit
from shardq.shards.config import Shard, ShardMap
from shardq.shards.routing import new_execution_id
from shardq.store.params import Lease, NewRun, StartBatch
from shardq.store.protocol import WorkerStore
from shardq.store.store import Store

from ..memory_store import MemoryStore
from ..support import age

LEASE_S = 30.0


class Rig(Protocol):
    store: WorkerStore
    shard: Shard

    def start(self, workflow_id: str, *, workflow: str = "job", priority: int = 0) -> uuid.UUID:
        """A new run whose first task is due now."""
        ...

    def advance(self, seconds: float) -> None:
        """The clock moves on by `seconds` for every stored time."""
        ...

    def other_purger(self) -> contextlib.AbstractContextManager[None]:
        """Another purger holds the shard while the block runs."""
        ...


class PgRig:
    """The real store on the session's first shard (its bucket 0 routes there)."""

    def __init__(self, store: Store, shard_map: ShardMap) -> None:
        self._store = store
        self.store: WorkerStore = store  # mypy: the real Store fits the protocol
        self._map = shard_map
        self.shard = shard_map.shards[0]
        assert shard_map.for_bucket(0) is self.shard

    def start(self, workflow_id: str, *, workflow: str = "job", priority: int = 0) -> uuid.UUID:
        run = NewRun(new_execution_id(0), workflow_id, "null", 0)
        (started,) = self._store.start_executions(
            self.shard, StartBatch("default", workflow, 1, [run], priority=priority))
        return started.execution_id

    def advance(self, seconds: float) -> None:
        # Time in the store is now() against stored times: ageing them is the clock moving.
        for table, column in (("tasks", "run_at"), ("tasks", "leased_until"),
                              ("history", "recorded_at")):
            age(self._map, table, column, seconds)

    @contextlib.contextmanager
    def other_purger(self) -> Iterator[None]:
        with psycopg.connect(self.shard.url) as conn:  # a transaction until the block ends
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('shardq.purge'))")
            yield
            conn.rollback()


class MemoryRig:
    def __init__(self) -> None:
        self.fake = MemoryStore()
        self.store: WorkerStore = self.fake
        self.shard = self.fake.map.shards[0]

    def start(self, workflow_id: str, *, workflow: str = "job", priority: int = 0) -> uuid.UUID:
        return self.fake.start(workflow_id, workflow=workflow, priority=priority)

    def advance(self, seconds: float) -> None:
        self.fake.advance(seconds)

    @contextlib.contextmanager
    def other_purger(self) -> Iterator[None]:
        self.fake.purger_busy = True
        try:
            yield
        finally:
            self.fake.purger_busy = False


@pytest.fixture(params=["postgres", "memory"])
def rig(request: pytest.FixtureRequest) -> Rig:
    if request.param == "memory":
        return MemoryRig()
    return PgRig(request.getfixturevalue("store"), request.getfixturevalue("shard_map"))


# -- the rows' vocabulary --------------------------------------------------------------

def claim(rig: Rig, limit: int = 10, *, lease_s: float = LEASE_S, min_priority: int = 0,
          owner: str = "w1") -> list[Claim]:
    return rig.store.claim(rig.shard, owner=owner, limit=limit, lease_s=lease_s,
                           min_priority=min_priority)[0]


def due_in(rig: Rig, limit: int = 10) -> float | None:
    return rig.store.claim(rig.shard, owner="w1", limit=limit, lease_s=LEASE_S)[1]


def ids(claims: list[Claim]) -> list[uuid.UUID]:
    return [c.execution_id for c in claims]


def lease(c: Claim) -> Lease:
    return Lease(c.execution_id, c.lease_token)


def commit(rig: Rig, *commits: TurnCommit) -> dict[uuid.UUID, bool]:
    outcomes = rig.store.commit_turns(rig.shard, commits, lease_s=LEASE_S)
    return {i: o.landed for i, o in outcomes.items()}


def finish(c: Claim, token: uuid.UUID | None = None) -> TurnCommit:
    return TurnCommit(c.execution_id, token or c.lease_token, state=State.COMPLETED,
                      output_json="1", task=TaskAction.DELETE)


def schedule(c: Claim, delay: float, token: uuid.UUID | None = None) -> TurnCommit:
    return TurnCommit(
        c.execution_id, token or c.lease_token,
        events=[NewEvent(0, Event.STEP_COMPLETED, "s", {"result": 1})],
        state=State.PENDING, task=TaskAction.SCHEDULE, delay=delay)


def purge(rig: Rig, retention_s: float, *, workflows: tuple[str, ...] = (),
          listed: bool = False, limit: int = 100) -> int | None:
    return rig.store.purge_batch(rig.shard, retention_s=retention_s, workflows=workflows,
                                 listed=listed, limit=limit)


def finished(rig: Rig, workflow_id: str, workflow: str = "job") -> uuid.UUID:
    run = rig.start(workflow_id, workflow=workflow)
    (c,) = [x for x in claim(rig) if x.execution_id == run]
    assert commit(rig, finish(c)) == {run: True}
    return run


# -- claiming --------------------------------------------------------------------

def claim_takes_due_work_with_its_run(rig: Rig) -> None:
    run = rig.start("a")
    (c,) = claim(rig, owner="w1")
    assert (c.execution_id, c.claims, c.workflow_name, c.workflow_id, c.tenant, c.input) == (
        run, 1, "job", "a", "default", None)
    assert c.history == () and c.signals == ()


def claim_of_nothing_says_nothing_is_due(rig: Rig) -> None:
    assert rig.store.claim(rig.shard, owner="w1", limit=10, lease_s=LEASE_S) == ([], None)


def claim_skips_work_due_later(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    assert commit(rig, schedule(c, 60)) == {c.execution_id: True}
    assert claim(rig) == []
    rig.advance(61)
    assert ids(claim(rig)) == [c.execution_id]


def claim_respects_the_limit_and_says_more_may_be_due(rig: Rig) -> None:
    for name in "abc":
        rig.start(name)
    first, due = rig.store.claim(rig.shard, owner="w1", limit=2, lease_s=LEASE_S)
    assert len(first) == 2 and due == 0.0  # a full batch: ask again at once
    assert len(claim(rig, 2)) == 1


def claim_says_when_a_timer_is_due(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    commit(rig, schedule(c, 60))
    seconds = due_in(rig)
    assert seconds is not None and 59 < seconds <= 60


def claim_says_when_its_own_lease_expires(rig: Rig) -> None:
    rig.start("a")
    _, seconds = rig.store.claim(rig.shard, owner="w1", limit=10, lease_s=LEASE_S)
    assert seconds is not None and LEASE_S - 1 < seconds <= LEASE_S


def higher_priority_is_claimed_first(rig: Rig) -> None:
    low = rig.start("low")
    rig.advance(1)
    high, mid = rig.start("high", priority=5), rig.start("mid", priority=3)
    assert ids(claim(rig)) == [high, mid, low]


def priority_beats_age_when_the_batch_is_short(rig: Rig) -> None:
    rig.start("old")
    rig.advance(10)
    urgent = rig.start("new", priority=1)
    assert ids(claim(rig, 1)) == [urgent]


def oldest_first_within_a_level(rig: Rig) -> None:
    old0, old4 = rig.start("a"), rig.start("b", priority=4)
    rig.advance(1)
    new0, new4 = rig.start("c"), rig.start("d", priority=4)
    rig.advance(1)
    newest4 = rig.start("e", priority=4)
    assert [ids(claim(rig, 1)) for _ in range(5)] == [
        [old4], [new4], [newest4], [old0], [new0]]


def min_priority_claims_only_that_level_and_up(rig: Rig) -> None:
    low, two, five = rig.start("l"), rig.start("t", priority=2), rig.start("f", priority=5)
    assert ids(claim(rig, min_priority=3)) == [five]
    assert ids(claim(rig, min_priority=2)) == [two]
    assert claim(rig, min_priority=1) == []
    assert ids(claim(rig)) == [low]  # the fast lane left priority 0 where it was


def min_priority_leaves_the_rest_due(rig: Rig) -> None:
    low = rig.start("l")
    _, seconds = rig.store.claim(rig.shard, owner="w1", limit=10, lease_s=LEASE_S,
                                 min_priority=1)
    assert seconds is not None and seconds <= 0  # the low task it skipped is due now
    assert ids(claim(rig)) == [low]


# -- leases ------------------------------------------------------------------------

def a_live_lease_hides_the_task(rig: Rig) -> None:
    rig.start("a")
    claim(rig, owner="w1")
    rig.advance(LEASE_S - 1)
    assert claim(rig, owner="w2") == []


def an_expired_lease_makes_it_claimable_again(rig: Rig) -> None:
    rig.start("a")
    (first,) = claim(rig, owner="w1")
    rig.advance(LEASE_S + 1)
    (again,) = claim(rig, owner="w2")
    assert again.execution_id == first.execution_id
    assert again.lease_token != first.lease_token and again.claims == 2


def extend_moves_the_expiry(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig, lease_s=10)
    rig.advance(8)
    assert rig.store.extend_leases(rig.shard, [lease(c)], 10) == {c.execution_id}
    rig.advance(8)  # 16 s after the claim: the first lease would have expired
    assert claim(rig, owner="w2") == []
    rig.advance(3)
    assert ids(claim(rig, owner="w2")) == [c.execution_id]


def extend_with_a_stale_token_extends_nothing(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig, lease_s=10)
    stale = Lease(c.execution_id, uuid.uuid4())
    assert rig.store.extend_leases(rig.shard, [stale], 100) == set()
    rig.advance(11)
    assert ids(claim(rig)) == [c.execution_id]


def extend_revives_an_expired_lease_nobody_took(rig: Rig) -> None:
    # The fence is the token, not the clock: until another claim rotates it,
    # an expired lease's holder may still extend it.
    rig.start("a")
    (c,) = claim(rig, lease_s=10)
    rig.advance(11)
    assert rig.store.extend_leases(rig.shard, [lease(c)], 10) == {c.execution_id}
    assert claim(rig, owner="w2") == []


def release_frees_the_task_at_once(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    assert rig.store.release_leases(rig.shard, [lease(c)]) == {c.execution_id}
    (again,) = claim(rig, owner="w2")
    assert again.execution_id == c.execution_id and again.lease_token != c.lease_token
    assert rig.store.release_leases(rig.shard, [lease(c)]) == set()  # no longer its lease


def release_with_a_stale_token_releases_nothing(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    assert rig.store.release_leases(rig.shard, [Lease(c.execution_id, uuid.uuid4())]) == set()
    assert claim(rig, owner="w2") == []


# -- commits -----------------------------------------------------------------------

def a_stale_tokens_commit_does_not_land(rig: Rig) -> None:
    rig.start("a")
    (old,) = claim(rig, owner="w1")
    rig.advance(LEASE_S + 1)
    (new,) = claim(rig, owner="w2")
    assert commit(rig, finish(old)) == {old.execution_id: False}  # in the answer, not landed
    assert commit(rig, finish(new)) == {new.execution_id: True}  # the old one wrote nothing


def a_commit_after_expiry_lands_if_nobody_claimed(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    rig.advance(LEASE_S + 1)
    assert commit(rig, finish(c)) == {c.execution_id: True}
    assert claim(rig) == []


def a_commit_to_a_run_without_a_task_does_not_land(rig: Rig) -> None:
    run = finished(rig, "a")  # its task row is gone with its last commit
    ghost = TurnCommit(run, uuid.uuid4(), state=State.COMPLETED, task=TaskAction.DELETE)
    assert commit(rig, ghost) == {run: False}


def a_checkpoint_rotates_the_token_and_keeps_the_lease(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    step = TurnCommit(c.execution_id, c.lease_token, task=TaskAction.KEEP,
                      events=[NewEvent(0, Event.STEP_COMPLETED, "s", {"result": 1})])
    assert commit(rig, step) == {c.execution_id: True}
    assert claim(rig, owner="w2") == []
    assert commit(rig, finish(c)) == {c.execution_id: False}  # the old token is spent
    assert commit(rig, finish(c, step.next_token)) == {c.execution_id: True}


def a_scheduled_turn_is_claimed_again_with_its_history(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    commit(rig, schedule(c, 0))
    (again,) = claim(rig)
    assert again.claims == 2
    assert [(e.position, e.kind, e.name, e.payload) for e in again.history] == [
        (0, Event.STEP_COMPLETED, "s", {"result": 1})]


def one_commit_per_run_per_call(rig: Rig) -> None:
    rig.start("a")
    (c,) = claim(rig)
    with pytest.raises(ValueError, match="at most one commit"):
        commit(rig, schedule(c, 0), finish(c))


def landed_commits_tells_landed_from_not_sent(rig: Rig) -> None:
    rig.start("a")
    rig.start("b")
    sent, kept = claim(rig)
    commit(rig, finish(sent))
    assert rig.store.landed_commits(rig.shard, [finish(sent), finish(kept)]) == {
        sent.execution_id}


def landed_commits_counts_a_lost_lease_as_retired(rig: Rig) -> None:
    # Not "landed" in the strict sense: its token is gone because another
    # claim took the run. A retry could not have written anything either.
    rig.start("a")
    (old,) = claim(rig)
    rig.advance(LEASE_S + 1)
    claim(rig, owner="w2")
    assert rig.store.landed_commits(rig.shard, [finish(old)]) == {old.execution_id}


# -- purge -------------------------------------------------------------------------

def purge_removes_only_finished_runs_past_retention(rig: Rig) -> None:
    old = finished(rig, "old")
    rig.advance(100)
    young = finished(rig, "young")
    live = rig.start("live")
    (c,) = claim(rig)
    rig.advance(10)
    assert purge(rig, 50) == 1
    assert purge(rig, 50) == 0
    assert rig.store.landed_commits(rig.shard, [finish(c)]) == set()  # the live run stays
    assert commit(rig, finish(c)) == {live: True}
    assert purge(rig, 5) == 1  # young (10 s); live finished just now
    rig.advance(6)
    assert purge(rig, 5) == 1
    assert rig.store.landed_commits(rig.shard, [finish(c)]) == {live}
    assert {old, young}.isdisjoint({live})


def purge_picks_workflows_by_list(rig: Rig) -> None:
    finished(rig, "a", workflow="job")
    finished(rig, "b", workflow="other")
    rig.advance(100)
    assert purge(rig, 50, workflows=("other",), listed=True) == 1
    assert purge(rig, 50, workflows=("job",), listed=True) == 1
    assert purge(rig, 50) == 0


def purge_excludes_the_listed_workflows_from_the_default(rig: Rig) -> None:
    finished(rig, "a", workflow="job")
    finished(rig, "b", workflow="other")
    rig.advance(100)
    assert purge(rig, 50, workflows=("other",), listed=False) == 1
    assert purge(rig, 50, workflows=("other",), listed=True) == 1


def purge_stops_at_its_limit(rig: Rig) -> None:
    for name in "abc":
        finished(rig, name)
    rig.advance(100)
    assert purge(rig, 50, limit=2) == 2
    assert purge(rig, 50, limit=2) == 1


def purge_answers_none_while_another_purger_holds_the_shard(rig: Rig) -> None:
    finished(rig, "a")
    rig.advance(100)
    with rig.other_purger():
        assert purge(rig, 50) is None
    assert purge(rig, 50) == 1


ROWS: list[Callable[[Rig], None]] = [
    claim_takes_due_work_with_its_run,
    claim_of_nothing_says_nothing_is_due,
    claim_skips_work_due_later,
    claim_respects_the_limit_and_says_more_may_be_due,
    claim_says_when_a_timer_is_due,
    claim_says_when_its_own_lease_expires,
    higher_priority_is_claimed_first,
    priority_beats_age_when_the_batch_is_short,
    oldest_first_within_a_level,
    min_priority_claims_only_that_level_and_up,
    min_priority_leaves_the_rest_due,
    a_live_lease_hides_the_task,
    an_expired_lease_makes_it_claimable_again,
    extend_moves_the_expiry,
    extend_with_a_stale_token_extends_nothing,
    extend_revives_an_expired_lease_nobody_took,
    release_frees_the_task_at_once,
    release_with_a_stale_token_releases_nothing,
    a_stale_tokens_commit_does_not_land,
    a_commit_after_expiry_lands_if_nobody_claimed,
    a_commit_to_a_run_without_a_task_does_not_land,
    a_checkpoint_rotates_the_token_and_keeps_the_lease,
    a_scheduled_turn_is_claimed_again_with_its_history,
    one_commit_per_run_per_call,
    landed_commits_tells_landed_from_not_sent,
    landed_commits_counts_a_lost_lease_as_retired,
    purge_removes_only_finished_runs_past_retention,
    purge_picks_workflows_by_list,
    purge_excludes_the_listed_workflows_from_the_default,
    purge_stops_at_its_limit,
    purge_answers_none_while_another_purger_holds_the_shard,
]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.__name__)
def test_behaviour(rig: Rig, row: Callable[[Rig], None]) -> None:
    row(rig)
