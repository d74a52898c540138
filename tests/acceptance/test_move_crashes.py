"""`shards move` killed with SIGKILL at every phase, then resumed or aborted.

The mover runs as a real process (`python -m shardq.bin.cli.moves shards move`)
against two PostgreSQL servers, with SHARDQ_MOVE_CRASH_AT naming where it kills
itself (moves/mover.py, CRASH_POINTS). Runs are parked (timers, signal waits,
interrupts), running (leased tasks) and receiving signals: a thread signals
moving runs the way a write path does (row lock, then shardq.fence, then the
write; refused: retry, or go to the other shard) throughout. After the kill:
every bucket owned by exactly one shard and writable on at most one, every run's
rows on its owner as they were. After `--resume` or `--abort`: the same, with no
copy left on the other shard, and every acknowledged signal there exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shardq.shards.embedded import EmbeddedPostgres

from ..integration.test_move_basics import (
    MOVED,
    Deployment,
    add_runs,
    check_ownership,
    check_rows_once,
    dump,
    new_deployment,
    owner_of,
    populate,
    reset,
)
from ..support import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base() -> Iterator[Deployment]:
    servers = [EmbeddedPostgres().start(), EmbeddedPostgres().start()]
    try:
        yield new_deployment(servers)
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def deployment(base: Deployment) -> Deployment:
    reset(base)
    return base


def mover(dep: Deployment, *args: str, crash_at: str | None = None
          ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **dep.env()}
    env.pop("SHARDQ_MOVE_CRASH_AT", None)
    if crash_at:
        env["SHARDQ_MOVE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "shardq.bin.cli.moves", "shards", "move", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


class Signaller:
    """Keyed signals to `runs`, each acknowledged once some shard stored it."""

    def __init__(self, dep: Deployment, runs: list[uuid.UUID]) -> None:
        self.dep, self.runs = dep, runs
        self.acked: dict[str, uuid.UUID] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Signaller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _loop(self) -> None:
        conns = [psycopg.connect(u) for u in self.dep.urls]
        try:
            n = 0
            while not self.stop.is_set():
                run, key = self.runs[n % len(self.runs)], f"live-{n}"
                if self._send(conns, run, key):
                    self.acked[key] = run
                n += 1
        finally:
            for conn in conns:
                conn.close()

    def _send(self, conns: list[psycopg.Connection[tuple[object, ...]]], run: uuid.UUID,
              key: str) -> bool:
        while not self.stop.is_set():
            for conn in conns:
                try:
                    with conn.transaction():
                        conn.execute("SELECT 1 FROM shardq.tasks WHERE execution_id = %s"
                                     " FOR UPDATE", (run,))
                        conn.execute("SELECT shardq.fence(ARRAY[%s::uuid])", (run,))
                        conn.execute(
                            "INSERT INTO shardq.signals (execution_id, tenant, name, payload,"
                            " idempotency_key) VALUES (%s, 'default', 'live', '1', %s)"
                            " ON CONFLICT (execution_id, idempotency_key)"
                            " WHERE idempotency_key IS NOT NULL DO NOTHING", (run, key))
                    return True
                except psycopg.Error as exc:
                    if exc.sqlstate not in ("SQ001", "SQ002"):
                        raise
            time.sleep(0.02)  # frozen (or between owners): retry soon
        return False


def check_signals(dep: Deployment, acked: dict[str, uuid.UUID]) -> None:
    owns = check_ownership(dep)
    found: list[dict[str, uuid.UUID]] = []
    for url in dep.urls:
        with psycopg.connect(url) as conn:
            found.append({k: r for r, k in conn.execute(
                "SELECT execution_id, idempotency_key FROM shardq.signals WHERE name = 'live'")})
    for key, run in acked.items():
        owner = owner_of(owns, run)
        assert found[owner].get(key) == run, f"signal {key} missing on shard-{owner}"
        assert key not in found[1 - owner], f"signal {key} also on shard-{1 - owner}"


# Every point once (batch 0), a switch of a middle batch; abort where a batch is frozen,
# mid-switch, switched but not released, and released.
RESUMED = ["plan", "freeze", "fenced", "copy", "switch", "switched", "release", "released",
           "clean", "cleaned", "copy@1"]
ABORTED = ["freeze", "copy", "switched", "release@1"]


@pytest.mark.parametrize(("crash_at", "then"),
                         [(c, "--resume") for c in RESUMED] + [(c, "--abort") for c in ABORTED])
def test_a_mover_killed_at_each_phase_resumes_or_rolls_back_cleanly(
    deployment: Deployment, crash_at: str, then: str,
) -> None:
    inside, outside = populate(deployment, moved=24, kept=4)
    receivers = add_runs(deployment.urls[0], [MOVED[0] + 3, MOVED[0] + 200, MOVED[1]],
                         prefix="rx", target_of_sends=outside[0])
    before = {**dump(deployment.urls[0], inside), **dump(deployment.urls[0], outside)}
    args = [f"{MOVED[0]}-{MOVED[1]}", "--to", "shard-1", "--batch-runs", "10", "--grace", "0"]
    with Signaller(deployment, receivers) as signaller:
        killed = mover(deployment, *args, crash_at=crash_at)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        check_rows_once(deployment, before, stale_ok=True)
        time.sleep(0.1)  # signals keep coming while the move is stopped
        finished = mover(deployment, then)
        assert finished.returncode == 0, finished.stderr
    check_rows_once(deployment, before)
    check_signals(deployment, signaller.acked)
    assert signaller.acked, "no signal got through"
    owns = check_ownership(deployment)
    moved = {owner_of(owns, r) for r in inside}
    if then == "--resume":
        assert moved == {1}
    else:
        assert moved <= {0, 1}  # switched batches stay switched; the rest went back
    for own in owns:
        assert own["writable"] == own["owned"] and not own["unclean"], own
        assert own["fence_move"] is None
    with psycopg.connect(deployment.urls[0]) as conn:
        phase = conn.execute("SELECT phase FROM shardq.moves").fetchone()
    assert phase == ("done" if then == "--resume" else "aborted",)


def status(dep: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardq.bin.cli", "shards", "status", *args],
        env={**os.environ, **dep.env()}, cwd=ROOT, capture_output=True, text=True,
        timeout=60, check=False)


def status_doc(dep: Deployment) -> dict[str, Any]:
    shown = status(dep, "--json")
    assert shown.returncode == 0, shown.stderr
    doc: dict[str, Any] = json.loads(shown.stdout)
    return doc


def batch_buckets(dep: Deployment, batch: int) -> list[int]:
    with psycopg.connect(dep.urls[0]) as conn:
        row = conn.execute("SELECT first_bucket, last_bucket FROM shardq.move_batches"
                           " WHERE batch = %s", (batch,)).fetchone()
    assert row is not None
    return list(row)


@pytest.mark.parametrize("crash_at", ["freeze@0", "fenced@1"])
def test_status_names_the_buckets_a_killed_mover_left_frozen_and_what_to_run(
    deployment: Deployment, crash_at: str,
) -> None:
    """An operator's first question after a mover died: what is stuck, and how to go on.
    Killed right after the freeze ("freeze"), the journal said "planned" and status said
    nothing was frozen while clients were refused for 10 s: the journal is now written
    before the freeze, and the frozen buckets are read from the source itself."""
    populate(deployment, moved=24, kept=4)
    args = [f"{MOVED[0]}-{MOVED[1]}", "--to", "shard-1", "--batch-runs", "10", "--grace", "0"]
    killed = mover(deployment, *args, crash_at=crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    batch = int(crash_at.partition("@")[2])
    frozen = batch_buckets(deployment, batch)

    (move,) = status_doc(deployment)["moves"]
    assert (move["buckets"], move["source"], move["target"], move["phase"]) == (
        list(MOVED), "shard-0", "shard-1", "moving")
    assert move["frozen_batch"] == batch and move["batches_switched"] == batch
    assert move["frozen_buckets"] == [frozen] and not move["mover_running"]
    assert move["commands"] == ["shardq shards move --resume", "shardq shards move --abort"]
    text = status(deployment).stdout
    assert (f"frozen: buckets {frozen[0]}-{frozen[1]} on shard-0 (move 1, batch {batch}, "
            "to shard-1): writes to their runs are refused") in text
    assert "no mover is running: `shardq shards move --resume` finishes it" in text
    assert mover(deployment, "--resume").returncode == 0
    after = status_doc(deployment)
    assert after["moves"] == [] and after["frozen"] == [] and after["cleanups"] == []
