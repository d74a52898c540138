"""A shard removed from the map is let go quietly by every daemon.

As an operator grows and shrinks a deployment: an empty shard added while a worker, a
relay, the store exporter and `shardq serve` run (each follows the map and starts
serving it), then removed under a steady load; once the worker and the relay say (at
info) that they let it go, its database refuses every connection (its server stopped).
What a user needs, and the test asserts: no daemon logs a warning or an error about the
removed shard, during the removal or after it (no claim loop meeting the newer map
first, no LISTEN connection reconnecting for ever, no relay round failing, no pool
retrying its connections), and the load goes on.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate

from ..app import registry
from ..support import (
    Daemon,
    allow_connections,
    free_port,
    key_on,
    run_cli,
    scrape,
    start_api,
    value,
    wait_until,
)

pytestmark = pytest.mark.slow

APP = "shardq.tests.app:registry"
QUIET_FOR_S = 15.0
"""How long the daemons are watched after the removal: past the worker's and relay's map
check (1 s), their backoffs' first steps, the LISTEN check (15 s) and a few scrapes."""


def test_a_removed_shard_is_let_go_quietly_by_every_daemon(
    fresh_databases: Callable[..., list[str]], daemons: Callable[..., Daemon], tmp_path: Path,
) -> None:
    urls = fresh_databases(3, "rm")
    seeds = ShardMap.from_urls(urls[:2])
    migrate(seeds)
    env = {"SHARDQ_SHARDS": ",".join(urls[:2]), "SHARDQ_MAP_POLL_S": "1"}
    added = run_cli("shards", "add", "shard-2", urls[2], env=env)
    assert added.returncode == 0, added.stderr

    # Folds every 0.2 s: one meets the removal (it warned of the shard it lost once).
    worker = daemons(["-v", "worker", "--app", APP, "--poll-interval", "1",
                      "--count-fold-interval", "0.2"], env)
    relay = daemons(["-v", "outbox-relay", "--poll-interval", "1"], env)
    port = free_port()
    # The exporter's own map poll is slow: each scrape must read the newest map itself,
    # or the first scrape after the removal reads the removed shard and logs it down.
    exporter = daemons(["metrics", "--port", str(port), "--cache-seconds", "0"],
                       {**env, "SHARDQ_MAP_POLL_S": "60"})
    _, api = start_api(lambda args, _env=None: daemons(args, env), seeds, tmp_path,
                       {"rm-token": "default"})
    worker.wait_for("serving", timeout=30)
    relay.wait_for("outbox relay serving", timeout=30)
    exporter.wait_for("store exporter on", timeout=30)
    wait_until(lambda: value(scrape(port), "shardq_shard_up", shard="shard-2") == 1.0,
               timeout=30, what="the exporter reading the added shard")

    stop = threading.Event()
    done: list[str] = []
    with Client.connect(seeds, registry) as client:

        def load() -> None:
            n = 0
            while not stop.is_set():
                key = key_on(client.map, n % 2, "noop", f"rm-{n}")
                done.append(str(client.start("noop", key).execution_id))
                n += 1
                stop.wait(0.1)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(2)
        marks = {d.name: d.err_path.stat().st_size for d in (worker, relay, exporter, api)}
        removed = run_cli("shards", "remove", "shard-2", env=env)
        assert removed.returncode == 0, removed.stderr
        worker.wait_for("no longer serving a shard the map dropped", timeout=15)
        relay.wait_for("no longer relaying from a shard the map dropped", timeout=15)
        allow_connections([urls[2]], False)  # its server stopped
        try:
            for _ in range(int(QUIET_FOR_S)):
                samples = scrape(port)
                time.sleep(1)
            stop.set()
            loader.join(10)
            assert value(samples, "shardq_shard_up", shard="shard-2") is None
            wait_until(lambda: all(client.get(run).state.value == "completed"
                                   for run in done[-20:]),
                       timeout=20, what="the load's last runs, completed after the removal")
        finally:
            allow_connections([urls[2]], True)

    noisy = {}
    for daemon in (worker, relay, exporter, api):
        assert daemon.proc.poll() is None, f"{daemon.name} exited:\n{daemon.stderr()[-2000:]}"
        with daemon.err_path.open("rb") as err:
            err.seek(marks[daemon.name])
            lines = err.read().decode(errors="replace").splitlines()
        loud = [line for line in lines if "shard-2" in line
                and (re.search(r"level=(warning|error|critical)", line) or "Traceback" in line)]
        if loud:
            noisy[daemon.name] = loud[:5]
    assert not noisy, noisy
