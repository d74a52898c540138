"""A wait's deadline, with its worker process killed (SIGKILL) across it.

As a user would run it: a run waits with
`ctx.receive("docs", timeout=...)`, its `shardq worker` is killed, the deadline
passes with no worker up, a signal is sent, and a new worker starts. The
outcome is what the store's times say: a signal received after the deadline
does not count (the wait times out, and the signal stays buffered for the next
receive), one received before it does, however late the worker comes.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.workflow.registry import Registry

from ..support import Daemon, rows, wait_until

APP = '''
from shardq.workflow.registry import Registry

registry = Registry()


@registry.workflow("docs")
def docs(ctx):
    got = ctx.receive("docs", timeout=float(ctx.input["timeout"]))
    if got is not None:
        return {"in_time": got.payload}
    later = ctx.receive("docs")  # no timeout: a buffered signal returns at once
    return {"timed_out": True, "later": later.payload}
'''


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Registry]:
    """The workflows, as a module the worker processes import (and this test too)."""
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "deadline_app.py").write_text(APP)
    spec = importlib.util.spec_from_file_location("deadline_app", folder / "deadline_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module.registry


@pytest.fixture
def client(shard_map: ShardMap, pools: ShardPools, app: Registry) -> Client:
    return Client(Store(pools), app)


def worker(daemons: Callable[..., Daemon], shard_map: ShardMap, tmp_path: Path) -> Daemon:
    process = daemons(["--shards", ",".join(s.url for s in shard_map.shards), "worker",
                       "--app", "deadline_app:registry", "--lease", "2", "--poll-interval", "1"],
                      env={"PYTHONPATH": str(tmp_path / "app")})
    process.wait_for(" serving ")
    return process


def deadline_of(shard_map: ShardMap, run: str) -> tuple[datetime, datetime]:
    """(the wait's deadline, the database's now)."""
    ((deadline, now),) = rows(shard_map.for_execution(run).url,
                              "SELECT deadline, now() FROM shardq.waits "
                              "WHERE execution_id = %s", run)
    return deadline, now


def parked_then_killed(
    client: Client, daemons: Callable[..., Daemon], shard_map: ShardMap, tmp_path: Path,
    timeout: float,
) -> str:
    first = worker(daemons, shard_map, tmp_path)
    run = str(client.start("docs", f"docs-{timeout}", {"timeout": timeout}).execution_id)
    wait_until(lambda: client.get(run).state is State.WAITING, what="parked", timeout=20)
    first.kill()  # SIGKILL
    assert first.proc.returncode == -9
    return run


def signal_row(shard_map: ShardMap, run: str) -> datetime:
    ((received,),) = rows(shard_map.for_execution(run).url,
                          "SELECT received_at FROM shardq.signals WHERE execution_id = %s", run)
    return received  # type: ignore[no-any-return]


def history_at_wait(client: Client, run: str) -> list[str]:
    return [e.kind for e in client.history(run) if e.position == 0]


def test_a_signal_after_the_deadline_does_not_count_though_no_worker_was_up(
    client: Client, daemons: Callable[..., Daemon], shard_map: ShardMap, tmp_path: Path
) -> None:
    run = parked_then_killed(client, daemons, shard_map, tmp_path, timeout=1.5)
    deadline, now = deadline_of(shard_map, run)
    time.sleep(max(0.0, (deadline - now).total_seconds()) + 1.0)
    client.signal(run, "docs", "late")
    assert signal_row(shard_map, run) > deadline
    worker(daemons, shard_map, tmp_path)
    done = client.wait(run, timeout=20)
    assert done.output == {"timed_out": True, "later": "late"}
    assert history_at_wait(client, run) == ["signal.waiting", "signal.timed_out"]


def test_a_signal_before_the_deadline_counts_though_the_worker_came_after_it(
    client: Client, daemons: Callable[..., Daemon], shard_map: ShardMap, tmp_path: Path
) -> None:
    run = parked_then_killed(client, daemons, shard_map, tmp_path, timeout=4.0)
    client.signal(run, "docs", "early")
    deadline, _ = deadline_of(shard_map, run)
    assert signal_row(shard_map, run) < deadline, "the machine was too slow to send in time"
    wait_until(lambda: deadline_of(shard_map, run)[1] > deadline, what="the deadline to pass",
               timeout=10)
    worker(daemons, shard_map, tmp_path)
    done = client.wait(run, timeout=20)
    assert done.output == {"in_time": "early"}
    got: dict[str, Any] = next(e.payload for e in client.history(run)
                               if e.kind == "signal.consumed")
    assert got["payload"] == "early"
    assert history_at_wait(client, run) == ["signal.waiting", "signal.consumed"]
