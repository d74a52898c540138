"""Every named query is used by code, and every use names a query that exists.

The product's query files are found by glob (every `queries.sql` of the folders the
wheel ships), and their uses in all of the product's code: a module that loads a file
(`SQL = load_queries("shardq.moves", "queries.sql")`) uses it through that name, and
so does a module that imports the name (`from shardq.store.statements import SQL as
QUEUE_SQL`), so a statement one folder runs from another's file counts as used.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from shardq.shards.sqlfile import load_queries

from ..support import ROOT, product_folders, query_files

BENCHMARK_RUNNERS = {"query": 1, "total": 0, "each": 0}
"""The benchmarks' helpers that run a statement by name (benchmarks/db.py): the
position of the name among their arguments (`query(url, name)`,
`poller.total(name)`, `poller.each(name)`)."""

QueryFile = tuple[str, str]
"""(package, file name), as load_queries takes them."""


def _module(path: Path) -> str:
    return ".".join(("shardq", *path.relative_to(ROOT).with_suffix("").parts))


def _loaded(tree: ast.Module) -> dict[str, QueryFile]:
    """The module-level names a module binds to a query file it loads."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and _callee(node.value) == "load_queries" \
                and all(isinstance(a, ast.Constant) for a in node.value.args):
            package, name = (str(a.value) for a in node.value.args if isinstance(a, ast.Constant))
            found.update({t.id: (package, name) for t in node.targets if isinstance(t, ast.Name)})
    return found


def _bindings(trees: dict[str, ast.Module]) -> dict[str, dict[str, QueryFile]]:
    """Per module, each name it uses a query file through: loaded, or imported."""
    loaded = {module: _loaded(tree) for module, tree in trees.items()}
    bound = {}
    for module, tree in trees.items():
        names = dict(loaded[module])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in loaded:
                names.update({alias.asname or alias.name: loaded[node.module][alias.name]
                              for alias in node.names if alias.name in loaded[node.module]})
        bound[module] = names
    return bound


def _names_used(paths: list[Path], runners: dict[str, int] | None = None,
                runs: QueryFile | None = None) -> tuple[dict[QueryFile, set[str]], list[str]]:
    """The statement names the code uses literally, per query file, and the places it
    passes one it computed (which this test could not check) outside the runners' own
    bodies. `runners`: helpers that run a statement of the file `runs` by name."""
    trees = {_module(p): ast.parse(p.read_text()) for p in paths}
    bindings = _bindings(trees)
    used: dict[QueryFile, set[str]] = {}
    unchecked: list[str] = []
    for path in paths:
        tree, names = trees[_module(path)], bindings[_module(path)]
        runner_bodies = {
            id(inner) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name in (runners or {})
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            name: ast.expr
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and node.value.id in names:
                file, name = names[node.value.id], node.slice
            elif runners and runs and isinstance(node, ast.Call) \
                    and (at := runners.get(_callee(node), -1)) >= 0 and len(node.args) > at:
                file, name = runs, node.args[at]
            else:
                continue
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                used.setdefault(file, set()).add(name.value)
            elif id(node) not in runner_bodies:
                unchecked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return used, unchecked


def _callee(call: ast.Call) -> str:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return ""


@functools.cache
def _product_uses() -> tuple[dict[QueryFile, set[str]], list[str]]:
    return _names_used(sorted(p for folder in product_folders() for p in folder.rglob("*.py")))


def _query_file(path: Path) -> QueryFile:
    return ".".join(("shardq", *path.parent.relative_to(ROOT).parts)), path.name


def test_the_glob_finds_every_folder_s_query_file() -> None:
    assert {p.parent.name for p in query_files()} >= {"store", "shards", "outbox", "moves"}


def test_no_statement_is_named_by_a_computed_value() -> None:
    _used, unchecked = _product_uses()
    assert unchecked == [], "a statement named by a computed value cannot be checked here"


@pytest.mark.parametrize("path", query_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_queries_and_their_uses_match(path: Path) -> None:
    package, file = _query_file(path)
    defined = set(load_queries(package, file))
    used = _product_uses()[0].get((package, file), set())
    assert used - defined == set(), "code names queries the .sql file lacks"
    assert defined - used == set(), "the .sql file has queries no code runs"


def test_every_query_file_the_code_loads_is_one_the_glob_finds() -> None:
    loaded = set(_product_uses()[0])
    assert loaded <= {_query_file(p) for p in query_files()}


def test_benchmark_queries_and_their_uses_match() -> None:
    """The benchmarks are a checkout's tool, not the product: their own file, and the
    helpers of benchmarks/db.py that run a statement by name."""
    own = ("shardq.benchmarks", "queries.sql")
    used, unchecked = _names_used(sorted(ROOT.glob("benchmarks/*.py")), BENCHMARK_RUNNERS, own)
    assert unchecked == [], "a statement named by a computed value cannot be checked here"
    defined = set(load_queries(*own))
    benchmark_uses = used.get(own, set())
    assert benchmark_uses - defined == set(), "code names queries the .sql file lacks"
    assert defined - benchmark_uses == set(), "the .sql file has queries no code runs"
