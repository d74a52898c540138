"""The newcomer's path: `shardq dev`, the demo twice, then the README's own-module worker
(README, "An example"; docs/tutorial.md goes on from it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from shardq.client.client import Client
from shardq.shards.config import ShardMap
from shardq.workflow.registry import Registry

from ..support import ROOT, wait_until

MYAPP = '''\
from shardq.workflow.registry import Registry

registry = Registry()


def greet(name):
    return f"hello, {name}"


@registry.workflow("greet")
def greet_workflow(ctx):
    return ctx.step("greet", greet, ctx.input["name"])
'''
"""The README's own module (its "An example" section), word for word."""

SHARDQ = Path(sys.executable).with_name("shardq")
"""The console script, as a user runs it: from their own folder, not the repository."""


def test_dev_server_demo_twice_and_a_worker_for_my_module(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    state = ["--state-file", str(tmp_path / "dev.json")]
    dev = subprocess.Popen(
        [sys.executable, "-m", "shardq.bin.cli", "dev", *state], env=env, cwd=ROOT,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    worker = None
    try:
        assert dev.stdout is not None
        export = next((line for line in dev.stdout if line.startswith("export ")), "")
        assert export.startswith("export SHARDQ_SHARDS='"), dev.stderr and dev.stderr.read()
        env["SHARDQ_SHARDS"] = shards = export.strip().split("'")[1]

        for _ in range(2):  # the second run used to wait 30 s on the first run's finished key
            demo = subprocess.run([sys.executable, "-m", "shardq.bin.demo"], env=env, cwd=ROOT,
                                  capture_output=True, text=True, timeout=60, check=False)
            assert demo.returncode == 0, demo.stdout + demo.stderr
            assert "demo finished" in demo.stdout

        (tmp_path / "myapp.py").write_text(MYAPP)
        app = ["--app", "myapp:registry"]
        with (tmp_path / "worker.err").open("wb") as err:
            worker = subprocess.Popen([SHARDQ, "worker", *app], env=env, cwd=tmp_path,
                                      stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        started = subprocess.run(
            [SHARDQ, "workflow", "start", "greet", "first", "--input", '{"name": "Ada"}', *app,
             "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30,
            check=False,
        )
        assert started.returncode == 0, started.stderr
        run = json.loads(started.stdout)["execution_id"]
        with Client.connect(ShardMap.from_env(env), Registry()) as client:
            wait_until(lambda: client.get(run).state.terminal, timeout=30,
                       what="the greet run to finish")
            done = client.get(run)
        assert done.output == "hello, Ada", (tmp_path / "worker.err").read_text()
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        stop = subprocess.run([sys.executable, "-m", "shardq.bin.cli", "dev", *state, "stop"],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                              check=False)
        code = dev.wait(30)
    assert stop.returncode == 0, stop.stderr
    assert code == 0
    folder = shards.split("host=")[1].split("&")[0]
    assert not Path(folder).exists(), "the dev server's data outlived it"
