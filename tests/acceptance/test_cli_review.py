"""`shardq workflow pending`, `decide` and `cancel --actor` as a reviewer runs them."""

from __future__ import annotations

import json
from collections.abc import Callable

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker

from ..app import registry
from ..support import run_cli, wait_until

APP = "shardq.tests.app:registry"


def test_a_reviewer_lists_decides_and_repeats_a_decision_from_the_command_line(
    shard_map: ShardMap, pools: ShardPools, start_worker: Callable[..., Worker]
) -> None:
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards), "SHARDQ_APP": APP}
    start_worker(registry)
    client = Client(Store(pools), registry)
    run = str(client.start("proposal_review", "p-1", {"amount": 120}).execution_id)
    wait_until(lambda: client.get(run).state is State.INPUT_REQUIRED, what="input_required")

    listed = run_cli("--json", "workflow", "pending", env=env)
    assert listed.returncode == 0, listed.stderr
    (item,) = json.loads(listed.stdout)["items"]
    assert (item["execution_id"], item["name"], item["actions"]) == (
        run, "manager_review", ["approve", "edit", "reject"])
    assert "120 for travel" in item["prompt"]

    decide = ("workflow", "decide", run, "manager_review", "--action", "edit",
              "--decision-id", "d-1", "--actor", "ann")
    bad = run_cli("--json", *decide, "--payload-json", '{"amount": -5}', env=env)
    assert bad.returncode == 7
    error = json.loads(bad.stderr)
    assert sorted(v["field_path"] for v in error["violations"]) == ["/amount", "/reason"]
    assert client.get(run).state is State.INPUT_REQUIRED

    good = run_cli(*decide, "--payload-json", '{"amount": 80, "reason": "cheaper"}', env=env)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == "edit by ann accepted"
    again = run_cli(*decide, "--payload-json", '{"amount": 80, "reason": "cheaper"}', env=env)
    assert again.stdout.strip() == "edit by ann (already recorded: nothing changed)"
    other = run_cli("--json", "workflow", "decide", run, "manager_review", "--action",
                    "approve", "--decision-id", "d-2", "--actor", "bob", env=env)
    assert other.returncode == 7
    assert json.loads(other.stderr)["reason_code"] == "decided"
    assert json.loads(other.stderr)["standing"]["actor"] == "ann"
    assert client.wait(run, timeout=10).output == {
        "outcome": "committed", "by": "ann",
        "result": {"committed": True, "amount": 80, "reason": "cheaper"}}

    # A decision for a run that finished: refused, and its history ends with its outcome.
    late = run_cli("workflow", "decide", run, "manager_review", "--action", "approve",
                   "--decision-id", "d-3", "--actor", "carl", env=env)
    assert late.returncode == 7
    assert late.stderr.startswith("shardq: error: decided: ")
    shown = run_cli("workflow", "show", run, env=env)
    assert "interrupt.decided" in shown.stdout
    assert "run.completed" in shown.stdout.strip().splitlines()[-1]

    second = str(client.start("proposal_review", "p-2").execution_id)
    wait_until(lambda: client.get(second).state is State.INPUT_REQUIRED, what="input_required")
    cancelled = run_cli("workflow", "cancel", second, "--actor", "ops", env=env)
    assert cancelled.stdout.strip() == "cancelled", cancelled.stderr
    decided = [e.payload for e in client.history(second) if e.kind == "interrupt.decided"]
    assert [(d["action"], d["actor"]) for d in decided] == [("cancel", "ops")]
