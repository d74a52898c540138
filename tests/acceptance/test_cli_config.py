"""A bad shard map on the command line: one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from ..support import run_cli


def test_cli_reports_bad_config_in_one_line(tmp_path: Path) -> None:
    result = run_cli("shards", env={"SHARDQ_SHARDS": "postgresql://u:pw@h/db,postgresql://u:pw@h/db"})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("shardq: error: duplicate shard URL")
    missing = run_cli("--shards-file", str(tmp_path / "nope.toml"), "shards")
    assert missing.returncode == 2
    assert "cannot read shards file" in missing.stderr
