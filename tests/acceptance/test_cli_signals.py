"""`shardq workflow signal`, `signal-with-start` and `show` as a user runs them."""

from __future__ import annotations

import json
from collections.abc import Callable

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.worker import Worker

from ..support import all_rows, run_cli, wait_until

APP = "shardq.tests.app:registry"


def _env(shard_map: ShardMap) -> dict[str, str]:
    return {"SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards), "SHARDQ_APP": APP}


def test_signal_with_start_show_and_signal_from_the_command_line(
    shard_map: ShardMap, pools: ShardPools, start_worker: Callable[..., Worker]
) -> None:
    from ..app import registry

    env = _env(shard_map)
    started = run_cli("--json", "workflow", "signal-with-start", "park", "wh-1", "early",
                      "--payload-json", '{"n": 1}', "--idempotency-key", "evt-1", env=env)
    assert started.returncode == 0, started.stderr
    answer = json.loads(started.stdout)
    assert (answer["created"], answer["delivered"], answer["signal_name"]) == (True, True, "early")
    run = answer["execution_id"]
    again = run_cli("workflow", "signal-with-start", "park", "wh-1", "early",
                    "--payload", '{"n": 1}', "--idempotency-key", "evt-1", env=env)
    assert again.returncode == 0, again.stderr
    duplicate = "existing run, duplicate (already delivered with this key)"
    assert again.stdout.strip() == f"{run} {duplicate}"

    worker = start_worker(registry)
    client = Client(Store(pools), registry)
    wait_until(lambda: client.get(run).state is State.WAITING, what="parked on go")
    worker.stop()
    shown = run_cli("--json", "workflow", "show", run, env=env)
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert (detail["state"], detail["open_wait"]["kind"], detail["open_wait"]["name"]) == (
        "waiting", "signal", "go"
    )
    assert [(s["name"], s["payload"], s["idempotency_key"]) for s in detail["pending_signals"]] \
        == [("early", {"n": 1}, "evt-1")]
    text = run_cli("workflow", "show", run, "--no-history", env=env).stdout
    assert "waits on signal 'go' for" in text and "buffered signal 'early' (id" in text

    # An empty key would silently be no key: a usage error, nothing sent.
    for command in (["workflow", "signal", run, "go"],
                    ["workflow", "signal-with-start", "park", "wh-1", "go"]):
        refused = run_cli(*command, "--idempotency-key", "", env=env)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and "is empty" in refused.stderr
    assert all_rows(shard_map, "SELECT name FROM shardq.signals") == [("early",)]


def test_interface_query_and_updates_from_the_command_line(
    shard_map: ShardMap, pools: ShardPools, start_worker: Callable[..., Worker]
) -> None:
    from ..app import registry

    env = _env(shard_map)
    shown = run_cli("workflow", "interface", "cart", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    with Client(Store(pools), registry) as client:
        assert json.loads(shown.stdout) == client.interface("cart")
    tea = '{"sku": "tea", "quantity": 2}'
    late = run_cli("--json", "workflow", "update-with-start", "cart", "c-cli", "add_item",
                   "--input", '{"customer": "ann"}', "--arg", tea, "--idempotency-key",
                   "tea-1", "--wait", "0.2", env=env)
    assert late.returncode == 7 and json.loads(late.stderr)["completed"] is False, late.stderr
    start_worker(registry)
    done = run_cli("--json", "workflow", "update-with-start", "cart", "c-cli", "add_item",
                   "--input", '{"customer": "ann"}', "--arg", tea, "--idempotency-key",
                   "tea-1", env=env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["response"], answer["accepted"]) == (1, False)
    run = answer["execution_id"]
    more = run_cli("workflow", "update", run, "add_item", "--arg",
                   '{"sku": "cups", "quantity": 6}', env=env)
    assert (more.returncode, more.stdout.strip()) == (0, "2"), more.stderr
    contents = run_cli("--json", "workflow", "query", run, "contents", env=env)
    assert contents.returncode == 0, contents.stderr
    assert [i["sku"] for i in json.loads(contents.stdout)["result"]["items"]] == ["tea", "cups"]
