"""A bad shard map on the command line: one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.workflow.registry import Registry

from ..support import Daemon, run_cli


def test_cli_reports_bad_config_in_one_line(tmp_path: Path) -> None:
    result = run_cli("shards", env={"SHARDQ_SHARDS": "postgresql://u:pw@h/db,postgresql://u:pw@h/db"})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("shardq: error: duplicate shard URL")
    missing = run_cli("--shards-file", str(tmp_path / "nope.toml"), "shards")
    assert missing.returncode == 2
    assert "cannot read shards file" in missing.stderr


def test_log_lines_are_json_objects_with_log_format_json(tmp_path: Path) -> None:
    unreachable = "postgresql://postgres@127.0.0.1:1/nowhere"
    relay = Daemon("relay", ["--shards", unreachable, "--log-format", "json", "-v",
                             "outbox-relay"], tmp_path)
    try:
        relay.wait_for("outbox relay serving")
        first = next(line for line in relay.stderr().splitlines() if line.startswith("{"))
        record = json.loads(first)
        assert record["level"] == "error"
        assert record["shard"] == "shard-0"
        assert "unreachable" in record["msg"]
    finally:
        relay.kill()


def test_a_line_about_a_run_names_its_execution_shard_and_workflow(
    shard_map: ShardMap, tmp_path: Path
) -> None:
    elsewhere = Registry()
    elsewhere.register(lambda ctx: None, name="not_in_this_app")
    with Client.connect(shard_map, elsewhere) as client:
        run = client.start("not_in_this_app", "k").execution_id
    urls = ",".join(s.url for s in shard_map.shards)
    worker = Daemon("worker", ["--shards", urls, "--log-format", "json", "worker", "--app",
                               "shardq.tests.app:registry"], tmp_path)
    try:
        worker.wait_for("not registered")
        line = next(json.loads(x) for x in worker.stderr().splitlines()
                    if "not registered" in x)
        assert (line["execution_id"], line["shard"], line["workflow"]) == (
            str(run), shard_map.for_execution(run).name, "not_in_this_app")
    finally:
        worker.kill()
