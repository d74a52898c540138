"""A deployment behind PgBouncer in transaction mode (Debian's `pgbouncer`, 1.18 here),
as an operator runs one: `SHARDQ_POOLER` names it, the worker, the relay, `serve` and
the client send their statements through it, and their LISTEN connections go to the
server itself (shards/pools.py, pooled_settings; docs/configuration.md, "Behind
PgBouncer"). Each daemon's safety poll is 30 s, so a run woken in a second was woken
by a NOTIFY its direct LISTEN heard."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict

from shardq.benchmarks.pgbouncer import Pooler, pgbouncer_binary, running_pgbouncer
from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store

from ..app import registry
from ..support import Daemon, free_port, wait_for_health, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(pgbouncer_binary() is None and os.environ.get("CI") != "true",
                       reason="Debian's pgbouncer is not installed (.ci/run installs it: "
                              "apt-get install pgbouncer)"),
]
APP = "shardq.tests.app:registry"


@pytest.fixture
def bouncer(shard_map: ShardMap) -> Iterator[Pooler]:
    """PgBouncer in transaction mode in front of the tests' server, on a free port."""
    with running_pgbouncer(shard_map.shards[0].url) as pooler:
        yield pooler


def _env(shard_map: ShardMap, bouncer: Pooler) -> dict[str, str]:
    return {"SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards),
            "SHARDQ_POOLER": bouncer.address}


def test_a_deployment_runs_through_pgbouncer_and_wakes_by_its_direct_listen(
    shard_map: ShardMap, bouncer: Pooler, daemons: Callable[..., Daemon],
) -> None:
    env = _env(shard_map, bouncer)
    worker = daemons(["worker", "--app", APP, "--poll-interval", "30", "--lease", "5"], env)
    relay = daemons(["outbox-relay", "--poll-interval", "30"], env)
    pooled = replace(shard_map, pooler=bouncer.address)
    with ShardPools(pooled) as pools:
        client = Client(Store(pools), registry)
        # Enough of one statement for psycopg to prepare it, were it allowed to.
        runs = [client.start("noop", f"n-{i}").execution_id for i in range(60)]
        for run in runs:
            assert client.wait(run, timeout=30).state is State.COMPLETED
        parked = [client.start("park", f"p-{i}").execution_id for i in range(8)]
        wait_until(lambda: all(client.get(r).state is State.WAITING for r in parked),
                   what="parked", timeout=20)
        signalled = time.monotonic()
        client.signal(parked[0], "go", 1)
        assert client.wait(parked[0], timeout=20).output == 1
        assert time.monotonic() - signalled < 10  # the 30 s poll did not wake it
        sender = client.start("tenant_cancel", "sender",
                              {"runs": [str(r) for r in parked[1:]]}).execution_id
        sent = client.wait(sender, timeout=20).output
        assert sent["queued"] and sent["signalled"], sent  # both shards' paths
        wait_until(lambda: all(
            [s.name for s in client.waiting(r)[1]] == ["tenant_cancelled"]
            for r in parked[1:]), what="every signal delivered, the relay's included",
            timeout=15)
        family = client.start("family", "fam", {"tag": "t"}).execution_id
        assert client.wait(family, timeout=30).state is State.COMPLETED
        seen = bouncer.clients()
    # Every process's pools are PgBouncer's clients, on every shard's database.
    names = {str(conninfo_to_dict(s.url)["dbname"]) for s in shard_map.shards}
    assert {(db, app) for db in names for app in ("shardq", "shardq-worker",
                                                   "shardq-relay")} <= seen, seen
    for daemon in (worker, relay):
        assert "prepared statement" not in daemon.stderr(), daemon.stderr()[-2000:]
        assert daemon.proc.poll() is None, daemon.stderr()[-2000:]


def test_the_http_api_serves_through_pgbouncer(
    shard_map: ShardMap, bouncer: Pooler, daemons: Callable[..., Daemon], tmp_path: Path,
) -> None:
    from shardq.bin.web.tokens import hash_token

    env = _env(shard_map, bouncer)
    daemons(["worker", "--app", APP, "--poll-interval", "30"], env)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"acme {hash_token('sq_pgb')}\n")
    port = free_port()
    server = daemons(["serve", "--app", APP, "--port", str(port), "--tokens-file",
                      str(tokens)], env)
    server.wait_for("shardq API on")
    base = f"http://127.0.0.1:{port}"
    wait_for_health(base, 200)
    with httpx.Client(base_url=base + "/api/shardq", timeout=30,
                      headers={"Authorization": "Bearer sq_pgb"}) as http:
        made = [http.post("/workflows/tagged/start", json={
            "workflow_id": f"t-{i}", "input": {"region": "eu", "amount": i}})
            for i in range(12)]
        assert [m.status_code for m in made] == [201] * 12, made[0].text
        runs = [m.json()["execution_id"] for m in made]
        wait_until(lambda: all(http.get(f"/workflows/{r}").json()["state"] == "waiting"
                               for r in runs), what="parked", timeout=20)
        assert http.get("/workflows/counts").json()["by_state"]["waiting"] == 12
        sent = http.post("/bulk/signal", json={"name": "go", "payload": 1,
                                               "where": ["amount>=6"]})
        assert sent.status_code == 200 and len(sent.json()["done"]) == 6, sent.text
        wait_until(lambda: all(http.get(f"/workflows/{r}").json()["state"] == "completed"
                               for r in runs[6:]), what="signalled runs ended", timeout=20)
    assert "shardq-api" in {app for _, app in bouncer.clients()}
    assert "prepared statement" not in server.stderr()
