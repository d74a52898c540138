"""The product's layout holds: each folder imports only the layers beneath it, no module
outgrows a reader, psycopg stays in the store and pool layers, and every name the
README, the docs and the examples tell users to import is importable where they say.

docs/concepts.md ("The layers") says what each folder holds and why the arrows point
where they do; tests/unit/test_import_cycles.py guards cycles between modules.
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [f for f in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]
           ["build"]["targets"]["wheel"]["only-include"] if (ROOT / f).is_dir()
           and any((ROOT / f).rglob("*.py"))]

MAY_IMPORT: dict[str, set[str]] = {
    "shards": set(),
    "core": {"shards"},
    "workflow": {"core", "shards"},
    "store": {"core", "shards"},
    "worker": {"workflow", "store", "core", "shards"},
    "client": {"workflow", "store", "core", "shards"},
    "outbox": {"store", "core", "shards"},
    "moves": {"store", "core", "shards"},
    "bin": {"client", "worker", "outbox", "moves", "workflow", "store", "core", "shards"},
    "examples": {"client", "workflow", "core", "shards", "bin"},
}
"""Folder -> the folders it may import (beside itself). An arrow not listed is a layer
reaching sideways or up: put the shared thing beneath both instead."""

MAX_LINES = 600

PSYCOPG_AT = {"store", "shards", "moves"}
"""The layers that talk to PostgreSQL: the store and the pools, and the mover's store;
and, in any folder, its own `store.py` (the outbox's)."""


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_every_product_folder_has_its_arrows_written_down() -> None:
    assert sorted(PRODUCT) == sorted(MAY_IMPORT)


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_a_folder_imports_only_the_layers_beneath_it(folder: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} -> shardq.{layer}"
        for path in modules(folder) for name in imported(path)
        if name.startswith("shardq.")
        and (layer := name.split(".")[1]) != folder and layer not in MAY_IMPORT[folder]
        and layer in MAY_IMPORT
    }
    assert not wrong, sorted(wrong)


def test_no_module_is_over_the_line_budget() -> None:
    long = {str(p.relative_to(ROOT)): n for f in PRODUCT for p in modules(f)
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_psycopg_is_imported_only_by_the_store_and_pool_layers() -> None:
    found = {str(p.relative_to(ROOT)) for f in PRODUCT if f not in PSYCOPG_AT
             for p in modules(f) if p.name != "store.py"
             and {n.split(".")[0] for n in imported(p)} & {"psycopg", "psycopg_pool"}}
    assert not found, f"psycopg above the store (let the store map its errors): {sorted(found)}"


USER_TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
              *sorted((ROOT / "examples").glob("*.py"))]
IMPORT = re.compile(r"^\s*from (shardq(?:\.\w+)+) import \(?([\w, \n]+?)\)?\s*$", re.M)
TARGET = re.compile(r"\b(shardq(?:\.\w+)+):(\w+)\b")


def user_imports() -> list[tuple[str, str, str]]:
    """(where, module, name) for every `from shardq... import name` and `module:attr`
    a user is shown."""
    found = []
    for path in USER_TEXTS:
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        for match in IMPORT.finditer(text):
            for name in re.split(r"[,\s]+", match.group(2)):
                if name:
                    found.append((where, match.group(1), name))
        found += [(where, m.group(1), m.group(2)) for m in TARGET.finditer(text)]
    return found


PINNED = [
    ("shardq.client.client", "Client"), ("shardq.client.async_client", "AsyncClient"),
    ("shardq.workflow.registry", "Registry"), ("shardq.workflow.context", "WorkflowContext"),
    ("shardq.workflow.builder", "Workflow"), ("shardq.workflow.retry", "RetryPolicy"),
    ("shardq.workflow.contracts", "SignalSpec"), ("shardq.workflow.contracts", "query"),
    ("shardq.workflow.contracts", "update"), ("shardq.worker.worker", "Worker"),
    ("shardq.worker.config", "WorkerConfig"), ("shardq.core.models", "SignalRequest"),
    ("shardq.core.models", "State"), ("shardq.core.rules", "Limits"),
    ("shardq.core.errors", "ShardqError"), ("shardq.shards.config", "ShardMap"),
    ("shardq.shards.migrations", "migrate"), ("shardq.client.coalesce", "SignalCoalescer"),
]
"""The names every guide leans on, pinned even if no page happened to show them."""


def test_the_scan_finds_the_guides_imports() -> None:
    assert len(user_imports()) > 20


@pytest.mark.parametrize(("module", "name"), sorted(
    {(m, n) for _, m, n in user_imports()} | set(PINNED)))
def test_what_users_are_told_to_import_is_importable(module: str, name: str) -> None:
    found: object
    try:
        found = importlib.import_module(f"{module}.{name}")
    except ImportError:
        found = getattr(importlib.import_module(module), name, None)
    assert found is not None, f"{module} has no {name} (shown in: " + ", ".join(
        sorted({w for w, m, n in user_imports() if (m, n) == (module, name)})) + ")"
