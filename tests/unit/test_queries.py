"""Every named query is used by its package's code, and every use names a query that exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shardq.shards.sqlfile import load_queries

from ..support import ROOT

BENCHMARK_RUNNERS = {"query": 1, "total": 0, "each": 0}
"""The benchmarks' helpers that run a statement by name (benchmarks/db.py): the
position of the name among their arguments (`query(url, name)`,
`poller.total(name)`, `poller.each(name)`)."""


def _names_used(paths: list[Path], runners: dict[str, int]) -> tuple[set[str], list[str]]:
    """The statement names the code uses literally, and the places it passes one it
    computed (which this test could not check) outside the runners' own bodies."""
    used: set[str] = set()
    unchecked: list[str] = []
    for path in paths:
        tree = ast.parse(path.read_text())
        runner_bodies = {
            id(inner) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name in runners
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and node.value.id == "SQL":
                name: ast.expr | None = node.slice
            elif isinstance(node, ast.Call) and (at := runners.get(_callee(node), -1)) >= 0 \
                    and len(node.args) > at:
                name = node.args[at]
            else:
                continue
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                used.add(name.value)
            elif id(node) not in runner_bodies:
                unchecked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return used, unchecked


def _callee(call: ast.Call) -> str:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return ""


@pytest.mark.parametrize(
    ("package", "sql_file", "code", "runners"),
    [
        ("shardq.store", "queries.sql", ["store/store.py", "store/statements.py"], {}),
        ("shardq.shards", "queries.sql",
         ["shards/*.py"], {}),
        ("shardq.outbox", "queries.sql", ["outbox/store.py"], {}),
        ("shardq.benchmarks", "queries.sql", ["benchmarks/*.py"], BENCHMARK_RUNNERS),
    ],
)
def test_queries_and_their_uses_match(
    package: str, sql_file: str, code: list[str], runners: dict[str, int]
) -> None:
    defined = set(load_queries(package, sql_file))
    paths = sorted(p for pattern in code for p in ROOT.glob(pattern))
    assert paths, code
    used, unchecked = _names_used(paths, runners)
    assert unchecked == [], "a statement named by a computed value cannot be checked here"
    assert used - defined == set(), "code names queries the .sql file lacks"
    assert defined - used == set(), "the .sql file has queries no code runs"
