"""No import cycles among the product's modules, and no migrator in a client or a worker.

The graph is read from the source with `ast`, every import counted wherever it stands:
at the top, in a function, under TYPE_CHECKING. An import moved into a function still
makes its module lean on the other one; it hides a cycle from Python's loader, it does
not break it. The product is what the wheel ships (pyproject.toml's
[tool.hatch.build.targets.wheel] only-include), each file `shardq.<folder>.<module>`.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from ..support import ROOT

# The module that applies schema/ to the shards: only the commands that migrate or
# change the map load it; a client or a worker checks shards (shards/check.py).
MIGRATOR = "shardq.shards.migrations"


def product_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module the wheel ships, by its import name."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]
    modules: dict[str, Path] = {}
    for folder in shipped:
        if not (root / folder).is_dir():
            continue  # py.typed
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(("shardq", *parts))] = path
    return modules


def _imported(module: str, tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """The product modules `module` imports anywhere in `tree`. `from a import b` names
    module a.b when there is one (a folder has no __init__.py to hold b), else a."""
    package = module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                found.add(whole if whole in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each product module: the product modules it imports."""
    return {
        name: _imported(name, ast.parse(path.read_text(encoding="utf-8"), str(path)), modules)
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as the modules along it, the first repeated at the end;
    None when there is none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: dict[str, int] = {}

    def visit(name: str) -> list[str] | None:
        on_path[name] = len(path)
        path.append(name)
        for target in sorted(graph[name]):
            if target in on_path:
                return [*path[on_path[target]:], target]
            if target not in done:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        del on_path[name]
        done.add(name)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of `graph` until none is left, each found with the closing import of those
    before it taken out: every tangle is named, one cycle at least for each."""
    rest = {name: set(targets) for name, targets in graph.items()}
    cycles: list[list[str]] = []
    while (cycle := find_cycle(rest)) is not None:
        cycles.append(cycle)
        rest[cycle[-2]].discard(cycle[-1])
    return cycles


def chain_to(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports by which loading `start` loads `goal`, or None."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(graph[name]):
                if target == start or target in came_from:
                    continue
                came_from[target] = name
                if target == goal:
                    chain = [goal]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return chain[::-1]
                following.append(target)
        frontier = following
    return None


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """A function-level import, TYPE_CHECKING, a module named as `from folder import
    module`, and a relative import are all edges."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.hatch.build.targets.wheel]\nonly-include = ["a", "b", "py.typed"]\n')
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "one.py").write_text("def f():\n    from shardq.b import two\n")
    (tmp_path / "b" / "two.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from shardq.b.three import X\n")
    (tmp_path / "b" / "three.py").write_text("from .four import Y\n")
    (tmp_path / "b" / "four.py").write_text("import shardq.a.one\n")
    graph = import_graph(product_modules(tmp_path))
    assert graph == {
        "shardq.a.one": {"shardq.b.two"},
        "shardq.b.two": {"shardq.b.three"},
        "shardq.b.three": {"shardq.b.four"},
        "shardq.b.four": {"shardq.a.one"},
    }
    assert find_cycle(graph) == ["shardq.a.one", "shardq.b.two", "shardq.b.three",
                                 "shardq.b.four", "shardq.a.one"]
    assert chain_to(graph, "shardq.b.two", "shardq.a.one") == [
        "shardq.b.two", "shardq.b.three", "shardq.b.four", "shardq.a.one"]
    graph["shardq.b.four"] = set()
    assert find_cycle(graph) is None
    assert chain_to(graph, "shardq.b.two", "shardq.a.one") is None


def test_no_import_cycles() -> None:
    modules = product_modules()
    assert MIGRATOR in modules, "the migrator moved: say where in MIGRATOR"
    cycles = all_cycles(import_graph(modules))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_clients_and_workers_never_load_the_migrator() -> None:
    modules = product_modules()
    graph = import_graph(modules)
    for name in sorted(modules):
        if name.startswith(("shardq.client.", "shardq.worker.")):
            chain = chain_to(graph, name, MIGRATOR)
            assert chain is None, "loads the migrator: " + " -> ".join(chain or [])
