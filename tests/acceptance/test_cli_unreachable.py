"""One-shot commands against a shard that cannot be reached fail at once, exit 3, with one
line naming the shard and the cause: no pool timeout, no psycopg_pool retry warnings.
Those that read every shard for an operator (`outbox`) show what the others hold, exit 8
(test_cli_one_shard_down.py has the others)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.pools import ShardPools
from shardq.shards.routing import bucket_for
from shardq.worker.worker import Worker

from ..conftest import Server
from ..support import run_cli

RUN = "01a23b00-a581-8495-a55e-808a42654d6c"
COMMANDS = [
    ("workflow", "start", "checkout", "k1", "--app", "shardq.tests.app:registry"),
    ("workflow", "show", RUN),
    ("workflow", "signal", RUN, "payment_captured"),
    ("workflow", "list"),
    ("workflow", "cancel", RUN),
    # Those that serve the reachable shards when one is down (exit 8) have nothing to
    # serve when none is reachable: they fail as the others do.
    ("workflow", "pending"),
    ("stale",),
    ("purge", "--app", "shardq.tests.app:registry", "--dry-run"),
    ("outbox",),
]
POOL_TIMEOUT_S = 10.0  # ShardPools' default: what these commands used to wait


def _timed(args: tuple[str, ...], url: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    began = time.monotonic()
    result = run_cli(*args, env={"SHARDQ_SHARDS": url})
    return time.monotonic() - began, result


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("postgresql://postgres@127.0.0.1:1/x", "unreachable (connection refused)"),
        (None, "database does not exist"),
    ],
    ids=["refused", "no-database"],
)
def test_every_command_names_the_cause_at_once(
    pg_server: Server, url: str | None, cause: str
) -> None:
    url = url or pg_server.url(f"{pg_server.prefix}_never_created")
    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda args: _timed(args, url), COMMANDS))
    for args, (elapsed, result) in zip(COMMANDS, outcomes, strict=True):
        what = f"{' '.join(args[:2])}: {result.stderr}"
        assert result.returncode == 3, what
        assert result.stderr.splitlines() == [f"shardq: error: shard-0 ({url}): {cause}"], what
        assert elapsed < POOL_TIMEOUT_S / 2, what


def test_probing_pools_raise_the_cause_without_waiting_and_serve_the_rest(
    shard_map: ShardMap,
) -> None:
    dead = "postgresql://postgres@127.0.0.1:1/x"
    mixed = ShardMap.from_urls([shard_map.shards[0].url, dead])
    with ShardPools(mixed, timeout=POOL_TIMEOUT_S, probe=True) as pools:
        began = time.monotonic()
        refused = r"shard-1 .*: unreachable \(connection refused"
        with pytest.raises(ShardUnavailable, match=refused), pools.connection(mixed.shards[1]):
            pass
        assert time.monotonic() - began < 1.0
        with pools.connection(mixed.shards[0]) as conn:
            assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def _on_shard(client: Client, shard: Shard, workflow: str, input_: Any, key: str) -> str:
    """A new run of `workflow` whose execution id routes it to `shard`."""
    for i in range(200):
        bucket = bucket_for("default", workflow, f"{key}-{i}")
        if client.map.for_bucket(bucket) == shard:
            return str(client.start(workflow, f"{key}-{i}", input_).execution_id)
    raise AssertionError(f"no key of 200 routes to {shard.name}")


def test_outbox_shows_what_the_reachable_shards_owe_the_one_that_is_down(
    shard_map: ShardMap, start_worker: Callable[..., Worker]
) -> None:
    from ..app import registry

    source, target = shard_map.shards
    with Client.connect(shard_map, registry) as client:
        onboarding = _on_shard(client, target, "onboarding", {"days": 1}, "user")
        sender = _on_shard(client, source, "tenant_cancel", {"runs": [onboarding]}, "cancel")
        start_worker(registry)
        # No relay runs: the signal stays owed in the source shard's outbox.
        assert client.wait(sender, timeout=20).output["queued"] == [onboarding]
    down = f"{source.url},postgresql://postgres@127.0.0.1:1/x"
    for as_json in (False, True):
        began = time.monotonic()
        result = run_cli("outbox", *(["--json"] if as_json else []),
                         env={"SHARDQ_SHARDS": down})
        assert time.monotonic() - began < POOL_TIMEOUT_S / 2
        assert result.returncode == 8, result.stderr
        (line,) = result.stderr.splitlines()
        if as_json:
            error = json.loads(line)
            assert (error["code"], error["unavailable_shards"]) == (8, ["shard-1"])
            shown = json.loads(result.stdout)
            assert shown["unavailable_shards"] == ["shard-1"]
            assert [(r["source"], r["target"], r["pending"]) for r in shown["outbox"]] == [
                ("shard-0", "shard-1", 1)]
        else:
            assert line.startswith("shardq: error: partial: could not read shard-1 (shard-1 (")
            assert "unreachable (connection refused)" in line
            assert result.stdout.splitlines()[1].split()[:3] == ["shard-0", "shard-1", "1"]
    failed = run_cli("outbox", "failed", env={"SHARDQ_SHARDS": down})
    assert (failed.returncode, failed.stdout) == (8, "no failed rows\n"), failed.stderr
    assert "could not read shard-1" in failed.stderr
    whole = run_cli("outbox", env={"SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards)})
    assert (whole.returncode, whole.stderr) == (0, "")
