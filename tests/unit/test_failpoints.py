"""Failpoints: one variable, one format, and every point listed is one the code marks."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys

import pytest

from shardq.shards.failpoints import FAILPOINT_ENV, POINTS, failpoint, parse

from ..support import ROOT, product_folders

PROBE = ("from shardq.shards.failpoints import failpoint\n"
         "failpoint('move.copy', 1)\n"
         "print('alive')\n")


def _run_probe(value: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != FAILPOINT_ENV}
    return subprocess.run([sys.executable, "-c", PROBE], env={**env, FAILPOINT_ENV: value},
                          cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)


def test_a_process_is_killed_at_the_point_and_number_named_and_only_there() -> None:
    assert _run_probe("move.copy@1").returncode == -signal.SIGKILL
    passed = _run_probe("move.copy")  # batch 0
    assert (passed.returncode, passed.stdout) == (0, "alive\n"), passed.stderr
    assert _run_probe("move.switch@1").stdout == "alive\n"


@pytest.mark.parametrize(("value", "parsed"), [
    ("relay.after_deliver", ("relay.after_deliver", 0)),
    ("move.copy@3", ("move.copy", 3)),
    ("move.plan@0", ("move.plan", 0)),
])
def test_the_format_is_a_point_and_an_optional_number(value: str,
                                                      parsed: tuple[str, int]) -> None:
    assert parse(value) == parsed


@pytest.mark.parametrize("value", ["copy@1", "after_deliver", "move.copy@x", "move.copy@"])
def test_a_misspelt_value_raises_rather_than_never_firing(value: str) -> None:
    with pytest.raises(ValueError, match=FAILPOINT_ENV):
        parse(value)


def test_a_point_the_list_lacks_is_refused_in_the_code() -> None:
    with pytest.raises(ValueError, match="POINTS"):
        failpoint("move.nowhere")


def test_every_listed_point_is_marked_once_in_the_product() -> None:
    marked: list[str] = []
    for path in sorted(p for folder in product_folders() for p in folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "failpoint" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                marked.append(str(node.args[0].value))
    assert sorted(marked) == sorted(POINTS)
