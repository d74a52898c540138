"""The tests run their own app (tests/app.py), not the demo's (bin/examples.py): the demo
may change, and what the tests check must not change with it. So no file under tests/
imports or names the demo's module, except where the demo is what is being tested."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..support import ROOT

DEMO = re.compile(r"bin(?:\.|/|\s+import\s+)examples\b")
"""`shardq.bin.examples`, `bin/examples.py`, `from shardq.bin import examples`."""

WHOLE_FILE = None
ALLOWED: dict[str, tuple[str | None, str]] = {
    "tests/unit/test_own_app.py": (
        WHOLE_FILE, "this test: it names what it looks for"),
    "tests/unit/test_bin_layout.py": (
        "test_neither_front_end_imports_the_demo_or_its_examples",
        "its subject is bin/'s layout: the CLI and the web layer never import the demo's "
        "module, which it has to name"),
    "tests/acceptance/test_webhook_example.py": (
        WHOLE_FILE,
        "its subject is examples/payment_webhook.py, which starts and signals the demo's "
        "`checkout`: its worker has to run that same registry"),
    "tests/acceptance/test_outbox_faults.py": (
        "test_the_tenant_cancel_example_fans_out_over_three_shards",
        "its subject is the demo's `tenant_cancel` example (docs/workflows.md shows it)"),
}
"""File: (the function the demo may be named in, or WHOLE_FILE; why)."""


def _mentions(path: Path) -> list[int]:
    """The lines of `path` that name the demo's module."""
    return [n for n, line in enumerate(path.read_text().splitlines(), 1) if DEMO.search(line)]


def _lines_of(path: Path, function: str) -> range:
    tree = ast.parse(path.read_text())
    (node,) = [n for n in ast.walk(tree)
               if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == function]
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def test_no_test_uses_the_demo_s_app_but_those_about_the_demo() -> None:
    stray: list[str] = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        lines = _mentions(path)
        if name not in ALLOWED:
            stray += [f"{name}:{n}" for n in lines]
            continue
        function, _ = ALLOWED[name]
        if function is not WHOLE_FILE:
            inside = _lines_of(path, function)
            stray += [f"{name}:{n} (outside {function})" for n in lines if n not in inside]
    assert not stray, (
        "these name the demo's app (shardq.bin.examples); tests use tests/app.py "
        "(`from ..app import registry`, `--app shardq.tests.app:registry`) unless the demo "
        "is their subject (then add the file to ALLOWED, saying why):\n" + "\n".join(stray))


def test_every_allowed_file_still_names_the_demo() -> None:
    """An entry left behind after its file stopped using the demo would let the next
    use through unseen."""
    for name in ALLOWED:
        assert _mentions(ROOT / name), f"{name} no longer names the demo: drop it from ALLOWED"


def test_the_tests_app_is_importable_under_the_name_daemons_are_given() -> None:
    import importlib

    app = importlib.import_module("shardq.tests.app")
    assert {"park", "noop", "checkout", "cart", "proposal_review"} <= set(app.registry.names())
