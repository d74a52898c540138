"""`shardq replay` and `shardq history export`: histories recorded by real workers on v1
of tests/versions.py, replayed against each changed version.

Every seeded breaking change must be caught in the runs it breaks, and only there;
no change that keeps histories valid may be reported. The command writes nothing,
says pass or fail by its exit code, and refuses bad input in one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.client.recorded import recorded_runs
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.routing import new_execution_id
from shardq.worker.worker import Worker
from shardq.workflow.exported import RecordedRun
from shardq.workflow.registry import Registry
from shardq.workflow.replayer import check_run

from .. import versions
from ..support import rows, run_cli, wait_until

registry = versions.v1
StartWorker = Callable[..., Worker]
APP = "shardq.tests.versions:"

# Which recorded runs each breaking change breaks, and at which position: runs by
# workflow id (tests' `recorded`), None where no one position is to blame.
EXPECTED: dict[str, dict[str, int | None]] = {
    "steps_reordered": {"o-done": 0, "o-wait": 0},
    "step_removed": {"o-done": 0, "o-wait": 0},
    "step_added_first": {"o-done": 0, "o-wait": 0},
    "step_renamed": {"o-done": 3},  # o-wait is parked before the step: still fine
    "step_made_conditional": {"o-done": 0, "o-wait": 0},
    "wait_removed": {"o-done": 2, "o-wait": 2},
    "signal_renamed": {"o-done": 2, "o-wait": 2},
    "timer_changed": {"o-done": 1, "o-wait": 1},
    "timer_became_signal": {"o-done": 1, "o-wait": 1},
    "clock_read_added": {"o-done": 0, "o-wait": 0},
    "loop_shortened": {"b-1": 2},
    "loop_lengthened": {"b-1": 3},
    "child_workflow_changed": {"f-1": 0},
    "workflow_removed": {"s-1": None},
    "code_now_raises": {"o-done": 0, "o-wait": 0},
}


@pytest.fixture
def recorded(client: Client, start_worker: StartWorker,
             relay: Callable[..., Any]) -> dict[str, RecordedRun]:
    """Runs of v1, by workflow id: completed ones of every workflow and an order parked
    on its `paid` signal (the relay carries a child to the other shard, and back)."""
    start_worker(versions.v1, poll_interval_s=0.2)
    relay()
    done = client.start("order", "o-done", {"amount": 5})
    client.signal(done.execution_id, "paid", {"ref": "p-1"})
    waiting = client.start("order", "o-wait", {"amount": 7})
    ended = [done.execution_id, client.start("batch", "b-1").execution_id,
             client.start("family", "f-1").execution_id,
             client.start("stamp", "s-1").execution_id]
    for run in ended:
        assert client.wait(run, timeout=30).state is State.COMPLETED
    wait_until(lambda: (w := client.waiting(waiting.execution_id)[0]) is not None
               and w.name == "paid", timeout=30, what="o-wait parked on paid")
    runs = {r.workflow_id: r for r in recorded_runs(client)}
    assert set(runs) == {"o-done", "o-wait", "b-1", "f-1", "f-1.leaf", "s-1"}
    return runs


@pytest.mark.parametrize("change", sorted(versions.BREAKING))
def test_every_seeded_breaking_change_is_caught_where_it_breaks(
    recorded: dict[str, RecordedRun], change: str,
) -> None:
    code = versions.BREAKING[change]()
    verdicts = {wid: check_run(code, run) for wid, run in recorded.items()}
    diverged = {wid: v.position for wid, v in verdicts.items() if not v.ok}
    assert diverged == EXPECTED[change], {w: v.reason for w, v in verdicts.items()}
    for wid in diverged:
        assert verdicts[wid].reason, "a divergence says what differs"


@pytest.mark.parametrize("change", sorted(versions.SAFE))
def test_a_change_that_keeps_histories_valid_reports_nothing(
    recorded: dict[str, RecordedRun], change: str,
) -> None:
    code = versions.SAFE[change]()
    failed = {wid: v.reason for wid, run in recorded.items()
              if not (v := check_run(code, run)).ok}
    assert failed == {}


def test_the_command_passes_v1_and_fails_a_breaking_change_naming_the_first_difference(
    recorded: dict[str, RecordedRun], shard_map: ShardMap,
) -> None:
    shards = ",".join(s.url for s in shard_map.shards)
    before = _written(shard_map)
    same = run_cli("--shards", shards, "replay", "--app", APP + "v1")
    assert same.returncode == 0, same.stderr
    assert "replayed 6 run(s): 6 passed, 0 diverged" in same.stdout
    broken = run_cli("--shards", shards, "--json", "replay", "--app", APP + "steps_reordered")
    assert broken.returncode == 10, broken.stderr
    report = json.loads(broken.stdout)
    assert (report["runs"], report["diverged"]) == (6, 2)
    by_id = {d["workflow_id"]: d for d in report["divergent"]}
    assert set(by_id) == {"o-done", "o-wait"}
    assert by_id["o-done"]["position"] == 0
    assert by_id["o-done"]["recorded"] == "step 'charge'"
    assert by_id["o-done"]["called"] == "step 'ship'"
    # Filters: only completed orders, then a window that holds nothing.
    some = run_cli("--shards", shards, "--json", "replay", "--app", APP + "steps_reordered",
                   "--workflow", "order", "--state", "completed")
    assert (some.returncode, json.loads(some.stdout)["runs"]) == (10, 1)
    none = run_cli("--shards", shards, "--json", "replay", "--app", APP + "steps_reordered",
                   "--since", "2999-01-01T00:00:00Z")
    assert (none.returncode, json.loads(none.stdout)["runs"]) == (0, 0)
    capped = run_cli("--shards", shards, "--json", "replay", "--app", APP + "v1", "--limit", "2")
    assert json.loads(capped.stdout)["runs"] == 2
    assert _written(shard_map) == before, "replay wrote to a shard"


def test_an_exported_history_replays_from_its_file_without_any_shard(
    recorded: dict[str, RecordedRun], shard_map: ShardMap, tmp_path: Path,
) -> None:
    shards = ",".join(s.url for s in shard_map.shards)
    run = recorded["o-done"]
    out = tmp_path / "o-done.json"
    made = run_cli("--shards", shards, "history", "export", str(run.execution_id), "-o", str(out))
    assert made.returncode == 0, made.stderr
    document = json.loads(out.read_text())
    assert document["workflow_id"] == "o-done"
    assert [e["kind"] for e in document["events"] if e["position"] is not None][:2] == [
        "step.completed", "sleep.started"]
    printed = run_cli("--shards", shards, "history", "export", str(run.execution_id))
    assert json.loads(printed.stdout) == document
    unwritable = run_cli("--shards", shards, "history", "export", str(run.execution_id),
                         "-o", str(tmp_path / "absent" / "x.json"))
    assert unwritable.returncode == 2 and "cannot write it" in unwritable.stderr
    # No --shards: the files are all it reads.
    passed = run_cli("replay", "--app", APP + "v1", "--file", str(tmp_path))
    assert passed.returncode == 0, passed.stderr
    assert "replayed 1 run(s): 1 passed" in passed.stdout
    failed = run_cli("replay", "--app", APP + "steps_reordered", "--file", str(out))
    assert failed.returncode == 10
    assert "DIVERGED" in failed.stdout and "position 0" in failed.stdout


def _hostile_files(tmp_path: Path) -> dict[str, Path]:
    good = {"shardq_history": 1, "execution_id": "0190c2a0-0000-7000-8000-000000000001",
            "tenant": "default", "workflow": "order", "workflow_version": 1,
            "workflow_id": "o", "state": "completed", "input": {}, "events": []}
    docs: dict[str, Any] = {
        "not_json": "{", "nan": '{"shardq_history": NaN}', "a_list": "[]",
        "other_format": json.dumps({**good, "shardq_history": 2}),
        "events_not_a_list": json.dumps({**good, "events": {}}),
        "bad_uuid": json.dumps({**good, "execution_id": "nope"}),
        "nul_in_workflow": json.dumps({**good, "workflow": "or\u0000der"}),
        "negative_position": json.dumps({**good, "events": [
            {"seq": 1, "position": -1, "kind": "step.completed", "name": "a", "payload": {}}]}),
        "payload_not_object": json.dumps({**good, "events": [
            {"seq": 1, "position": 0, "kind": "step.completed", "name": "a", "payload": 1}]}),
        "naive_time": json.dumps({**good, "created_at": "2026-01-01T00:00:00"}),
        **{f"children_started_{name}": json.dumps({**good, "events": [
            {"seq": 1, "position": position, "kind": "children.started", "name": "children",
             "payload": payload}]}) for name, position, payload in [
                ("no_position", None, {"child": ["c"], "workflow": ["w"],
                                       "workflow_id": ["i"], "policy": ["cancel"]}),
                ("no_lists", 0, {}),
                ("uneven", 0, {"child": ["c", "d"], "workflow": ["w"],
                               "workflow_id": ["i"], "policy": ["cancel"]}),
                ("not_text", 0, {"child": [1], "workflow": ["w"], "workflow_id": ["i"],
                                 "policy": ["cancel"]})]},
    }
    paths = {}
    for name, text in docs.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(text)
    paths["not_utf8"] = tmp_path / "latin.json"
    paths["not_utf8"].write_bytes(b'{"\xff": 1}')
    paths["missing"] = tmp_path / "absent.json"
    return paths


HOSTILE_ARGS = [
    (["--since", "yesterday"], "not an ISO 8601 time"),
    (["--since", "2026-01-01T00:00:00"], "has no offset"),
    (["--state", "sleeping"], "sleeping"),
    (["--limit", "0"], "0"),
    (["--show", "-1"], "-1"),
]


@pytest.mark.parametrize(("args", "says"), HOSTILE_ARGS, ids=[a[0][0] + "=" + a[0][1]
                                                               for a in HOSTILE_ARGS])
def test_hostile_options_are_refused_in_one_line(args: list[str], says: str) -> None:
    done = run_cli("replay", "--app", APP + "v1", *args)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def test_hostile_files_and_apps_are_refused_in_one_line(tmp_path: Path) -> None:
    for name, path in _hostile_files(tmp_path).items():
        done = run_cli("replay", "--app", APP + "v1", "--file", str(path))
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        line, = done.stderr.strip().splitlines()
        assert str(path) in line and "Traceback" not in line, (name, line)
    no_app = run_cli("replay", "--file", str(tmp_path / "absent.json"))
    assert no_app.returncode == 2 and "Traceback" not in no_app.stderr
    bad_app = run_cli("replay", "--app", "shardq.tests.nowhere:v1", "--file", str(tmp_path))
    assert bad_app.returncode == 2 and "Traceback" not in bad_app.stderr


def test_hostile_exports_are_refused_in_one_line(shard_map: ShardMap, tmp_path: Path) -> None:
    shards = ",".join(s.url for s in shard_map.shards)
    absent = str(new_execution_id(0))
    cases = [
        (["not-an-id"], 2),
        ([absent], 7),  # no such run
        ([absent, "--tenant", ""], 7),
        ([absent, "-o", str(tmp_path)], 2),  # a directory
    ]
    for args, code in cases:
        done = run_cli("--shards", shards, "history", "export", *args)
        assert done.returncode == code, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def _written(shard_map: ShardMap) -> list[tuple[Any, ...]]:
    """What a write would change: every table's row count and the history's last seq."""
    return [rows(s.url, "SELECT (SELECT count(*) FROM shardq.executions), "
                 "(SELECT max(seq) FROM shardq.history), (SELECT count(*) FROM shardq.tasks), "
                 "(SELECT count(*) FROM shardq.signals), (SELECT count(*) FROM shardq.outbox), "
                 "(SELECT count(*) FROM shardq.waits)")[0] for s in shard_map.shards]


def test_a_registry_module_attribute_is_what_app_points_at() -> None:
    """The --app targets the tests above use exist and are registries."""
    for name in ("v1", "steps_reordered", "patched", "deprecated"):
        assert isinstance(getattr(versions, name), Registry)
