"""bin/'s rooms: the CLI (bin/cli/) may import the web layer (bin/web/) to serve, never
the other way round; neither imports the demo or its examples; `shardq --help` loads
no command's body (each imports what it needs when it runs)."""

from __future__ import annotations

import ast
import subprocess
import sys

from ..support import ROOT


def _imported(folder: str) -> dict[str, set[str]]:
    """Each module under bin/`folder`: the shardq modules it imports, lazily too."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "bin" / folder).rglob("*.py")):
        names = found.setdefault(path.relative_to(ROOT).as_posix(), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_the_web_layer_never_imports_the_cli() -> None:
    for module, names in _imported("web").items():
        assert not {n for n in names if n.startswith("shardq.bin.cli")}, module


def test_neither_front_end_imports_the_demo_or_its_examples() -> None:
    apart = ("shardq.bin.demo", "shardq.bin.examples")
    for folder in ("cli", "web"):
        for module, names in _imported(folder).items():
            assert not {n for n in names if n.startswith(apart)}, module


def test_help_loads_no_command_body() -> None:
    probe = ("import sys; from shardq.bin.cli.main import cli; "
             "print(*sorted(sys.modules), sep='\\n')")
    loaded = set(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.split())
    heavy = {"starlette", "uvicorn", "jinja2", "prometheus_client", "psycopg_pool",
             "shardq.bin.web.app", "shardq.client.client", "shardq.store.store",
             "shardq.worker.worker", "shardq.shards.embedded"}
    assert not loaded & heavy
