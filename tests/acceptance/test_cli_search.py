"""Search attributes and bulk actions from the command line, as an operator uses them:
`workflow list --where`, `workflow count --where`, `workflow show`, and
`workflow cancel-matching` / `signal-matching` with a dry run first."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.worker.worker import Worker

from ..app import registry
from ..support import run_cli, wait_until


def _cli(shard_map: ShardMap, *args: str) -> Any:
    result = run_cli(*args, "--json", env={"SHARDQ_SHARDS": ",".join(
        s.url for s in shard_map.shards)})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_operator_finds_counts_and_acts_on_runs_by_their_attributes(
    shard_map: ShardMap, start_worker: Callable[..., Worker],
) -> None:
    start_worker(registry)
    with Client.connect(shard_map, registry) as client:
        runs = {client.start("tagged", f"t-{i}", {"region": ("eu", "us")[i % 2],
                                                  "amount": i * 100.0}).execution_id: i
                for i in range(6)}
        wait_until(lambda: all(client.get(r).state is State.WAITING for r in runs),
                   what="every run parked", timeout=20)
    eu = sorted(str(r) for r, i in runs.items() if i % 2 == 0)
    listed = _cli(shard_map, "workflow", "list", "--where", "region=eu")
    assert [r["id"] for r in listed["items"]] == eu
    assert listed["items"][0]["attributes"] == {"region": "eu", "amount": 0.0}
    big = _cli(shard_map, "workflow", "list", "--where", "region=eu", "--where", "amount>=200")
    assert [r["id"] for r in big["items"]] == eu[1:]
    counted = _cli(shard_map, "workflow", "count", "--where", "amount<300")
    assert counted["by_workflow"]["tagged"]["waiting"] == 3
    shown = _cli(shard_map, "workflow", "show", eu[0], "--no-history")
    assert shown["attributes"] == {"region": "eu", "amount": 0.0}
    dry = _cli(shard_map, "workflow", "cancel-matching", "--where", "region=eu", "--dry-run")
    assert (dry["matched"], dry["done"]) == (eu, [])
    done = _cli(shard_map, "workflow", "cancel-matching", "--where", "region=eu")
    assert sorted(done["done"]) == eu
    us = sorted(str(r) for r, i in runs.items() if i % 2 == 1)
    sent = _cli(shard_map, "workflow", "signal-matching", "go", "--workflow", "tagged",
                "--payload", '{"ok": true}', "--idempotency-key", "cli-1")
    assert (sent["matched"], sorted(sent["done"])) == (us, us)
    with Client.connect(shard_map, registry) as client:
        assert {str(r): client.wait(r, timeout=15).state for r in runs} == {
            **dict.fromkeys(eu, State.CANCELLED), **dict.fromkeys(us, State.COMPLETED)}
