"""`shards move` killed with SIGKILL at every phase, then resumed or aborted.

The mover runs as a real process (`python -m shardq.bin.cli shards move`)
against two PostgreSQL servers, with SHARDQ_FAILPOINT naming where it kills
itself (shards/failpoints.py, the `move.` points). Runs are parked (timers, signal waits,
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

from shardq.shards.failpoints import FAILPOINT_ENV

from ..integration.test_move_basics import (
    MOVED,
    Deployment,
    add_runs,
    check_ownership,
    check_rows_once,
    dump,
    owner_of,
    populate,
    reset,
    two_servers,
)
from ..support import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base() -> Iterator[Deployment]:
    with two_servers() as deployment:
        yield deployment


@pytest.fixture
def deployment(base: Deployment) -> Deployment:
    reset(base)
    return base


def mover(dep: Deployment, *args: str, crash_at: str | None = None
          ) -> subprocess.CompletedProcess[str]:
    """`shards move` with `args`; killed at the move's failpoint `crash_at`
    (`<point>[@<batch>]`, e.g. `copy@1` for `move.copy@1`) when given."""
    env = {**os.environ, **dep.env()}
    env.pop(FAILPOINT_ENV, None)
    if crash_at:
        env[FAILPOINT_ENV] = f"move.{crash_at}"
    # Batches keep their planned size (no --max-pause lowering on a slow machine): the
    # tests name batches by number.
    return subprocess.run(
        [sys.executable, "-m", "shardq.bin.cli", "shards", "move", *args,
         "--max-pause", "0"],
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


def killed_move(dep: Deployment, *, grace: float, batch: int) -> list[str]:
    """Six batches of ten runs, moved with `grace` and killed mid-copy of `batch`."""
    populate(dep, moved=60, kept=2)
    args = [f"{MOVED[0]}-{MOVED[1]}", "--to", "shard-1", "--batch-runs", "10", "--rest", "0",
            "--grace", str(grace)]
    killed = mover(dep, *args, crash_at=f"copy@{batch}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with psycopg.connect(dep.urls[0]) as conn:
        assert conn.execute("SELECT count(*) FROM shardq.move_batches").fetchone() == (6,)
    return args


@pytest.mark.parametrize("then", ["--resume", "--abort"])
def test_a_resume_or_abort_waits_one_grace_period_not_one_per_batch(
    deployment: Deployment, then: str,
) -> None:
    """Each batch's cleanup waited for its grace period counted from one reading of the
    clock before the loop, one batch after another: a killed 11-batch move took 9 min 13 s
    to resume at the default 60 s. The deadlines are now absolute, and the waits overlap."""
    grace = 4.0
    killed_move(deployment, grace=grace, batch=3)
    began = time.monotonic()
    finished = mover(deployment, then, "--rest", "0")
    took = time.monotonic() - began
    assert finished.returncode == 0, finished.stderr
    # Three batches (or all six) waited their grace in turn before: 12 to 24 s.
    assert grace - 1 <= took < 2 * grace + 1, (took, finished.stderr)
    assert "before deleting shard-0's copy" in finished.stderr
    owns = check_ownership(deployment)
    assert all(o["writable"] == o["owned"] and not o["unclean"] for o in owns)


def test_an_abort_of_a_move_that_had_switched_every_batch_says_done(
    deployment: Deployment,
) -> None:
    """Killed during its cleanup, every batch switched: an abort has nothing to roll back,
    and printed "aborted" for a move that had fully taken effect."""
    populate(deployment, moved=24, kept=4)
    args = [f"{MOVED[0]}-{MOVED[1]}", "--to", "shard-1", "--batch-runs", "10", "--grace", "0"]
    assert mover(deployment, *args, crash_at="clean").returncode == -signal.SIGKILL
    aborted = mover(deployment, "--abort")
    # The move's batches had all switched: it is done, nothing is left to abort.
    assert aborted.returncode == 2, aborted.stderr
    assert "no unfinished move to abort: move 1 is done" in aborted.stderr
    resumed = mover(deployment, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("move 1 done: ") and "None" not in resumed.stdout

    reset(deployment)
    populate(deployment, moved=24, kept=4)
    assert mover(deployment, *args, crash_at="release@2").returncode == -signal.SIGKILL
    aborted = mover(deployment, "--abort")
    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.startswith("move 1 done: ") and "aborted" not in aborted.stdout
    with psycopg.connect(deployment.urls[0]) as conn:
        assert conn.execute("SELECT phase FROM shardq.moves").fetchone() == ("done",)


def test_an_abort_that_rolled_everything_back_prints_no_none(deployment: Deployment) -> None:
    populate(deployment, moved=24, kept=4)
    args = [f"{MOVED[0]}-{MOVED[1]}", "--to", "shard-1", "--batch-runs", "10", "--grace", "0"]
    assert mover(deployment, *args, crash_at="freeze").returncode == -signal.SIGKILL
    aborted = mover(deployment, "--abort")
    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.startswith("move 1 aborted: ")
    assert "None" not in aborted.stdout and "no batch paused" in aborted.stdout
    assert "3 rolled back" in aborted.stdout


def test_no_wait_returns_at_the_switch_and_the_copy_waits_for_resume_or_the_next_move(
    deployment: Deployment,
) -> None:
    """A move blocked the terminal for the whole grace period, unannounced. With
    --no-wait it returns at its last switch; status counts the moved runs once (the
    source's copy is not its runs any more), names the copy and what deletes it; the
    next move is not refused for it, and --resume deletes it once its grace is over."""
    inside, outside = populate(deployment, moved=24, kept=4)
    grace = 8.0
    began = time.monotonic()
    moved = mover(deployment, f"{MOVED[0]}-{MOVED[1]}", "--to", "shard-1", "--batch-runs", "10",
                  "--rest", "0", "--grace", str(grace), "--no-wait")
    assert moved.returncode == 0, moved.stderr
    assert time.monotonic() - began < grace
    assert moved.stdout.startswith("move 1 done: ")
    assert ("shard-0 keeps its copy of 3 switched batch(es) until its grace period ends"
            in moved.stdout) and "`shardq shards move --resume` deletes it" in moved.stdout

    doc = status_doc(deployment)
    assert doc["moves"] == [] and doc["frozen"] == []
    assert [s["runs"] for s in doc["shards"]] == [len(outside), 5 + len(inside)]
    (cleanup,) = doc["cleanups"]
    assert (cleanup["move"], cleanup["source"], cleanup["batches"]) == (1, "shard-0", 3)
    text = status(deployment).stdout
    assert "no move in progress" in text
    assert ("cleanup: shard-0 keeps its copy of 3 switched batch(es) of move 1 (buckets "
            f"{MOVED[0]}-{MOVED[1]}; not counted in its runs) until the grace period ends, "
            "due at ") in text
    assert "`shardq shards move --resume` deletes it" in text

    # The next move is not refused for the copy: it waits out its grace and deletes it
    # with its own (two runs of `outside` are in 0-100: one batch).
    other = mover(deployment, "0-100", "--to", "shard-1", "--grace", "0", "--rest", "0")
    assert other.returncode == 0, other.stderr
    assert "copies of 4 switched batch(es) deleted (26 runs)" in other.stdout
    assert status_doc(deployment)["cleanups"] == []
    owns = check_ownership(deployment)
    assert all(o["writable"] == o["owned"] and not o["unclean"] for o in owns)
    with psycopg.connect(deployment.urls[0]) as conn:
        assert conn.execute("SELECT count(*) FROM shardq.executions WHERE id = ANY(%s)",
                            (inside,)).fetchone() == (0,)
