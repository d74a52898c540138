"""`python -m shardq.benchmarks.ab`: two revisions measured in alternated rounds.

Bad input is one line and exit code 2; the working tree is copied without
touching the checkout's index or stashes; the summary's ranges, ratios and noise
flags; and (slow) one tiny real run of both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardq.benchmarks.ab import (
    export_commit,
    export_worktree,
    numbers,
    prepare_tree,
    schedule,
    summarize,
)

from ..conftest import Server
from ..support import ROOT


def _ab(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardq.benchmarks.ab", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize(("args", "says"), [
    (["no-such-revision-xyz"], "unknown revision 'no-such-revision-xyz'"),
    (["HEAD", "0123456789abcdef0123456789abcdef01234567"], "unknown revision '0123456789"),
    # After `--`, the suite's own arguments: a name there is one of its scenarios.
    (["HEAD", "HEAD", "--", "HEAD"], "has no scenario HEAD"),
    (["HEAD", "--rounds", "0"], "--rounds: expected an integer >= 1, got '0'"),
    (["HEAD", "--rounds", "-3"], "--rounds: expected an integer >= 1, got '-3'"),
    (["HEAD", "--rounds", "two"], "--rounds: expected an integer >= 1, got 'two'"),
    (["HEAD", "--rounds", "1.5"], "--rounds: expected an integer >= 1, got '1.5'"),
    (["HEAD", "HEAD", "--scenario", "durable,bogus"], "has no scenario bogus"),
    (["HEAD", "HEAD", "--scenario", ","], "--scenario: expected at least one name"),
    (["HEAD", "HEAD", "--", "--no-such-option"], "refuses the arguments: unrecognized"),
    (["HEAD", "HEAD", "--", "--shards", "postgresql://x/y"], "--shards is not for ab"),
    ([], "required: BASE"),
])
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], says: str) -> None:
    done = _ab(*args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("python -m shardq.benchmarks.ab: error: ")
    assert says in lines[0]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def test_the_working_tree_is_copied_as_it_is_and_the_checkout_left_alone(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "kept.py").write_text("v1\n")
    (repo / "edited.py").write_text("v1\n")
    (repo / "gone.py").write_text("v1\n")
    (repo / ".pkgroot").mkdir()
    (repo / ".pkgroot" / "shardq").symlink_to("..")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    (repo / "edited.py").write_text("v2, uncommitted\n")
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("untracked\n")
    (repo / "ignored.txt").write_text("ignored\n")
    (repo / "staged.py").write_text("staged\n")
    _git(repo, "add", "staged.py")
    index = (repo / ".git" / "index").read_bytes()

    tree = tmp_path / "tree"
    changed = export_worktree(repo, tree)
    prepare_tree(tree)

    assert (tree / "edited.py").read_text() == "v2, uncommitted\n"
    assert (tree / "new.py").read_text() == "untracked\n"
    assert (tree / "staged.py").is_file()
    assert not (tree / "gone.py").exists()
    assert not (tree / "ignored.txt").exists()
    assert os.readlink(tree / ".pkgroot" / "shardq") == ".."
    assert (tree / "__init__.py").is_file()
    assert changed == ["edited.py", "gone.py", "new.py"]
    # Read only: the index byte for byte, no stash, the edits still there.
    assert (repo / ".git" / "index").read_bytes() == index
    assert _git(repo, "stash", "list") == ""
    assert (repo / "edited.py").read_text() == "v2, uncommitted\n"

    committed = tmp_path / "committed"
    export_commit(repo, _git(repo, "rev-parse", "HEAD").strip(), committed)
    assert (committed / "edited.py").read_text() == "v1\n"
    assert (committed / "gone.py").is_file()
    assert os.readlink(committed / ".pkgroot" / "shardq") == ".."


def test_rounds_alternate() -> None:
    assert schedule(3, "ab") == [0, 1, 0, 1, 0, 1]
    assert schedule(3, "abba") == [0, 1, 1, 0, 0, 1]


def test_numbers_keep_the_suites_names() -> None:
    headline = {"drain_jobs_per_s": 100.5, "floor_batch": 100, "floor_by_batch": {"100": 7.0},
                "targets": [1], "flag": True, "note": "x", "missing": None}
    assert numbers(headline) == {"drain_jobs_per_s": 100.5, "floor_batch": 100,
                                 "floor_by_batch.100": 7.0}


def test_summary_medians_ranges_ratio_and_noise() -> None:
    rounds = [
        {"side": "base", "numbers": {"a": 100.0, "b": 10.0, "only_base": 1.0}},
        {"side": "head", "numbers": {"a": 150.0, "b": 11.0}},
        {"side": "head", "numbers": {"a": 160.0, "b": 9.0}},
        {"side": "base", "numbers": {"a": 110.0, "b": 12.0}},
    ]
    keys = summarize(rounds)
    assert list(keys) == ["a", "b", "only_base"]
    a = keys["a"]
    assert (a["base"]["median"], a["base"]["min"], a["base"]["max"]) == (105.0, 100.0, 110.0)
    assert (a["head"]["median"], a["head"]["min"], a["head"]["max"]) == (155.0, 150.0, 160.0)
    assert a["ratio"] == pytest.approx(155 / 105, abs=0.001)
    assert a["within_noise"] is False
    assert keys["b"]["within_noise"] is True  # 10..12 against 9..11
    assert keys["only_base"]["head"] is None
    assert keys["only_base"]["ratio"] is None


@pytest.mark.slow
def test_a_tiny_real_run_alternates_both_sides(pg_server: Server) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env["SHARDQ_BENCH_DSN"] = pg_server.admin_dsn
    done = _ab("HEAD", "HEAD", "--rounds", "1", "--scenario", "durable", "--json", "--",
               "--quick", "-n", "200", "--workers", "1", "--batch-size", "10",
               env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["sequence"] == "A B"
    assert [(r["side"], r["exit_code"]) for r in doc["rounds"]] == [("base", 0), ("head", 0)]
    assert doc["base"]["commit"] == doc["head"]["commit"]
    # Each side ran the suite of its own exported tree: the same source, the same digest.
    assert doc["base"]["engine_fingerprint"] == doc["head"]["engine_fingerprint"] is not None
    entry = doc["keys"]["durable_floor_jobs_per_s"]
    assert entry["base"]["n"] == entry["head"]["n"] == 1
    assert entry["ratio"] > 0
