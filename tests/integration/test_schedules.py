"""Schedules: the workers' tickers start one run per tick, by the home shard's clock,
with the overlap policy, the catch-up window, pause, resume and trigger."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from shardq.client.client import Client
from shardq.core.errors import InvalidArgument, ScheduleNotFound, UnknownWorkflow
from shardq.core.models import State
from shardq.core.schedules import Schedule, plan, tick_workflow_id
from shardq.store.schedule_statements import ScheduleExists
from shardq.worker.ticker import Ticker
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import rows, run_cli, wait_until

StartWorker = Callable[..., Worker]
registry = Registry()


@registry.workflow("tick")
def tick(ctx: WorkflowContext) -> Any:
    return ctx.input


@registry.workflow("slow_tick")
def slow_tick(ctx: WorkflowContext) -> Any:
    """Runs until told to finish: what the overlap policies are about."""
    return ctx.wait_for_signal("done")


@registry.workflow("typed", input_schema={"type": "object", "required": ["k"]})
def typed(ctx: WorkflowContext) -> Any:
    return ctx.input


@registry.workflow("keyed_tick", concurrency=lambda i: (f"region:{i['region']}", 1))
def keyed_tick(ctx: WorkflowContext) -> Any:
    return ctx.input


@registry.workflow("fixed_key_tick", concurrency=("reports", 1))
def fixed_key_tick(ctx: WorkflowContext) -> Any:
    return ctx.input


def _runs(client: Client, workflow: str, name: str) -> list[tuple[str, str]]:
    """(workflow id, state) of the runs a schedule started, over every shard."""
    return sorted((r[0], r[1]) for s in client.map.shards for r in rows(
        s.url, "SELECT workflow_id, shardq.run_state(id) FROM shardq.executions "
        "WHERE workflow_name = %s AND workflow_id LIKE %s", workflow, f"{name}@%"))


def test_an_interval_schedule_starts_one_run_per_tick(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    start_worker(registry)  # two tickers: each tick is still started once
    created = client.create_schedule("every-second", "tick", {"n": 1}, every=1,
                                     overlap="allow")
    assert created.next_at is not None
    wait_until(lambda: len(_runs(client, "tick", "every-second")) >= 3, timeout=15,
               what="three ticks")
    client.pause_schedule("every-second")
    found = client.schedule("every-second")
    runs = _runs(client, "tick", "every-second")
    # One run per tick: their ids name consecutive ticks one second apart.
    stamps = [datetime.strptime(w.split("@")[1], "%Y-%m-%dT%H:%M:%S.%fZ") for w, _ in runs]
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(stamps))
    # Paused, no round can start more (the pause waited for any round holding the row).
    assert found.started == len(runs) and found.paused


def test_skip_leaves_out_ticks_while_the_last_run_runs_and_trigger_starts_one_now(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    client.create_schedule("slow", "slow_tick", every=1, overlap="skip")
    wait_until(lambda: _runs(client, "slow_tick", "slow"), timeout=10, what="a first run")
    wait_until(lambda: client.schedule("slow").skipped >= 2, timeout=10, what="skipped ticks")
    assert len(_runs(client, "slow_tick", "slow")) == 1
    client.trigger_schedule("slow")
    wait_until(lambda: len(_runs(client, "slow_tick", "slow")) == 2, timeout=10,
               what="the triggered run beside the running one")
    assert any("@manual-" in w for w, _ in _runs(client, "slow_tick", "slow"))


def test_buffer_one_starts_a_held_tick_when_the_last_run_ends(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    client.create_schedule("buffered", "slow_tick", every=1, overlap="buffer_one")
    wait_until(lambda: _runs(client, "slow_tick", "buffered"), timeout=10, what="a run")
    wait_until(lambda: client.schedule("buffered").buffered_at is not None, timeout=10,
               what="a tick held")
    first = client.schedule("buffered").last_run
    client.signal(first, "done", None)
    wait_until(lambda: len(_runs(client, "slow_tick", "buffered")) == 2, timeout=10,
               what="the held tick started")
    client.delete_schedule("buffered")
    with pytest.raises(ScheduleNotFound):
        client.schedule("buffered")


def test_a_cron_schedule_in_a_time_zone_fires_at_its_next_minute(client: Client) -> None:
    created = client.create_schedule("paris", "tick", cron="*/5 * * * *",
                                     timezone="Europe/Paris")
    assert created.next_at is not None
    local = created.next_at.astimezone(ZoneInfo("Europe/Paris"))
    assert local.minute % 5 == 0 and local.second == 0


def test_ticks_missed_beyond_the_catch_up_window_are_counted_not_run(
    client: Client, store: Any
) -> None:
    """A ticker that comes back after every worker was down: one round, by hand."""
    client.create_schedule("downtime", "tick", every=60, overlap="allow", catchup_window=150)
    for shard in client.map.shards:
        rows(shard.url, "UPDATE shardq.schedules SET next_at = now() - interval '10 minutes' "
             "WHERE name = 'downtime' RETURNING 1")
    Ticker(store, registry, threading.Event()).round()
    after = client.schedule("downtime")
    # Eleven ticks, from 10 minutes ago to now: those within the last 150 s (two or
    # three, as the clock falls) run, the older ones are counted as missed.
    assert after.missed >= 7 and after.started >= 2
    assert after.started + after.missed == 11
    assert len(_runs(client, "tick", "downtime")) == after.started


def test_a_round_killed_before_its_commit_starts_no_tick_twice(
    client: Client, store: Any
) -> None:
    client.create_schedule("crashy", "tick", every=60, overlap="allow")
    for shard in client.map.shards:
        rows(shard.url, "UPDATE shardq.schedules SET next_at = now() - interval '90 seconds'"
             " WHERE name = 'crashy' RETURNING 1")

    class Dies(Exception):
        pass

    ticker = Ticker(store, registry, threading.Event())
    real = ticker._start

    def start_then_die(plans: Any) -> Any:
        real(plans)
        raise Dies()

    ticker._start = start_then_die  # type: ignore[method-assign]
    with pytest.raises(Dies):
        ticker.round()
    started = _runs(client, "tick", "crashy")
    assert len(started) == 2 and client.schedule("crashy").started == 0
    Ticker(store, registry, threading.Event()).round()
    assert _runs(client, "tick", "crashy") == started
    assert client.schedule("crashy").started == 2


def test_plan_follows_dst_in_the_schedule_s_time_zone() -> None:
    paris = ZoneInfo("Europe/Paris")
    base = dict(name="dst", tenant="default", workflow="tick", input=None, every_s=None,
                timezone="Europe/Paris", overlap="allow", catchup_s=1e9, paused=False,
                last_tick=None, last_run=None, buffered_at=None, triggered_at=None,
                started=0, skipped=0, missed=0, created_at=datetime.now(UTC))
    spring = Schedule(cron="30 2 * * *", next_at=datetime(2026, 3, 28, 2, 30, tzinfo=paris)
                      .astimezone(UTC), **base)  # type: ignore[arg-type]
    ticks = plan(spring, datetime(2026, 3, 31, tzinfo=UTC), last_live=False).starts
    # 2:30 does not exist on March 29 in Paris: that day's tick is at 3:00, once.
    assert [t.astimezone(paris).strftime("%d %H:%M") for t in ticks] == [
        "28 02:30", "29 03:00", "30 02:30"]
    autumn = Schedule(cron="30 2 * * *", next_at=datetime(2026, 10, 24, 2, 30, tzinfo=paris)
                      .astimezone(UTC), **base)  # type: ignore[arg-type]
    ticks = plan(autumn, datetime(2026, 10, 27, tzinfo=UTC), last_live=False).starts
    # 2:30 happens twice on October 25: one tick.
    assert len(ticks) == 3
    assert len({tick_workflow_id("dst", t) for t in ticks}) == 3


@pytest.mark.parametrize(("fields", "message"), [
    ({"workflow": "nope", "every": 5}, "nope"),
    ({"workflow": "tick", "cron": "0 0 30 2 *"}, "Bad day-of-month"),
    ({"workflow": "tick", "cron": "not cron"}, "not a cron expression"),
    ({"workflow": "tick", "cron": "* * * * *", "every": 5}, "exactly one of cron and every"),
    ({"workflow": "tick"}, "exactly one of cron and every"),
    ({"workflow": "tick", "every": 0.5}, "every must be a number of seconds >= 1"),
    ({"workflow": "tick", "every": float("nan")}, "every must be"),
    ({"workflow": "tick", "every": 5, "timezone": "Mars/Olympus"}, "not a known IANA"),
    ({"workflow": "tick", "every": 5, "timezone": "UTC\x00"}, "timezone must be"),
    ({"workflow": "tick", "every": 5, "overlap": "queue"}, "overlap must be one of"),
    ({"workflow": "tick", "every": 5, "catchup_window": -1}, "catchup_window"),
    ({"workflow": "typed", "every": 5, "input": {"j": 1}}, "does not match its schema"),
    ({"workflow": "tick", "every": 5, "input": float("inf")}, "JSON"),
    ({"workflow": "tick", "every": 5, "name": "bad name"}, "schedule name"),
    ({"workflow": "tick", "every": 5, "name": "nul\x00"}, "schedule name"),
])
def test_a_bad_schedule_is_refused_and_nothing_is_stored(
    client: Client, fields: dict[str, Any], message: str
) -> None:
    args = {"name": "hostile", "input": None, **fields}
    name, workflow, value = args.pop("name"), args.pop("workflow"), args.pop("input")
    with pytest.raises((InvalidArgument, UnknownWorkflow)) as caught:
        client.create_schedule(name, workflow, value, **args)
    assert message in str(caught.value)
    assert "hostile" not in [s.name for s in client.schedules()]


def test_a_name_taken_is_refused(client: Client) -> None:
    client.create_schedule("twice", "tick", every=5)
    with pytest.raises(ScheduleExists):
        client.create_schedule("twice", "tick", every=10)
    assert client.schedule("twice").every_s == 5


def test_a_schedule_survives_its_runs_state_check_on_a_finished_run(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry)
    client.create_schedule("quick", "tick", {"v": 1}, every=1, overlap="skip")
    wait_until(lambda: sum(1 for _, s in _runs(client, "tick", "quick")
                           if s == State.COMPLETED.value) >= 2, timeout=15,
               what="two ticks run one after the other under skip")


APP = "shardq.tests.integration.test_schedules:registry"


def test_the_command_line_creates_shows_triggers_and_deletes_a_schedule(
    client: Client,
) -> None:
    shards = ",".join(s.url for s in client.map.shards)
    made = run_cli("--shards", shards, "schedule", "create", "nightly", "--app", APP,
                   "--workflow", "tick", "--cron", "0 3 * * *", "--timezone",
                   "America/New_York", "--input", '{"k": 1}', "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["timezone"] == "America/New_York"
    listed = run_cli("--shards", shards, "schedule", "list")
    assert "nightly  tick  cron '0 3 * * *' (America/New_York)" in listed.stdout
    for action in ("pause", "trigger", "resume"):
        done = run_cli("--shards", shards, "schedule", action, "nightly", "--json")
        assert done.returncode == 0, done.stderr
    shown = json.loads(run_cli("--shards", shards, "schedule", "show", "nightly",
                               "--json").stdout)
    assert shown["paused"] is False and shown["triggered_at"] is not None
    assert run_cli("--shards", shards, "schedule", "delete", "nightly").returncode == 0
    gone = run_cli("--shards", shards, "schedule", "show", "nightly")
    assert gone.returncode == 7 and "schedule 'nightly' not found" in gone.stderr


@pytest.mark.parametrize(("args", "code", "error"), [
    (["create", "x", "--workflow", "tick", "--cron", "0 0 31 2 *"], 7, "Bad day-of-month"),
    (["create", "x", "--workflow", "tick", "--every", "0"], 7, "every must be"),
    (["create", "x", "--workflow", "nope", "--every", "5"], 7, "unknown workflow 'nope'"),
    (["create", "x", "--workflow", "tick", "--every", "5", "--timezone", "Nowhere/Land"], 7,
     "not a known IANA"),
    (["create", "x", "--workflow", "tick", "--every", "5", "--input", "{bad"], 2,
     "Invalid value for '--input'"),
    (["create", "x", "--workflow", "tick", "--every", "5", "--overlap", "queue"], 2,
     "Invalid value for '--overlap'"),
    (["create", "x y", "--workflow", "tick", "--every", "5"], 2, "schedule name"),
    (["show", "missing"], 7, "schedule 'missing' not found"),
    (["pause", "missing"], 7, "schedule 'missing' not found"),
])
def test_the_command_line_refuses_bad_schedules_in_one_line(
    client: Client, args: list[str], code: int, error: str,
) -> None:
    shards = ",".join(s.url for s in client.map.shards)
    extra = ["--app", APP] if args[0] == "create" else []
    done = run_cli("--shards", shards, "schedule", *args, *extra)
    assert done.returncode == code, done
    assert error in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "x" not in [s.name for s in client.schedules()]


def test_a_tick_of_a_limited_workflow_runs_under_the_key_its_input_names(
    client: Client, start_worker: StartWorker
) -> None:
    """The ticker reads a schedule's input as text and parses it only for a workflow
    whose concurrency key is a function of it: the tick's run still gets its key."""
    start_worker(registry)
    client.create_schedule("keyed", "keyed_tick", {"region": "eu"}, every=3600)
    client.create_schedule("fixed", "fixed_key_tick", {"n": 1}, every=3600)
    client.trigger_schedule("keyed")
    client.trigger_schedule("fixed")
    def ended(workflow: str, name: str) -> bool:
        return [state for _, state in _runs(client, workflow, name)] == ["completed"]

    wait_until(lambda: ended("keyed_tick", "keyed") and ended("fixed_key_tick", "fixed"),
               timeout=15, what="both triggers' runs")
    keys = sorted(r for s in client.map.shards for r in rows(
        s.url, "SELECT workflow_name, concurrency_key, input::text FROM shardq.executions "
        "WHERE workflow_name IN ('keyed_tick', 'fixed_key_tick')"))
    assert keys == [("fixed_key_tick", "reports", '{"n": 1}'),
                    ("keyed_tick", "region:eu", '{"region": "eu"}')]
