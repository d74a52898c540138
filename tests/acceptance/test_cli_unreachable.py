"""One-shot commands against a shard that cannot be reached fail at once, exit 3, with one
line naming the shard and the cause: no pool timeout, no psycopg_pool retry warnings."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shardq.shards.config import ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.pools import ShardPools

from ..conftest import Server
from ..support import run_cli

RUN = "01a23b00-a581-8495-a55e-808a42654d6c"
COMMANDS = [
    ("workflow", "start", "checkout", "k1", "--app", "shardq.bin.examples:registry"),
    ("workflow", "show", RUN),
    ("workflow", "signal", RUN, "payment_captured"),
    ("workflow", "list"),
    ("workflow", "cancel", RUN),
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
