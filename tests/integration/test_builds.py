"""Build pinning (schema/0026; docs/versioning.md, "Builds"): a run records its
workflow's current build and, pinned, is claimed only by workers of that build; the
due runs of a build nobody runs cost other claims nothing; migrate-build moves parked
and due runs, and the task rows a racing wake wrote; continue-as-new and children take
their workflow's current build; bad input is refused with one line and stores nothing.
(A rolling deploy with two worker processes: tests/acceptance/test_builds_deploy.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import InvalidArgument
from shardq.core.models import State
from shardq.shards.config import Shard
from shardq.store.store import Store
from shardq.tests.builds import counter, order_v1, v2
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import all_rows, keys_on, rows, run_cli, wait_until

registry = Registry()
registry.workflow("order")(order_v1)
registry.workflow("counter")(counter)


@registry.workflow("plain")
def plain(ctx: WorkflowContext) -> str:
    return ctx.step("run", lambda: "done")


@registry.workflow("leaf")
def leaf(ctx: WorkflowContext) -> str:
    return ctx.step("run", lambda: "leaf")


@registry.workflow("parent")
def parent(ctx: WorkflowContext) -> Any:
    return ctx.wait_child(ctx.start_child("leaf", f"{ctx.workflow_id}.leaf"))


StartWorker = Callable[..., Worker]


def _on_shard_0(client: Client, workflow: str, prefix: str, n: int) -> list[uuid.UUID]:
    keys = keys_on(client.map, 0, workflow, prefix, n)
    return [client.start(workflow, k).execution_id for k in keys]


def _claimed(store: Store, shard: Shard, build: str | None) -> set[uuid.UUID]:
    claims, _ = store.claim(shard, owner="test", limit=100, lease_s=30, build=build)
    return {c.execution_id for c in claims}


def _task_builds(client: Client, runs: list[uuid.UUID]) -> list[str | None]:
    """The builds on the runs' task rows, in the order of `runs` (those with one)."""
    found = dict(all_rows(client.map, "SELECT execution_id, build_id FROM shardq.tasks "
                                      "WHERE execution_id = ANY(%s)", runs))
    return [found[r] for r in runs if r in found]


def test_a_pinned_run_is_claimed_by_its_builds_workers_only(client: Client, store: Store) -> None:
    shard = client.map.shards[0]
    client.set_workflow_build("plain", "b1")
    pinned = _on_shard_0(client, "plain", "pinned", 3)
    client.set_workflow_build("plain", None)
    free = _on_shard_0(client, "plain", "free", 2)
    assert [(client.get(r).build_id, client.get(r).pinned) for r in pinned + free] == [
        ("b1", True)] * 3 + [(None, False)] * 2

    assert _claimed(store, shard, None) == set(free)  # a worker without a build
    assert _claimed(store, shard, "b2") == set()  # another build's
    assert _claimed(store, shard, "b1") == set(pinned)


def test_policy_any_records_the_build_and_any_worker_runs_the_run(
    client: Client, store: Store,
) -> None:
    client.set_workflow_build("plain", "b1", policy="any")
    (run,) = _on_shard_0(client, "plain", "any", 1)
    seen = client.get(run)
    assert (seen.build_id, seen.pinned) == ("b1", False)
    assert _claimed(store, client.map.shards[0], None) == {run}
    shown = client.set_workflow_build("order", "b9")  # that workflow's view only
    assert (shown.workflow, shown.build_id, shown.policy) == ("order", "b9", "pinned")
    (plain,) = client.workflow_builds("plain")
    assert (plain.workflow, plain.build_id, plain.policy, dict(plain.runs)) == (
        "plain", "b1", "any", {})
    assert [b.workflow for b in client.workflow_builds()] == ["order", "plain"]


def test_the_due_runs_of_a_build_nobody_runs_cost_other_claims_nothing(
    client: Client, store: Store,
) -> None:
    """Thousands of due runs pinned to a build whose workers are gone: a claim of
    another build (or of none) reads its own rows, never steps over those."""
    shard = client.map.shards[0]
    client.set_workflow_build("plain", "gone")
    client.start_many("plain", [(k, None) for k in keys_on(client.map, 0, "plain", "g", 3000)])
    client.set_workflow_build("plain", "live")
    live = _on_shard_0(client, "plain", "live", 5)
    client.set_workflow_build("plain", None)
    free = _on_shard_0(client, "plain", "free", 5)
    with psycopg.connect(shard.url, autocommit=True) as conn:
        conn.execute("ANALYZE shardq.tasks")
    for build, expected in ((None, free), ("live", live)):  # free: leased by the first
        with psycopg.connect(shard.url) as conn:  # one transaction: its own counters
            claimed = conn.execute(
                "SELECT execution_id FROM shardq.claim_tasks('t', 100, 30, 0::smallint, "
                "NULL, %s) WHERE execution_id IS NOT NULL", [build]).fetchall()
            (fetched,) = conn.execute(
                "SELECT pg_stat_get_xact_tuples_fetched('shardq.tasks'::regclass)"
                " + pg_stat_get_xact_tuples_returned('shardq.tasks'::regclass)").fetchone() or (0,)
        assert {r for (r,) in claimed} == set(expected)
        # Each claimed row a few times over (passes, lease, history); 3,000 if it read
        # the gone build's rows.
        assert fetched < 300, (build, fetched)


def test_migrate_build_moves_parked_and_due_runs_to_the_new_build(
    client: Client, start_worker: StartWorker,
) -> None:
    client.set_workflow_build("order", "b1")
    old = start_worker(registry, build_id="b1")
    runs = [client.start("order", f"o-{i}").execution_id for i in range(4)]
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in runs), timeout=30)
    old.stop()
    for run in runs[:2]:
        client.signal(run, "paid")  # due now, on b1: nobody runs b1 any more
    assert _task_builds(client, runs) == ["b1", "b1"]

    done = client.migrate_build("order", "b1", "b2")
    assert (done.moved, done.settled) == (4, True)
    assert {(client.get(r).build_id, client.get(r).pinned) for r in runs} == {("b2", True)}
    assert _task_builds(client, runs) == ["b2", "b2"]
    assert client.migrate_build("order", "b1", "b2").moved == 0  # nothing twice

    start_worker(v2, build_id="b2")
    for run in runs[2:]:
        client.signal(run, "paid")
    ended = [client.wait(r, timeout=30) for r in runs]
    assert [e.output for e in ended] == [["v1", "v2"]] * 4, [e.error for e in ended]


def test_migrate_build_unpins_and_moves_a_task_row_a_racing_wake_wrote(
    client: Client, store: Store,
) -> None:
    shard = client.map.shards[0]
    client.set_workflow_build("plain", "b1")
    first, second = _on_shard_0(client, "plain", "race", 2)
    # What a wake that read the run before the move's first step commits writes after
    # it: the run moved, its new task row still on the old build.
    rows(shard.url, "UPDATE shardq.executions SET build_id = 'b2' WHERE id = %s "
                    "RETURNING 1", second)
    done = client.migrate_build("plain", "b1", None)
    assert (done.moved, done.settled) == (1, True)
    assert _task_builds(client, [first, second]) == [None, "b2"]
    assert (client.get(first).build_id, client.get(first).pinned) == ("b1", False)
    assert _claimed(store, shard, None) == {first}


def test_migrate_build_says_when_an_older_transaction_outlived_its_wait(
    client: Client,
) -> None:
    client.set_workflow_build("plain", "b1")
    _on_shard_0(client, "plain", "old", 1)
    with psycopg.connect(client.map.shards[0].url) as held:
        held.execute("SELECT 1")  # a transaction open from before the move
        done = client.migrate_build("plain", "b1", "b2", wait_s=0.3)
    assert (done.moved, done.settled) == (1, False)


def test_continue_as_new_and_a_child_take_their_workflows_current_build(
    client: Client, start_worker: StartWorker, relay: Callable[..., Any],
) -> None:
    relay()  # the child may live on the other shard
    client.set_workflow_build("counter", "b1")
    client.set_workflow_build("leaf", "b9")
    start_worker(registry, build_id="b1")
    loop = client.start("counter", "loop", {"left": 1}).execution_id
    wait_until(lambda: client.get(loop).state is State.WAITING, timeout=30)
    client.set_workflow_build("counter", "b2")
    client.signal(loop, "next")
    wait_until(lambda: client.get(loop).build_id == "b2", timeout=30,
               what="the next generation on b2")
    assert _task_builds(client, [loop]) == ["b2"]  # due, and b1's worker leaves it be
    family = client.start("parent", "fam").execution_id  # unpinned: any worker
    child = wait_until(lambda: all_rows(client.map, "SELECT id, build_id FROM "
                                        "shardq.executions WHERE workflow_id = 'fam.leaf'"),
                       timeout=30, what="the child")
    assert [b for _, b in child] == ["b9"]

    start_worker(registry, build_id="b2")
    start_worker(registry, build_id="b9")
    wait_until(lambda: client.get(loop).state is State.WAITING, timeout=30)
    client.signal(loop, "next")
    assert client.wait(loop, timeout=30).output == "done"
    assert client.wait(family, timeout=30).output == "leaf"


BAD_BUILDS = ["", " ", "-b", ".b", "b 1", "b\x00", "b/1", "x" * 129, "é"]


@pytest.mark.parametrize("build", BAD_BUILDS)
def test_a_bad_build_id_is_refused_and_stores_nothing(client: Client, build: str) -> None:
    with pytest.raises(InvalidArgument, match="build id"):
        client.set_workflow_build("plain", build)
    with pytest.raises(InvalidArgument, match="build id"):
        client.migrate_build("plain", build, "b2")
    assert all_rows(client.map, "SELECT * FROM shardq.workflow_builds") == []


@pytest.mark.parametrize("wait_s", [float("nan"), float("inf"), -1, "30", True, 3601])
def test_a_bad_migration_wait_is_refused_and_moves_nothing(
    client: Client, wait_s: Any,
) -> None:
    client.set_workflow_build("plain", "b1")
    (run,) = _on_shard_0(client, "plain", "w", 1)
    with pytest.raises(InvalidArgument, match="wait_s"):
        client.migrate_build("plain", "b1", "b2", wait_s=wait_s)
    assert client.get(run).build_id == "b1"


@pytest.mark.parametrize(("args", "says"), [
    (("set-build", "plain", ".x"), "build id"),
    (("set-build", "plain", "b 1"), "build id"),
    (("set-build", "plain", "b\udcff"), "build id"),
    (("set-build", "plain", "b1", "--policy", "sometimes"), "sometimes"),
    (("set-build", "", "b1"), "workflow name"),
    (("set-build", "pl ain", "b1"), "workflow name"),
    (("set-build", "plain"), "BUILD"),
    (("clear-build",), "WORKFLOW"),
    (("migrate-build", "plain", "--from", "b1"), "exactly one of --to BUILD and --unpin"),
    (("migrate-build", "plain", "--from", "b1", "--to", "b2", "--unpin"), "exactly one"),
    (("migrate-build", "plain", "--to", "b2"), "--from"),
    (("migrate-build", "plain", "--from", "b1", "--to", "b1"), "on build b1 already"),
    (("migrate-build", "plain", "--from", "b1", "--to", "x" * 129), "build id"),
])
def test_the_build_commands_refuse_bad_input_in_one_line(
    client: Client, args: tuple[str, ...], says: str,
) -> None:
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in client.map.shards)}
    done = run_cli("workflow", *args, env=env)
    assert done.returncode in (2, 7), done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert all_rows(client.map, "SELECT * FROM shardq.workflow_builds") == []


@pytest.mark.parametrize("build", [".x", "b 1", "x" * 129])
def test_a_worker_or_a_replay_with_a_bad_build_id_exits_2(client: Client, build: str) -> None:
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in client.map.shards)}
    app = "shardq.tests.integration.test_builds:registry"
    for args in (("worker", "--app", app, "--build-id", build),
                 ("replay", "--app", app, "--build", build)):
        done = run_cli(*args, env=env)
        assert done.returncode == 2 and "build id" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
