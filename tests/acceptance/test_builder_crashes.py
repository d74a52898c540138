"""Declarative workflows under kill -9: real worker processes, killed between waits."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.workflow.registry import Registry, WorkflowDef

from ..app import registry
from ..support import Daemon, wait_until

pytestmark = pytest.mark.slow

COMPENSATING_APP = '''
import os, time
from shardq.workflow.builder import Run, Workflow
from shardq.workflow.registry import Registry

registry = Registry()
LOG = os.environ["UNWIND_LOG"]


def undo(name):
    def compensate(run: Run) -> str:
        time.sleep(0.6)  # long enough to be killed in; the effect is recorded after it
        with open(LOG, "a") as log:
            log.write(name + "\\n")
        return name
    return compensate


registry.register_definition(
    Workflow("unwinding")
    .step("a", lambda run: "a", compensate=undo("undo-a"))
    .step("b", lambda run: "b", compensate=undo("undo-b"))
    .step("c", lambda run: "c", compensate=undo("undo-c"))
    .interrupt("go_ahead", "Go ahead?", actions=("approve", "reject"))
    .step("d", lambda run: "d")
    .build()
)
'''


@pytest.fixture
def workers(daemons: Callable[..., Daemon], shard_map: ShardMap) -> Callable[..., Daemon]:
    """Start a serving worker process with `app`."""
    urls = ",".join(s.url for s in shard_map.shards)

    def start(app: str = "shardq.tests.app:registry", **env: str) -> Daemon:
        worker = daemons(["--shards", urls, "worker", "--app", app, "--lease", "2",
                          "--poll-interval", "1"], env)
        worker.wait_for(" serving ")
        return worker

    return start


def kill(worker: Daemon) -> None:
    worker.proc.send_signal(signal.SIGKILL)
    assert worker.wait_exit(10) == -signal.SIGKILL


def test_killing_every_worker_between_the_approval_s_waits_changes_nothing(
    shard_map: ShardMap, workers: Callable[..., Daemon]
) -> None:
    with Client.connect(shard_map, registry) as client:
        run = client.start("approval", "crash-1", {"amount": 400}).execution_id
        worker = workers()
        wait_until(lambda: client.get(run).state is State.WAITING, timeout=20,
                   what="at the documents gate")
        kill(worker)
        client.signal(run, "documents_ready", {"files": 3})
        worker = workers()
        wait_until(lambda: client.get(run).state is State.INPUT_REQUIRED, timeout=20,
                   what="at the interrupt")
        kill(worker)
        client.decide(run, "manager_review", "approve", decision_id="ok", actor="mia")
        worker = workers()
        wait_until(lambda: any(e.kind == "sleep.started" for e in client.history(run)),
                   timeout=20, what="in the cool-down")
        kill(worker)
        workers()
        done = client.wait(run, timeout=30)
        assert done.state is State.COMPLETED, done.error
        assert done.output["steps"]["commit"] == {"committed": True, "amount": 400,
                                                  "reason": "travel"}
        assert done.output["signals"] == {"documents_ready": {"files": 3}}
        completed = [e.name for e in client.history(run) if e.kind == "step.completed"]
        assert completed == ["prepare", "commit"]


def test_unwinding_killed_mid_way_completes_each_compensation_once(
    shard_map: ShardMap, workers: Callable[..., Daemon], tmp_path: Path
) -> None:
    (tmp_path / "unwindapp.py").write_text(COMPENSATING_APP)
    log = tmp_path / "unwind.log"
    env = {"PYTHONPATH": str(tmp_path), "UNWIND_LOG": str(log)}
    app = "unwindapp:registry"
    stub = Registry()  # the client needs only the name (the worker has the code)
    stub.register_definition(WorkflowDef("unwinding", 1, lambda ctx: None))
    with Client.connect(shard_map, stub) as client:
        run = client.start("unwinding", "u-1").execution_id
        worker = workers(app, **env)
        wait_until(lambda: client.get(run).state is State.INPUT_REQUIRED, timeout=20,
                   what="at the interrupt")
        client.decide(run, "go_ahead", "reject", decision_id="no", actor="ops")
        # Kill while undo-b sleeps: after undo-c's effect and its completion are
        # both durable. (Killed between the effect and its checkpoint, a step
        # runs again: steps are at least once. Waiting for the log line alone
        # hit that window once, in a CI run.)
        def compensated(name: str) -> bool:
            return any(e.kind == "step.completed" and e.name == name
                       for e in client.history(run))

        wait_until(lambda: compensated("compensate:c"), timeout=20,
                   what="the first compensation, durable")
        assert log.read_text().splitlines() == ["undo-c"]  # undo-b is still asleep
        kill(worker)
        workers(app, **env)
        done = client.wait(run, timeout=30)
        assert done.state is State.FAILED
        assert log.read_text().splitlines() == ["undo-c", "undo-b", "undo-a"]
        compensations = [e.name for e in client.history(run)
                         if e.kind == "step.completed" and e.name.startswith("compensate:")]
        assert compensations == ["compensate:c", "compensate:b", "compensate:a"]
