"""Growing online, end to end: a third PostgreSQL server added and a range moved onto it
while a worker and a relay run and a client keeps signalling the moving runs.

Two shards on two embedded servers; `shardq worker` and `shardq outbox-relay` run as
daemons throughout, started with the two seed URLs only and a fast map poll. Runs of
every kind sit in the range that moves (shard-0's upper half, buckets 1024-2047): runs
parked on signals, timers due while the move runs, an open interrupt, runs that send to
the other shard through the outbox and runs there that send to them. Client threads
signal the moving runs continuously, each signal with its own idempotency key and
every seventh a retry of an earlier key. Then `shardq shards add` starts using a
third server and `shardq shards move` carries the range onto it, both as subprocesses,
while `shardq workflow list` and the exporter are read over and over.

What a user of the moving runs must see: no error, no call slower than 2 s, every
signal consumed exactly once, timers never early, the interrupt decidable after the
move, new runs of the range on the new shard done by the same worker process, and
every list and scrape counting each run once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.embedded import EmbeddedPostgres
from shardq.shards.routing import bucket_for
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import ROOT, Daemon, free_port, scrape, wait_until

pytestmark = pytest.mark.slow

APP = "shardq.tests.acceptance.test_grow_online:registry"
MOVING = (1024, 2047)  # shard-0's upper half in a two-shard map
INBOXES = 300  # parked on signals in the moving range
STILL = 40  # parked on signals elsewhere, the untouched side
NAPS = 30  # timers in the moving range, due while the move runs
SENDERS = 8  # per direction: to the moving range from shard-1, and back
BATCH_RUNS = 60
LONGEST_CALL_S = 2.0

registry = Registry()


@registry.workflow("grow_inbox")
def grow_inbox(ctx: WorkflowContext) -> int:
    """Consume `ping` signals one by one until one says stop; how many came."""
    count = 0
    while True:
        got = ctx.receive("ping")
        if got is not None and got.payload == "stop":
            return count
        count += 1


@registry.workflow("grow_nap")
def grow_nap(ctx: WorkflowContext) -> str:
    ctx.sleep("nap", float(ctx.input["seconds"]))
    return "woke"


@registry.workflow("grow_review")
def grow_review(ctx: WorkflowContext) -> str:
    return ctx.interrupt("approve", "move me?", ["approve", "reject"]).action


@registry.workflow("grow_sender")
def grow_sender(ctx: WorkflowContext) -> int:
    """Told whom to ping, pings each of them (another shard: through the outbox)."""
    targets = ctx.wait_for_signal("fire")
    for target in targets:
        ctx.signal_external(target, "ping", {"k": f"{ctx.workflow_id}>{target}"},
                            idempotency_key=f"{ctx.workflow_id}>{target}")
    return len(targets)


def keys_in(workflow: str, prefix: str, count: int, first: int, last: int,
            *, outside: bool = False) -> list[str]:
    """`count` workflow ids whose runs of `workflow` fall in (or outside) first..last."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        key = f"{prefix}-{n}"
        n += 1
        if (first <= bucket_for("default", workflow, key) <= last) != outside:
            found.append(key)
    return found


@dataclass
class Signaller:
    """Keyed pings to the moving runs, timed call by call; every seventh repeats a key."""

    client: Client
    runs: list[uuid.UUID]
    name: str
    acked: dict[str, uuid.UUID] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    longest: tuple[float, str] = (0.0, "")
    calls: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)

    def _loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            run = self.runs[n % len(self.runs)]
            retry = n % 7 == 6 and self.acked
            key = next(reversed(self.acked)) if retry else f"{self.name}-{n}"
            target = self.acked[key] if retry else run
            t = time.monotonic()
            try:
                result = self.client.signal(target, "ping", {"k": key}, idempotency_key=key)
            except Exception as exc:  # every one is a finding: reported, not hidden
                self.errors.append(f"{type(exc).__name__}: {exc} (run {target}, key {key})")
            else:
                if retry and result.delivered:
                    self.errors.append(f"retry of {key} delivered a second time")
                if not retry:
                    self.acked[key] = target
            took = time.monotonic() - t
            self.calls += 1
            if took > self.longest[0]:
                self.longest = (took, f"key {key} at {time.strftime('%H:%M:%S')}")
            n += 1


@dataclass
class Counts:
    """`shardq workflow list` and the exporter read again and again against the truth."""

    env: dict[str, str]
    port: int
    expected: list[int]
    wrong: list[str] = field(default_factory=list)
    samples: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="counts", daemon=True)

    def once(self) -> None:
        want = self.expected[0]
        for what in ("workflow list", "exporter"):
            try:
                found = listed_runs(self.env) if what == "workflow list" else exported_runs(
                    self.port)
            except Exception as exc:  # a failed read is as wrong as a wrong count
                self.wrong.append(f"{what}: {type(exc).__name__}: {exc}")
                continue
            if found != want:
                self.wrong.append(f"{what}: {found} runs at {time.strftime('%H:%M:%S')}, "
                                  f"{want} exist")
        self.samples += 1

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.once()


def listed_runs(env: dict[str, str]) -> int:
    done = cli(env, "--json", "workflow", "list", "--limit", "1000")
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()}")
    page = json.loads(done.stdout)
    ids = [item["id"] for item in page["items"]]
    if page["next_cursor"] is not None or len(ids) != len(set(ids)):
        raise RuntimeError(f"{len(ids)} listed, {len(set(ids))} distinct, more pages: "
                           f"{page['next_cursor'] is not None}")
    return len(ids)


def exported_runs(port: int) -> int:
    return round(sum(v for (name, _labels), v in scrape(port).items() if name == "shardq_runs"))


def cli(env: dict[str, str], *args: str, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    return subprocess.run([sys.executable, "-m", "shardq.bin.cli", *args],
                          env={**full, **env}, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def rows(url: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()


@pytest.fixture
def servers() -> Iterator[list[EmbeddedPostgres]]:
    started: list[EmbeddedPostgres] = []
    try:
        for _ in range(3):
            started.append(EmbeddedPostgres().start())
        yield started
    finally:
        for server in started:
            server.stop()


@dataclass
class Runs:
    """The runs the test starts before the move, by what they are for."""

    inboxes: list[uuid.UUID]  # parked on signals, in the moving range
    still: list[uuid.UUID]  # parked on signals elsewhere
    review: uuid.UUID  # an open interrupt, in the moving range
    to_moving: list[uuid.UUID]  # senders on shard-1 to inboxes
    from_moving: list[uuid.UUID]  # senders in the moving range to shard-1's runs
    naps: list[uuid.UUID] = field(default_factory=list)  # timers due during the move

    @property
    def parked(self) -> list[uuid.UUID]:
        return [*self.inboxes, *self.still, *self.to_moving, *self.from_moving]

    def sends(self, client: Client) -> list[tuple[uuid.UUID, list[uuid.UUID]]]:
        """Each sender and the runs it pings (five each)."""
        on_shard_1 = [r for r in self.still if client.map.for_execution(r).name == "shard-1"]
        out = []
        for senders, targets in ((self.to_moving, self.inboxes), (self.from_moving, on_shard_1)):
            out += [(run, targets[i::len(senders)][:5]) for i, run in enumerate(senders)]
        return out


def start_runs(client: Client) -> Runs:
    first, last = MOVING

    def start(workflow: str, prefix: str, count: int, lo: int = first, hi: int = last,
              *, outside: bool = False) -> list[uuid.UUID]:
        keys = keys_in(workflow, prefix, count, lo, hi, outside=outside)
        return [r.execution_id for r in client.start_many(workflow, [(k, None) for k in keys])]

    runs = Runs(inboxes=start("grow_inbox", "in", INBOXES),
                still=start("grow_inbox", "still", STILL, outside=True),
                review=start("grow_review", "rv", 1)[0],
                to_moving=start("grow_sender", "to", SENDERS, 2048, 4095),
                from_moving=start("grow_sender", "from", SENDERS))
    wait_until(lambda: all(client.get(r).state is State.WAITING for r in runs.parked)
               and client.get(runs.review).state is State.INPUT_REQUIRED,
               timeout=60, what="every run parked")
    return runs


def check_signals(client: Client, runs: Runs, signallers: list[Signaller]) -> None:
    """Every signal acknowledged to a client or sent by a sender consumed exactly once."""
    acked: dict[uuid.UUID, set[str]] = {}
    for s in signallers:
        for key, run in s.acked.items():
            acked.setdefault(run, set()).add(key)
    for sender, targets in runs.sends(client):
        name = client.get(sender).workflow_id
        for t in targets:
            acked.setdefault(t, set()).add(f"{name}>{t}")
    for run in [*runs.inboxes, *runs.still]:
        consumed = Counter(e.payload["payload"]["k"] for e in client.history(run)
                           if e.kind == "signal.consumed" and e.payload["payload"] != "stop")
        twice = [k for k, n in consumed.items() if n > 1]
        assert not twice, f"run {run} consumed {twice} more than once"
        assert set(consumed) == acked.get(run, set()), f"run {run}"
        assert client.get(run).output == len(consumed)


def check_timers(client: Client, naps: list[uuid.UUID]) -> None:
    """Each timer fired, and not before its wake time (set on the source's clock)."""
    for run in naps:
        events = {e.kind: e for e in client.history(run)}
        wake_at = datetime.fromisoformat(events["sleep.started"].payload["wake_at"])
        fired = events["sleep.fired"].recorded_at
        assert fired is not None and fired >= wake_at, (run, wake_at, fired)


def test_a_third_server_added_and_a_range_moved_onto_it_while_everything_runs(
    servers: list[EmbeddedPostgres], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t_start = time.monotonic()
    first, last = MOVING
    urls = [s.create_database("grow") for s in servers[:2]]
    env = {"SHARDQ_SHARDS": ",".join(urls), "SHARDQ_APP": APP, "SHARDQ_MAP_POLL_S": "0.5"}
    migrated = cli(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    daemons = [
        Daemon("worker", ["-v", "worker", "--concurrency", "16", "--poll-interval", "1"],
               tmp_path, env),
        Daemon("relay", ["-v", "outbox-relay", "--poll-interval", "1"], tmp_path, env),
        Daemon("metrics", ["metrics", "--port", str(port), "--cache-seconds", "0"],
               tmp_path, env),
    ]
    monkeypatch.setenv("SHARDQ_MAP_POLL_S", "0.5")
    client = Client.connect(ShardMap.from_urls(urls), registry)
    signallers: list[Signaller] = []
    counts = Counts(env, port, [0])
    try:
        daemons[0].wait_for("serving shard-0, shard-1")
        daemons[1].wait_for("outbox relay serving")
        runs = start_runs(client)
        counts.expected[0] = len(runs.parked) + 1
        counts.once()  # before: the two shards
        signallers += [Signaller(client, runs.inboxes[i::2], f"sig{i}") for i in range(2)]
        for s in signallers:
            s.thread.start()

        third = servers[2].create_database("grow")
        added = cli(env, "--json", "shards", "add", "shard-2", third)
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout)["shard"] == "shard-2"

        # Timers due while the move runs (it takes seconds), started just before it.
        runs.naps = [r.execution_id for r in client.start_many("grow_nap", [
            (k, {"seconds": 0.5 + 0.15 * i}) for i, k in enumerate(
                keys_in("grow_nap", "nap", NAPS, first, last))])]
        counts.expected[0] += NAPS
        counts.thread.start()
        for sender, targets in runs.sends(client):  # outbox rows both ways, during the move
            client.signal(sender, "fire", [str(t) for t in targets])

        t_move = time.monotonic()
        moved = cli(env, "--json", "shards", "move", f"{first}-{last}", "--to", "shard-2",
                    "--batch-runs", str(BATCH_RUNS), "--grace", "1")
        move_s = time.monotonic() - t_move
        assert moved.returncode == 0, moved.stdout + moved.stderr
        result = json.loads(moved.stdout)
        assert result["phase"] == "done"
        assert result["runs_moved"] >= INBOXES + NAPS

        time.sleep(1.0)  # the clients keep going on the moved runs, now on shard-2
        for s in signallers:
            s.stop.set()
            s.thread.join(30)
        counts.stop.set()
        counts.thread.join(60)
        longest = max(s.longest for s in signallers)
        calls = sum(s.calls for s in signallers)
        errors = [e for s in signallers for e in s.errors]
        print(f"\nmove {move_s:.1f} s ({result['runs_moved']} runs, {len(result['batches'])} "
              f"batches, longest batch pause {result['max_pause_ms']} ms); {calls} "
              f"Client.signal calls, longest {longest[0] * 1000:.0f} ms ({longest[1]}), "
              f"{len(errors)} errors; {counts.samples} count samples, {len(counts.wrong)} "
              f"wrong; {time.monotonic() - t_start:.0f} s so far")
        assert not errors, errors[:5]
        assert calls > 100 and sum(len(s.acked) for s in signallers) > 50
        assert longest[0] <= LONGEST_CALL_S, longest

        # The interrupt opened before the move is decided on its new shard.
        decided = client.decide(runs.review, "approve", "approve", decision_id="after-move",
                                actor="test")
        assert decided.accepted
        assert client.wait(runs.review, timeout=15).output == "approve"

        # New runs of the moved range start on shard-2 and the same worker runs them.
        fresh = [r.execution_id for r in client.start_many("grow_nap", [
            (k, {"seconds": 0.1}) for k in keys_in("grow_nap", "fresh", 10, first, last)])]
        counts.expected[0] += len(fresh)
        for run in fresh:
            assert client.map.for_execution(run).name == "shard-2"
            assert client.wait(run, timeout=30).state is State.COMPLETED
        on_third = {r[0] for r in rows(third, "SELECT id FROM shardq.executions")}
        assert {*fresh, *runs.inboxes, *runs.naps, runs.review} <= on_third
        assert daemons[0].proc.poll() is None
        assert "serving a shard the map added" in daemons[0].stderr()

        # Every outbox row delivered, then each inbox told to stop.
        for run in [*runs.to_moving, *runs.from_moving]:
            assert client.wait(run, timeout=30).state is State.COMPLETED
        wait_until(lambda: not any(rows(u, "SELECT 1 FROM shardq.outbox WHERE state ="
                                            " 'pending'") for u in [*urls, third]),
                   timeout=30, what="the outboxes drained")
        for run in [*runs.inboxes, *runs.still]:
            client.signal(run, "ping", "stop", idempotency_key=f"stop-{run}")
        for run in [*runs.inboxes, *runs.still, *runs.naps]:
            assert client.wait(run, timeout=30).state is State.COMPLETED, run
        check_signals(client, runs, signallers)
        check_timers(client, runs.naps)

        counts.once()  # after: three shards
        assert not counts.wrong, counts.wrong[:5]
        assert counts.samples >= 3
        for d in daemons:
            assert d.proc.poll() is None, f"{d.name} exited:\n{d.stderr()}"
    finally:
        for s in signallers:
            s.stop.set()
        counts.stop.set()
        client.close()
        for d in daemons:
            d.kill()


def test_the_demo_grows_onto_a_server_it_starts_while_its_worker_and_relay_run() -> None:
    """README's first command without SHARDQ_SHARDS: its own servers, and a third added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    done = subprocess.run([sys.executable, "-m", "shardq.bin.demo"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "demo finished" in out
    assert "starting 2 throw-away embedded PostgreSQL servers" in out
    assert "$ shardq shards add shard-2" in out and "shard map version 2" in out
    assert "-> shard-2:" in out, out[-2000:]
    assert ", 0 errors, the slowest call" in out
    assert "all 200 completed by the same worker" in out
    assert "shard-2 0" not in out.rsplit("the runs are on", 1)[-1]
