"""A timed wait is decided by the times the store recorded, not by when a worker ran.

Every kind of timed wait (receive, wait_for_signal, wait_until, interrupt, a
builder's gates and interrupt) is played with no worker up across its
deadline: the worker is stopped while the run is parked, the stored clock is
moved past the deadline (`time_passes`, instead of sleeping), the signal or
decision is sent through the Client either before or after that, and a new
worker resumes the run. Then the races no worker's absence explains: a
signal or decision that arrived before the deadline but after the worker's
claim read the run, and a worker whose clock runs ahead of the database's.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import DecisionRefused, SignalTimedOut
from shardq.core.models import Claim, CommitOutcome, Signal, State, TurnCommit
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.turn import run_turn
from shardq.worker.worker import Worker
from shardq.workflow.builder import Run, Workflow
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import rows, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()
TIMEOUT = 60.0
"""Every wait's timeout here: long enough that no deadline passes unless a test moves the
stored clock past it."""
LATER = 2 * TIMEOUT


def time_passes(shard_map: ShardMap, seconds: float) -> None:
    """Move every stored time `seconds` into the past, on every shard: the clock moving on
    for everything the store recorded (deadlines, due times, arrivals, history)."""
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("UPDATE shardq.waits SET started_at = started_at - %(s)s, "
                         "deadline = deadline - %(s)s", {"s": timedelta(seconds=seconds)})
            conn.execute("UPDATE shardq.tasks SET run_at = run_at - %(s)s, "
                         "leased_until = leased_until - %(s)s", {"s": timedelta(seconds=seconds)})
            conn.execute("UPDATE shardq.signals SET received_at = received_at - %(s)s",
                         {"s": timedelta(seconds=seconds)})
            conn.execute("UPDATE shardq.history SET recorded_at = recorded_at - %(s)s",
                         {"s": timedelta(seconds=seconds)})
            conn.execute("UPDATE shardq.history SET payload = jsonb_set(payload, '{wake_at}', "
                         "to_jsonb((payload->>'wake_at')::timestamptz - %(s)s)) "
                         "WHERE payload ? 'wake_at'", {"s": timedelta(seconds=seconds)})


# -- the workflows: each resumes after a timeout with a plain receive, so a late
# signal that stayed buffered shows up as what that receive returns ------------


@registry.workflow("receive")
def receive(ctx: WorkflowContext) -> dict[str, Any]:
    got = ctx.receive("docs", timeout=TIMEOUT)
    if got is not None:
        return {"in_time": got.payload}
    return {"timed_out": True, "later": _later(ctx)}


@registry.workflow("short_form")
def short_form(ctx: WorkflowContext) -> dict[str, Any]:
    try:
        return {"in_time": ctx.wait_for_signal("docs", timeout=TIMEOUT)}
    except SignalTimedOut:
        return {"timed_out": True, "later": _later(ctx)}


@registry.workflow("condition")
def condition(ctx: WorkflowContext) -> dict[str, Any]:
    got: list[Any] = []

    def handle(signal: Signal) -> None:
        got.append(signal.payload)

    if ctx.wait_until(lambda: bool(got), on={"docs": handle}, timeout=TIMEOUT, name="docs"):
        return {"in_time": got[0]}
    return {"timed_out": True, "later": _later(ctx)}


@registry.workflow("interrupt")
def interrupt(ctx: WorkflowContext) -> dict[str, Any]:
    decision = ctx.interrupt("sign", "Sign the documents?", ("approve", "reject"),
                             timeout=TIMEOUT)
    if decision.action == "timed_out":
        return {"timed_out": True}
    return {"in_time": decision.decision_id}


def _later(ctx: WorkflowContext) -> Any:
    late = ctx.receive("docs")  # no timeout: only a buffered signal returns at once
    assert late is not None
    return late.payload


def _prepare(run: Run) -> str:
    return "prepared"


def _finish(run: Run) -> dict[str, Any]:
    return {"signals": run.signals, "timed_out": sorted(run.timed_out),
            "decisions": {k: d.decision_id for k, d in run.decisions.items()}}


registry.register_definition(Workflow("optional_gate").step("prepare", _prepare)
                             .wait_for_signal_or_timeout("docs_or_not", "docs", timeout=TIMEOUT)
                             .step("finish", _finish).build())
registry.register_definition(Workflow("gate").step("prepare", _prepare)
                             .wait_for("docs", timeout=TIMEOUT)
                             .step("finish", _finish).build())
registry.register_definition(Workflow("gated_interrupt").step("prepare", _prepare)
                             .interrupt("sign", "Sign the documents?", actions=("approve",),
                                        timeout=TIMEOUT)
                             .step("finish", _finish).build())


def parked(client: Client, workflow: str, key: str) -> str:
    run = str(client.start(workflow, key).execution_id)
    wait_until(lambda: client.get(run).state in (State.WAITING, State.INPUT_REQUIRED),
               what=f"{workflow} parked")
    return run


def deliver(client: Client, workflow: str, run: str, what: str) -> str:
    """Send `what` the way the workflow waits for it: the decision's outcome, or the signal's."""
    if "interrupt" in workflow:
        try:
            client.decide(run, "sign", "approve", decision_id=what, actor="ann")
        except DecisionRefused as refused:
            return refused.reason_code
        return "accepted"
    client.signal(run, "docs", what)
    return "sent"


def result(output: Any) -> Any:
    """What the workflow returned: a definition's is what its `finish` step saw."""
    return output["steps"]["finish"] if "steps" in output else output


@dataclass(frozen=True)
class Expected:
    delivered: str
    state: State
    output: Any


SIGNALS = ("receive", "short_form", "condition")
IN_TIME: dict[str, Expected] = {
    **{w: Expected("sent", State.COMPLETED, {"in_time": "docs"}) for w in SIGNALS},
    "interrupt": Expected("accepted", State.COMPLETED, {"in_time": "docs"}),
    "optional_gate": Expected("sent", State.COMPLETED, {
        "signals": {"docs": "docs"}, "timed_out": [], "decisions": {}}),
    "gate": Expected("sent", State.COMPLETED, {
        "signals": {"docs": "docs"}, "timed_out": [], "decisions": {}}),
    "gated_interrupt": Expected("accepted", State.COMPLETED, {
        "signals": {}, "timed_out": [], "decisions": {"sign": "docs"}}),
}
LATE: dict[str, Expected] = {
    **{w: Expected("sent", State.COMPLETED, {"timed_out": True, "later": "docs"})
       for w in SIGNALS},
    "interrupt": Expected("timed_out", State.COMPLETED, {"timed_out": True}),
    "optional_gate": Expected("sent", State.COMPLETED, {
        "signals": {}, "timed_out": ["docs_or_not"], "decisions": {}}),
    "gate": Expected("sent", State.TIMED_OUT, None),
    "gated_interrupt": Expected("timed_out", State.TIMED_OUT, None),
}
OUTCOMES = {"signal": ("signal.consumed", "signal.timed_out"),
            "condition": ("condition.met", "condition.timed_out"),
            "interrupt": ("interrupt.decided", "interrupt.timed_out")}


@pytest.mark.parametrize("workflow", list(IN_TIME))
@pytest.mark.parametrize("arrives", ["in_time", "late"])
def test_the_outcome_does_not_depend_on_a_worker_being_up_at_the_deadline(
    client: Client, shard_map: ShardMap, start_worker: StartWorker, workflow: str, arrives: str
) -> None:
    worker = start_worker(registry)
    run = parked(client, workflow, f"{workflow}-{arrives}")
    worker.stop()
    if arrives == "in_time":
        delivered = deliver(client, workflow, run, "docs")
        time_passes(shard_map, LATER)
    else:
        time_passes(shard_map, LATER)
        delivered = deliver(client, workflow, run, "docs")
    expected = (IN_TIME if arrives == "in_time" else LATE)[workflow]
    assert delivered == expected.delivered
    start_worker(registry)
    done = client.wait(run, timeout=15)
    assert done.state is expected.state, done.error
    if expected.output is not None:
        assert result(done.output) == expected.output
    history = client.history(run)
    opened = next(e for e in history if e.kind.endswith((".waiting", ".requested")))
    wait_kind = opened.kind.split(".")[0]
    won, lost = OUTCOMES[wait_kind]
    at_wait = [e.kind for e in history if e.position == opened.position]
    assert (won in at_wait, lost in at_wait) == (arrives == "in_time", arrives == "late")
    if arrives == "late" and expected.delivered == "sent":
        # It arrived after the deadline the store wrote, and the wait did not take it
        # (a later receive did, or it stayed buffered behind a gate).
        ((signal_id, received),) = rows(shard_map.for_execution(run).url,
                                        "SELECT id, received_at FROM shardq.signals "
                                        "WHERE execution_id = %s", run)
        assert received > datetime.fromisoformat(opened.payload["wake_at"])
        assert not [e for e in history if e.position == opened.position
                    and e.payload.get("signal_id") == signal_id]


# -- races no worker's absence explains -------------------------------------------


def claim_of(store: Store, shard_map: ShardMap, run: str) -> Claim:
    """Lease `run` as a worker would, making it due first (as a wake-up would)."""
    shard = shard_map.for_execution(run)
    with psycopg.connect(shard.url, autocommit=True) as conn:
        conn.execute("INSERT INTO shardq.tasks (execution_id, run_at, claims) "
                     "VALUES (%s, now(), 1) ON CONFLICT (execution_id) DO UPDATE "
                     "SET run_at = now()", (run,))
    claims, _ = store.claim(shard, owner="racer", limit=10, lease_s=30)
    (claim,) = [c for c in claims if str(c.execution_id) == run]
    return claim


def play(store: Store, shard_map: ShardMap, claim: Claim) -> CommitOutcome:
    """The turn of `claim` and its ending commit, as a worker makes them."""
    shard = shard_map.for_execution(claim.execution_id)

    def checkpoint(commit: TurnCommit) -> CommitOutcome:
        return store.commit_turns(shard, [commit], lease_s=30)[commit.execution_id]

    final = run_turn(claim, registry, checkpoint)
    assert final is not None
    assert any(e.kind.endswith(".timed_out") for e in final.events), final.events
    return checkpoint(final)


def task_of(shard_map: ShardMap, run: str) -> tuple[uuid.UUID | None, datetime]:
    ((token, run_at),) = rows(shard_map.for_execution(run).url,
                              "SELECT lease_token, run_at FROM shardq.tasks "
                              "WHERE execution_id = %s", run)
    return token, run_at


@pytest.mark.parametrize("workflow", SIGNALS)
def test_a_signal_in_time_wins_over_a_timeout_from_a_claim_that_missed_it(
    client: Client, shard_map: ShardMap, pools: ShardPools, start_worker: StartWorker,
    workflow: str,
) -> None:
    """The timer fires first: a worker claims the run past its deadline and reads no
    signal, then a signal that arrived before the deadline commits (its sender
    held the run's lock across the deadline). The worker's timeout is not granted."""
    worker = start_worker(registry)
    run = parked(client, workflow, f"race-{workflow}")
    worker.stop()
    time_passes(shard_map, LATER)
    store = Store(pools)
    claim = claim_of(store, shard_map, run)
    assert not claim.signals
    client.signal(run, "docs", "docs")
    with psycopg.connect(shard_map.for_execution(run).url, autocommit=True) as conn:
        conn.execute("UPDATE shardq.signals SET received_at = received_at - "
                     "make_interval(secs => %s)", (LATER,))
    before = client.history(run)
    outcome = play(store, shard_map, claim)
    assert not outcome.landed
    assert client.history(run) == before
    token, run_at = task_of(shard_map, run)
    assert token == claim.lease_token  # a retried commit is told it did not land
    ((now,),) = rows(shard_map.for_execution(run).url, "SELECT now()")
    assert run_at <= now  # due again at once: its deadline passed
    start_worker(registry)
    assert client.wait(run, timeout=15).output == {"in_time": "docs"}


@pytest.mark.parametrize("workflow", ["interrupt", "gated_interrupt"])
def test_a_decision_in_time_wins_over_a_timeout_from_a_claim_that_missed_it(
    client: Client, shard_map: ShardMap, pools: ShardPools, start_worker: StartWorker,
    workflow: str,
) -> None:
    worker = start_worker(registry)
    run = parked(client, workflow, f"race-{workflow}")
    worker.stop()
    store = Store(pools)
    claim = claim_of(store, shard_map, run)  # an update woke it, say
    assert deliver(client, workflow, run, "docs") == "accepted"
    time_passes(shard_map, LATER)
    # The turn, begun before the decision, runs past the deadline.
    late_turn = dataclasses.replace(claim, db_now=claim.db_now + timedelta(seconds=LATER))
    before = client.history(run)
    assert not play(store, shard_map, late_turn).landed
    assert client.history(run) == before
    start_worker(registry)
    done = client.wait(run, timeout=15)
    assert done.state is State.COMPLETED
    assert result(done.output) == IN_TIME[workflow].output


def test_a_worker_whose_clock_runs_ahead_cannot_time_a_wait_out_early(
    client: Client, shard_map: ShardMap, pools: ShardPools, start_worker: StartWorker,
) -> None:
    worker = start_worker(registry)
    run = parked(client, "receive", "clock-ahead")
    worker.stop()
    store = Store(pools)
    claim = claim_of(store, shard_map, run)
    ahead = dataclasses.replace(claim, db_now=claim.db_now + timedelta(seconds=LATER))
    assert not play(store, shard_map, ahead).landed
    ((deadline,),) = rows(shard_map.for_execution(run).url,
                          "SELECT deadline FROM shardq.waits WHERE execution_id = %s", run)
    # Due again at the deadline the store wrote, not before.
    assert task_of(shard_map, run)[1] == deadline
    assert [e.kind for e in client.history(run) if e.position == 0] == ["signal.waiting"]
    # Once the store's clock passed it, a late signal does not count.
    time_passes(shard_map, LATER)
    client.signal(run, "docs", "docs")
    start_worker(registry)
    assert client.wait(run, timeout=15).output == {"timed_out": True, "later": "docs"}


def test_a_timeout_is_not_granted_to_a_commit_begun_before_the_deadline(
    client: Client, shard_map: ShardMap, start_worker: StartWorker,
) -> None:
    """A commit's events are recorded at its transaction's beginning (now()): granted to
    a transaction begun before the deadline and checked after it, a timeout would be
    recorded as happening early. Such a commit is deferred to the deadline instead."""
    worker = start_worker(registry)
    run = parked(client, "condition", "begun-early")
    worker.stop()
    time_passes(shard_map, TIMEOUT - 0.3)  # the deadline 0.3 s ahead of the store's clock
    ((position,),) = rows(shard_map.for_execution(run).url,
                          "SELECT position FROM shardq.history WHERE execution_id = %s "
                          "AND kind = 'condition.waiting'", run)
    with psycopg.connect(shard_map.for_execution(run).url) as conn:  # one transaction
        conn.execute("SELECT now()")  # the transaction begins before the deadline
        conn.execute("SELECT pg_sleep(0.6)")  # and is past it, by the clock
        ((held,),) = conn.execute(
            "SELECT shardq.defer_premature_timeouts(ARRAY[%(r)s::uuid], ARRAY[%(r)s::uuid], "
            "ARRAY[%(p)s], ARRAY['condition.timed_out'], NULL)",
            {"r": run, "p": position}).fetchall()
        conn.rollback()
    assert [str(r) for r in held] == [run]
