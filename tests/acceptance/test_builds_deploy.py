"""A rolling deploy with build pinning, as an operator runs one: two real `shardq worker`
processes on two versions of the code (tests/builds.py), `shardq workflow set-build`
between them, and `shardq workflow migrate-build` once the old build's workers are gone.

A run claimed by the wrong build would show it: v2's runs fail on v1's code (their
history holds a patch marker v1 does not call), and each step returns the build that
ran it, so a v1 run resumed by v2 ends ["v1", "v2"] instead of ["v1", "v1"]."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.tests.builds import v1

from ..support import Daemon, all_rows, run_cli, wait_until

pytestmark = pytest.mark.slow
registry = v1  # the client fixture's: starts and signals need only the workflow's name


def test_a_rolling_deploy_keeps_each_run_on_its_build_until_an_operator_moves_it(
    client: Client, daemons: Callable[..., Daemon],
) -> None:
    env = {"SHARDQ_SHARDS": ",".join(s.url for s in client.map.shards)}

    def cli(*args: str) -> str:
        done = run_cli(*args, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def worker(build: str, app: str) -> Daemon:
        started = daemons(["worker", "--app", f"shardq.tests.builds:{app}", "--build-id", build,
                           "--poll-interval", "0.5", "--concurrency", "4"], env=env)
        started.wait_for(f"build {build}")
        return started

    def started(prefix: str) -> list[uuid.UUID]:
        runs = [client.start("order", f"{prefix}-{i}").execution_id for i in range(10)]
        wait_until(lambda: all(client.get(r).state is State.WAITING for r in runs),
                   timeout=60, what=f"the {prefix} runs parked on `paid`")
        return runs

    def finished(runs: list[uuid.UUID]) -> list[object]:
        ended = [client.wait(r, timeout=60) for r in runs]
        assert [e.state for e in ended] == [State.COMPLETED] * len(runs), [e.error for e in ended]
        return [e.output for e in ended]

    cli("workflow", "set-build", "order", "b1")
    old = worker("b1", "v1")
    first = started("first")
    # The deploy: v2's workers beside v1's, then v2 is made current.
    worker("b2", "v2")
    cli("workflow", "set-build", "order", "b2", "--policy", "pinned")
    second = started("second")
    assert {(client.get(r).build_id, client.get(r).pinned) for r in first} == {("b1", True)}
    assert {client.get(r).build_id for r in second} == {"b2"}

    for run in first[:5] + second:
        client.signal(run, "paid")
    assert finished(first[:5]) == [["v1", "v1"]] * 5
    assert finished(second) == [["v2", "v2"]] * 10
    (shown,) = json.loads(cli("workflow", "builds", "--json"))["workflows"]
    assert shown == {"workflow": "order", "build_id": "b2", "policy": "pinned",
                     "pinned_runs": {"b1": 5}, "differing": {}}

    # v1's workers are gone: its runs wait for them, and v2's workers leave them be.
    old.kill()
    for run in first[5:]:
        client.signal(run, "paid")
    time.sleep(2)  # four of v2's polls, and a NOTIFY per signal
    assert sorted(r[0] for r in all_rows(
        client.map, "SELECT build_id FROM shardq.tasks WHERE execution_id = ANY(%s) "
                    "AND lease_token IS NULL", first[5:])) == ["b1"] * 5
    assert not any(client.get(r).state.terminal for r in first[5:])

    # Told to, they move: v2 replays v1's histories (the patch), and runs the rest.
    moved = cli("workflow", "migrate-build", "order", "--from", "b1", "--to", "b2")
    assert "5 unfinished run(s) of order moved from build b1 to build b2" in moved
    assert finished(first[5:]) == [["v1", "v2"]] * 5
    (shown,) = json.loads(cli("workflow", "builds", "--json"))["workflows"]
    assert shown["pinned_runs"] == {}
