"""Real `shardq worker` processes, killed, paused, stopped and raced.

Every test runs workers the way they are deployed, as separate processes
(`python -m shardq.bin.cli worker ...`), really signals them (SIGKILL, SIGSTOP,
SIGCONT, SIGTERM), drives runs through the Python API and checks what a user
observes: run states and outputs, the rows in each shard's `shardq.events`,
`shardq.tasks` and `shardq.executions`, exit codes, the side-effect trace the
`slow_steps` workflow (tests/app.py) writes, and the workers' logs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import Shard, ShardMap
from shardq.shards.routing import bucket_for

from ..app import registry
from ..support import ROOT, run_cli

Fresh = Callable[[int], list[str]]
History = list[tuple[int | None, str, str]]


# -- worker processes ----------------------------------------------------------


class WorkerProcess:
    """One `shardq worker` process; stdout and stderr go to files so no pipe can fill."""

    def __init__(self, name: str, urls: list[str], args: tuple[str, ...], folder: Path) -> None:
        self.name = name
        self.out_path = folder / f"worker-{name}.out"
        self.err_path = folder / f"worker-{name}.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
        env.update({"SHARDQ_SHARDS": ",".join(urls), "PYTHONUNBUFFERED": "1",
                    "SHARDQ_APP": "shardq.tests.app:registry"})
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shardq.bin.cli", "worker", *args],
                env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Wait for the `worker <owner> serving ...` line; returns the lease owner it names."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(r"^worker (\S+) serving ", self.stderr(), re.MULTILINE)
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                pytest.fail(f"worker {self.name} exited with {self.proc.returncode} before "
                            f"serving:\n{self.stderr()}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker {self.name} not serving after {timeout} s:\n{self.stderr()}")
            time.sleep(0.02)

    def send(self, signum: signal.Signals) -> None:
        assert self.proc.poll() is None, f"worker {self.name} already exited:\n{self.stderr()}"
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker {self.name} still running {timeout} s later:\n{self.stderr()}")

    def kill(self) -> None:
        """Teardown: make sure the process is gone, whatever state the test left it in."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Spawn(Protocol):
    def __call__(self, name: str, urls: list[str], *args: str) -> WorkerProcess: ...


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start worker processes; every one still running is killed after the test."""
    started: list[WorkerProcess] = []

    def start(name: str, urls: list[str], *args: str) -> WorkerProcess:
        worker = WorkerProcess(name, urls, args, tmp_path)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


# -- observing -----------------------------------------------------------------


def urls_of(shard_map: ShardMap) -> list[str]:
    return [s.url for s in shard_map.shards]


def query(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def scalar(url: str, statement: str, *params: Any) -> Any:
    (row,) = query(url, statement, *params)
    return row[0]


def history(shard_map: ShardMap, execution_id: uuid.UUID) -> History:
    """(position, kind, name) of every history row of the run, in commit order."""
    url = shard_map.for_execution(execution_id).url
    found = query(url, "SELECT position, kind, name FROM shardq.events "
                       "WHERE execution_id = %s ORDER BY seq", execution_id)
    return [(r[0], r[1], r[2]) for r in found]


def task(shard_map: ShardMap, execution_id: uuid.UUID) -> tuple[uuid.UUID | None, bool] | None:
    """The run's task row as (lease_token, due now), or None when it has none."""
    url = shard_map.for_execution(execution_id).url
    found = query(url, "SELECT lease_token, run_at <= now() AND (leased_until IS NULL OR "
                       "leased_until <= now()) FROM shardq.tasks WHERE execution_id = %s",
                  execution_id)
    return (found[0][0], found[0][1]) if found else None


def held_leases(url: str) -> int:
    return int(scalar(
        url, "SELECT count(*) FROM shardq.tasks WHERE leased_until > now()"
    ))


def leased(shard_map: ShardMap, execution_id: uuid.UUID) -> bool:
    row = task(shard_map, execution_id)
    return row is not None and row[0] is not None


def traced(trace: Path, workflow_id: str) -> list[int]:
    """The steps whose side effect finished, in order (`slow_steps` appends `<id> <i>`)."""
    if not trace.exists():
        return []
    *complete, _partial = trace.read_text().split("\n")  # ignore a line still being written
    steps = []
    for line in complete:
        wid, _, step = line.rpartition(" ")
        if wid == workflow_id:
            steps.append(int(step))
    return steps


def steps_completed(n: int) -> History:
    return [(i, "step.completed", f"step-{i}") for i in range(n)]


def completed_after(steps: int) -> History:
    """The history of a run that completed after `steps` steps."""
    return [*steps_completed(steps), (None, "run.completed", "run")]


def wait_for(check: Callable[[], bool], timeout: float, what: str,
             logs: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}"
                        + (f"\n{logs()}" if logs else ""))
        time.sleep(0.01)


def in_state(client: Client, execution_id: uuid.UUID, state: State) -> Callable[[], bool]:
    return lambda: client.get(execution_id).state is state


def pause_between_transactions(worker: WorkerProcess, urls: list[str]) -> None:
    """SIGSTOP `worker` at a moment it holds no transaction open.

    Frozen inside a transaction (a heartbeat, a claim) it would keep row locks the
    other worker's claim skips, which is not the scenario under test. Besides the
    worker, only the test's own (idle) pools are connected to these databases.
    """
    busy = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state <> 'idle'")
    for _ in range(20):
        worker.send(signal.SIGSTOP)
        time.sleep(0.05)  # a statement already sent finishes on the server
        if all(scalar(url, busy) == 0 for url in urls):
            return
        worker.send(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"worker {worker.name} was never idle between transactions")


def routed_to(shard_map: ShardMap, shard: Shard, workflow: str, prefix: str) -> str:
    """A workflow_id whose run the map places on `shard`."""
    for n in range(10_000):
        workflow_id = f"{prefix}-{n}"
        if shard_map.for_bucket(bucket_for("default", workflow, workflow_id)) == shard:
            return workflow_id
    raise AssertionError(f"no workflow_id routes to {shard.name}")


# -- crash, pause, race ----------------------------------------------------------


@pytest.mark.slow
def test_kill_9_mid_step_resumes_elsewhere_without_rerunning_finished_steps(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    wid = "kill-9"
    run = client.start("slow_steps", wid, {"steps": 5, "seconds": 0.4, "trace": str(trace)})
    a = spawn("a", urls_of(shard_map), "--lease", "2")

    def step_2_running() -> bool:
        # Step 1's result is checkpointed right before step 2 starts.
        return (traced(trace, wid) == [0, 1]
                and history(shard_map, run.execution_id) == steps_completed(2))

    wait_for(step_2_running, 30, "steps 0 and 1 done, step 2 running", a.stderr)
    a.send(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    assert history(shard_map, run.execution_id) == steps_completed(2)
    assert client.get(run.execution_id).state is State.RUNNING

    b = spawn("b", urls_of(shard_map), "--lease", "2")
    finished = client.wait(run.execution_id, timeout=30)
    assert finished.state is State.COMPLETED, b.stderr()
    assert finished.output == [0, 1, 2, 3, 4]
    assert finished.finished_at is not None
    done = traced(trace, wid)
    assert done.count(0) == 1 and done.count(1) == 1, done  # finished steps never re-ran
    assert sorted(set(done)) == [0, 1, 2, 3, 4]
    assert history(shard_map, run.execution_id) == completed_after(5)


@pytest.mark.slow
def test_two_workers_racing_over_1000_runs_complete_each_exactly_once(
    shard_map: ShardMap, client: Client, spawn: Spawn
) -> None:
    # A 1 s safety poll bounds a known stall (a shard's claim loop that found every slot
    # taken is only woken by its own shard's turns, else sleeps the whole poll) to keep
    # the test's runtime steady; the stall itself is not what this test is about.
    args = ("--concurrency", "8", "--batch-size", "20", "--poll-interval", "1")
    workers = [spawn(name, urls_of(shard_map), *args) for name in ("a", "b")]
    owners = {w.wait_ready(): w.name for w in workers}
    ids = [f"job-{i}" for i in range(1000)]
    started = client.start_many("noop", [(wid, None) for wid in ids])
    assert all(s.created for s in started)

    # Sample who holds leases while the work runs: the evidence both workers took part.
    seen: set[str] = set()
    conns = [psycopg.connect(url, autocommit=True) for url in urls_of(shard_map)]
    try:
        deadline = time.monotonic() + 60
        while True:
            for conn in conns:
                seen |= {r[0] for r in conn.execute(
                    "SELECT DISTINCT lease_owner FROM shardq.tasks WHERE lease_owner IS NOT NULL"
                )}
            unfinished = sum(
                int(conn.execute("SELECT count(*) FROM shardq.executions x "
                                 "WHERE NOT shardq.run_state(x.id) IN "
                                 "('completed', 'failed', 'cancelled', 'timed_out')"
                                 ).fetchall()[0][0])
                for conn in conns
            )
            if unfinished == 0:
                break
            assert time.monotonic() < deadline, (
                f"{unfinished} runs unfinished after 60 s\n"
                + "\n".join(w.stderr() for w in workers)
            )
            time.sleep(0.005)
    finally:
        for conn in conns:
            conn.close()

    executions: list[tuple[Any, ...]] = []
    for url in urls_of(shard_map):
        duplicates = query(url, """
            SELECT execution_id, position, count(*) FROM shardq.events
            WHERE kind = 'step.completed'
            GROUP BY execution_id, position HAVING count(*) > 1""")
        assert duplicates == []
        executions += query(url, """
            SELECT x.workflow_id, shardq.run_state(x.id),
                   (SELECT count(*) FROM shardq.events o
                    WHERE o.execution_id = x.id AND o.kind LIKE 'run.%%'),
                   (SELECT array_agg(h.position ORDER BY h.seq) FROM shardq.events h
                    WHERE h.execution_id = x.id AND h.kind = 'step.completed')
            FROM shardq.executions x""")
        assert scalar(url, "SELECT count(*) FROM shardq.tasks") == 0
        assert scalar(url, "SELECT count(*) FROM shardq.waits") == 0
    assert sorted(e[0] for e in executions) == sorted(ids)  # each run exists once
    assert {(e[1], e[2]) for e in executions} == {("completed", 1)}  # one outcome each
    assert {tuple(e[3]) for e in executions} == {(0,)}  # noop's one step, recorded once
    assert {owners.get(o, o) for o in seen} == {"a", "b"}, "both workers claimed runs"

    for w in workers:
        w.send(signal.SIGTERM)
    assert [w.wait_exit(30) for w in workers] == [0, 0]


@pytest.mark.slow
def test_paused_worker_cannot_commit_after_another_worker_took_the_run_over(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    wid = "paused"
    run = client.start("slow_steps", wid, {"steps": 3, "seconds": 1.5, "trace": str(trace)})
    a = spawn("a", urls_of(shard_map), "--lease", "2")
    wait_for(lambda: leased(shard_map, run.execution_id) and traced(trace, wid) == [],
             30, "worker A to start step 0", a.stderr)
    pause_between_transactions(a, urls_of(shard_map))
    assert traced(trace, wid) == []  # paused inside step 0

    def lease_expired() -> bool:
        row = task(shard_map, run.execution_id)
        return row is not None and row[1]

    wait_for(lease_expired, 10, "A's lease to expire")
    assert history(shard_map, run.execution_id) == []

    b = spawn("b", urls_of(shard_map), "--lease", "2")
    finished = client.wait(run.execution_id, timeout=30)
    assert finished.state is State.COMPLETED, b.stderr()
    assert finished.output == [0, 1, 2]
    assert traced(trace, wid) == [0, 1, 2]
    assert history(shard_map, run.execution_id) == completed_after(3)

    a.send(signal.SIGCONT)
    # A wakes up inside step 0, finishes its side effect, then tries to checkpoint it.
    wait_for(lambda: traced(trace, wid).count(0) == 2, 15, "A to finish its late step 0",
             a.stderr)
    # A's checkpoint of it is refused: wait for A to say so, not for a guessed while.
    wait_for(lambda: "lease lost" in a.stderr(), 15, "A's refused checkpoint", a.stderr)
    assert history(shard_map, run.execution_id) == completed_after(3)
    assert client.get(run.execution_id) == finished  # state, output, finished_at untouched
    assert task(shard_map, run.execution_id) is None

    a.send(signal.SIGTERM)
    b.send(signal.SIGTERM)
    assert a.wait_exit(30) == 0, a.stderr()
    assert b.wait_exit(30) == 0, b.stderr()


@pytest.mark.slow
def test_a_lease_that_expires_while_its_holder_is_paused_keeps_the_key_s_only_slot(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    """Concurrency limit 1: worker A is paused inside run 1's step; its lease expires and
    worker B takes run 1 over, in the same slot: run 2 of the key waits all along, and no
    moment has two runs of the key under a live lease. A's late checkpoint is refused."""
    trace = tmp_path / "trace"
    slow = {"steps": 2, "seconds": 1.0, "trace": str(trace)}
    first, second = (r.execution_id for r in client.start_many(
        "slow_steps", [("key-1", slow), ("key-2", slow)], concurrency=("paused-key", 1)))
    url = shard_map.for_execution(first).url
    live: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            live.append(scalar(url, "SELECT count(*) FROM shardq.tasks WHERE concurrency_key"
                                    " = 'paused-key' AND leased_until > now()"))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        a = spawn("a", urls_of(shard_map), "--lease", "2")
        wait_for(lambda: leased(shard_map, first) and traced(trace, "key-1") == [],
                 30, "worker A to start run 1's step 0", a.stderr)
        pause_between_transactions(a, urls_of(shard_map))
        wait_for(lambda: (task(shard_map, first) or (None, False))[1], 10,
                 "A's lease to expire")
        assert client.get(second).waiting_for_slot  # the expired lease kept the slot

        b = spawn("b", urls_of(shard_map), "--lease", "2")
        assert client.wait(first, timeout=30).output == [0, 1], b.stderr()
        assert client.wait(second, timeout=30).output == [0, 1], b.stderr()
        a.send(signal.SIGCONT)
        wait_for(lambda: "lease lost" in a.stderr(), 15, "A's refused checkpoint", a.stderr)
    finally:
        stop.set()
        sampler.join()
    assert max(live) == 1 and len(live) > 100
    # Run 2 started only after run 1 ended: its steps follow all of run 1's.
    lines = [ln for ln in trace.read_text().split("\n") if ln]
    assert lines.index("key-2 0") > lines.index("key-1 1")
    assert scalar(url, "SELECT held FROM shardq.concurrency_keys WHERE key = 'paused-key'") == 0
    for w in (a, b):
        w.send(signal.SIGTERM)
        assert w.wait_exit(30) == 0, w.stderr()


# -- signals -------------------------------------------------------------------------


@pytest.mark.slow
def test_signal_wakes_a_parked_run_within_a_second_despite_a_60_s_poll(
    shard_map: ShardMap, client: Client, spawn: Spawn
) -> None:
    worker = spawn("w", urls_of(shard_map), "--poll-interval", "60")
    worker.wait_ready()
    for i in range(3):
        run = client.start("park", f"park-{i}")
        wait_for(in_state(client, run.execution_id, State.WAITING), 15, f"run {i} to park",
                 worker.stderr)
        time.sleep(1.0)  # the worker is now idle in its 60 s wait
        sent = time.monotonic()
        client.signal(run.execution_id, "go", {"x": 1})
        wait_for(in_state(client, run.execution_id, State.COMPLETED), 10,
                 f"run {i} to complete", worker.stderr)
        latency = time.monotonic() - sent
        assert latency < 1.0, f"run {i} woke {latency:.2f} s after its signal"
        assert client.get(run.execution_id).output == {"x": 1}


@pytest.mark.slow
def test_kill_9_after_a_consumed_signal_replays_the_same_signal_into_the_step(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    run = client.start("slow_after_signal", "sig-kill", {"seconds": 1.0, "trace": str(trace)})
    a = spawn("a", urls_of(shard_map), "--lease", "2")
    wait_for(in_state(client, run.execution_id, State.WAITING), 15, "the run to park", a.stderr)
    client.signal(run.execution_id, "go", {"n": 1})

    def lines() -> list[str]:
        return trace.read_text().splitlines() if trace.exists() else []

    wait_for(lambda: lines() == ['sig-kill start {"n": 1}'], 15, "the step to start", a.stderr)
    a.send(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    # The consumption rides on the step's commit, which never happened.
    assert "signal.consumed" not in [k for _, k, _ in history(shard_map, run.execution_id)]
    # Leased by the dead worker until its lease expires, then waiting again.
    assert client.get(run.execution_id).state in (State.RUNNING, State.WAITING)
    # A later signal of the same name must not change what the replayed step receives.
    client.signal(run.execution_id, "go", {"n": 2})

    b = spawn("b", urls_of(shard_map), "--lease", "2")
    done = client.wait(run.execution_id, timeout=30)
    assert done.state is State.COMPLETED, b.stderr()
    assert done.output == {"n": 1}
    assert lines() == ['sig-kill start {"n": 1}', 'sig-kill start {"n": 1}',
                       'sig-kill done {"n": 1}']
    url = shard_map.for_execution(run.execution_id).url
    # Consumption and step result landed in one transaction.
    assert scalar(url, "SELECT count(DISTINCT xmin::text) FROM shardq.history "
                       "WHERE execution_id = %s AND kind IN ('signal.consumed', 'step.completed')",
                  run.execution_id) == 1
    assert query(url, "SELECT payload FROM shardq.signals WHERE execution_id = %s "
                      "AND consumed_at IS NULL", run.execution_id) == [({"n": 2},)]


# -- shutdown ------------------------------------------------------------------------


def second_step_running(shard_map: ShardMap, execution_id: uuid.UUID, trace: Path,
                        workflow_id: str) -> Callable[[], bool]:
    """Step 0 is checkpointed, and a step's predecessors are durable before it starts."""
    return lambda: (traced(trace, workflow_id) == [0]
                    and history(shard_map, execution_id) == steps_completed(1))


@pytest.mark.slow
def test_sigterm_lets_the_running_step_finish_and_exits_0(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    wid = "drain"
    run = client.start("slow_steps", wid, {"steps": 2, "seconds": 1.0, "trace": str(trace)})
    worker = spawn("w", urls_of(shard_map))
    wait_for(second_step_running(shard_map, run.execution_id, trace, wid), 30,
             "step 1 to start", worker.stderr)
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(40) == 0, worker.stderr()
    for url in urls_of(shard_map):
        assert held_leases(url) == 0
    execution = client.get(run.execution_id)
    if execution.state is State.COMPLETED:
        assert execution.output == [0, 1]
        assert history(shard_map, run.execution_id) == completed_after(2)
        assert task(shard_map, run.execution_id) is None
    else:
        row = task(shard_map, run.execution_id)
        assert row is not None and row[0] is None, (execution.state, row)


@pytest.mark.slow
def test_sigterm_past_drain_timeout_hands_the_lease_back_at_once(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    wid = "short-drain"
    run = client.start("slow_steps", wid, {"steps": 2, "seconds": 3.0, "trace": str(trace)})
    a = spawn("a", urls_of(shard_map), "--drain-timeout", "0.2")
    wait_for(second_step_running(shard_map, run.execution_id, trace, wid), 30,
             "step 1 to start", a.stderr)
    signalled = time.monotonic()
    a.send(signal.SIGTERM)
    assert a.wait_exit(10) == 0, a.stderr()
    assert time.monotonic() - signalled < 3.0
    assert traced(trace, wid) == [0]  # it did not wait for step 1
    assert task(shard_map, run.execution_id) == (None, True), a.stderr()  # released, due now
    for url in urls_of(shard_map):
        assert held_leases(url) == 0
    assert "1 unfinished lease(s) handed back" in a.stderr()
    assert not client.get(run.execution_id).state.terminal
    assert history(shard_map, run.execution_id) == steps_completed(1)

    b = spawn("b", urls_of(shard_map))
    finished = client.wait(run.execution_id, timeout=30)
    assert finished.state is State.COMPLETED, b.stderr()
    assert finished.output == [0, 1]
    assert traced(trace, wid) == [0, 1]  # step 0 not re-run, step 1 run once, by B
    assert history(shard_map, run.execution_id) == completed_after(2)


@pytest.mark.slow
def test_a_draining_worker_keeps_its_lease_until_its_turn_finishes(
    shard_map: ShardMap, client: Client, spawn: Spawn, tmp_path: Path
) -> None:
    trace = tmp_path / "trace"
    wid = "long-drain"
    run = client.start("slow_steps", wid, {"steps": 2, "seconds": 3.0, "trace": str(trace)})
    a = spawn("a", urls_of(shard_map), "--lease", "2")  # drain timeout: the default 30 s
    wait_for(second_step_running(shard_map, run.execution_id, trace, wid), 30,
             "step 1 to start", a.stderr)
    a.send(signal.SIGTERM)
    b = spawn("b", urls_of(shard_map), "--lease", "2")
    b.wait_ready()
    assert a.wait_exit(30) == 0, a.stderr()
    finished = client.wait(run.execution_id, timeout=30)
    assert finished.state is State.COMPLETED
    assert finished.output == [0, 1]
    assert history(shard_map, run.execution_id) == completed_after(2)
    # A finished step 1 within its drain: nobody else ran it, nothing was refused.
    assert traced(trace, wid) == [0, 1]
    assert "lease lost" not in a.stderr()


# -- shard availability ------------------------------------------------------------------


def _rename_database(admin: str, old: str, new: str) -> None:
    statement = sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
        sql.Identifier(old), sql.Identifier(new)
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        for _ in range(50):
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (old,))
            try:
                conn.execute(statement)
                return
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)
    raise AssertionError(f"could not rename database {old} to {new}")


@pytest.mark.slow
def test_worker_serves_the_reachable_shard_and_picks_up_one_that_returns(
    fresh_databases: Fresh, spawn: Spawn
) -> None:
    urls = fresh_databases(2)
    migrated = run_cli("migrate", env={"SHARDQ_SHARDS": ",".join(urls)})
    assert migrated.returncode == 0, migrated.stderr
    shard_map = ShardMap.from_urls(urls)
    good, returning = shard_map.shards
    name = str(conninfo_to_dict(returning.url)["dbname"])
    away = f"{name}_away"
    admin = make_conninfo(returning.url, dbname="postgres")

    _rename_database(admin, name, away)
    renamed = True
    try:
        worker = spawn("w", urls)
        worker.wait_ready()
        assert "shard unreachable at start" in worker.stderr()
        assert "shard=shard-1" in worker.stderr()
        with Client.connect(shard_map, registry) as client:
            run = client.start("noop", routed_to(shard_map, good, "noop", "good"))
            assert client.wait(run.execution_id, timeout=20).state is State.COMPLETED
        # Let the claim loop fail on the missing shard, so it is retrying with backoff.
        wait_for(lambda: "shard unavailable; retrying" in worker.stderr(), 30,
                 "the claim loop to report the missing shard", worker.stderr)
        assert worker.proc.poll() is None
        _rename_database(admin, away, name)
        renamed = False
        back = time.monotonic()
    finally:
        if renamed:
            _rename_database(admin, away, name)

    with Client.connect(shard_map, registry) as client:
        run = client.start("noop", routed_to(shard_map, returning, "noop", "returning"))
        assert shard_map.for_execution(run.execution_id) == returning
        finished = client.wait(run.execution_id, timeout=45)
    assert finished.state is State.COMPLETED, worker.stderr()
    assert time.monotonic() - back < 40, "the returning shard was served too late"
    assert history(shard_map, run.execution_id) == [
        (0, "step.completed", "run"), (None, "run.completed", "run")
    ]
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(30) == 0, worker.stderr()


@pytest.mark.slow
def test_a_quorum_met_across_a_kill_of_every_worker(
    shard_map: ShardMap, client: Client, spawn: Spawn
) -> None:
    run = client.start("quorum_approval", "kill-quorum", {"hours": 1})
    a = spawn("a", urls_of(shard_map), "--lease", "2")
    wait_for(in_state(client, run.execution_id, State.WAITING), 15, "the run to park", a.stderr)
    client.signal(run.execution_id, "approved", {"approver": "ann"})
    client.signal(run.execution_id, "approved", {"approver": "ann"})  # the same person again
    wait_for(lambda: [k for _, k, _ in history(shard_map, run.execution_id)].count(
        "condition.consumed") == 2, 15, "both consumed", a.stderr)
    a.send(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    # Nothing runs now: the second approver's signal waits in the buffer.
    client.signal(run.execution_id, "approved", {"approver": "bob"})
    assert client.get(run.execution_id).state is State.WAITING
    b = spawn("b", urls_of(shard_map), "--lease", "2")
    finished = client.wait(run.execution_id, timeout=30)
    assert finished.state is State.COMPLETED, b.stderr()
    assert finished.output == {"outcome": "approved", "approvers": ["ann", "bob"]}
    assert [k for p, k, _ in history(shard_map, run.execution_id) if p == 0] == [
        "condition.waiting", "condition.consumed", "condition.consumed",
        "condition.consumed", "condition.met",
    ]


@pytest.mark.slow
def test_a_fan_out_killed_mid_way_signals_every_target_once(
    shard_map: ShardMap, client: Client, spawn: Spawn
) -> None:
    # The signal, the target's wake-up and the sender's record of it are one
    # statement: a worker killed at any moment leaves both or neither, and the
    # replay after it sends only what was not recorded.
    shard = shard_map.shards[0]
    keys = (k for k in (f"onb-{i}" for i in range(100_000))
            if shard_map.for_bucket(bucket_for("default", "onboarding", k)) == shard)
    targets = [client.start("onboarding", next(keys)).execution_id for _ in range(40)]
    senders_keys = (k for k in (f"tc-{i}" for i in range(100_000))
                    if shard_map.for_bucket(bucket_for("default", "tenant_cancel", k)) == shard)
    a = spawn("a", urls_of(shard_map), "--lease", "2")
    wait_for(lambda: all(client.get(t).state is State.WAITING for t in targets), 30,
             "the targets to park", a.stderr)
    senders = [
        client.start("tenant_cancel", next(senders_keys),
                     {"runs": [str(t) for t in targets[i::4]], "reason": "churned"}).execution_id
        for i in range(4)
    ]
    wait_for(lambda: any(k.startswith("external.") for s in senders
                         for _, k, _ in history(shard_map, s)), 30, "the fan-out to begin",
             a.stderr)
    a.send(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    b = spawn("b", urls_of(shard_map), "--lease", "2")
    for sender in senders:
        done = client.wait(sender, timeout=60)
        assert done.state is State.COMPLETED, b.stderr()
        assert done.output["skipped"] == {}
    for target in targets:
        assert client.wait(target, timeout=30).output == "stopped: tenant cancelled"
    url = shard.url
    assert query(url, "SELECT execution_id, count(*) FROM shardq.signals "
                      "GROUP BY 1 HAVING count(*) <> 1") == []
    recorded = {(p["target"], int(p["signal_id"])) for (p,) in query(
        url, "SELECT payload FROM shardq.events WHERE kind = 'external.sent'")}
    stored = {(str(t), i) for t, i in query(url, "SELECT execution_id, id FROM shardq.signals")}
    assert recorded == stored and len(stored) == len(targets)
