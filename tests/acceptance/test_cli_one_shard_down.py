"""Three shards, one refusing connections (the home shard, which holds the map's record,
or another): the read commands an operator runs during the outage show what the two
others hold, name the missing shard in one stderr line and exit 8 (partial), as
`shardq outbox` does (test_cli_unreachable.py); a command about one run on a reachable
shard works as if nothing were down."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate
from shardq.shards.pools import ShardPools
from shardq.store.store import Store
from shardq.worker.config import WorkerConfig
from shardq.worker.worker import Worker

from ..app import registry
from ..conftest import Server
from ..support import allow_connections, key_on, run_cli, wait_until


@dataclass(frozen=True)
class Deployment:
    urls: list[str]
    parked: list[str]
    """Per shard, one run parked on a signal."""
    reviewed: list[str]
    """Per shard, one run waiting for a person's decision."""
    down: int | None = None
    """The index of the shard that refuses connections."""

    @property
    def env(self) -> dict[str, str]:
        return {"SHARDQ_SHARDS": ",".join(self.urls)}

    def up(self, runs: list[str]) -> set[str]:
        return {run for index, run in enumerate(runs) if index != self.down}

    @property
    def up_names(self) -> set[str]:
        return {f"shard-{index}:" for index in range(3) if index != self.down}


@pytest.fixture(scope="module")
def deployment(pg_server: Server) -> Deployment:
    """Three migrated shards with a parked run and a run under review on each."""
    urls = pg_server.create_databases(3, tag="down")
    shard_map = ShardMap.from_urls(urls)
    migrate(shard_map)
    with ShardPools(shard_map) as pools:
        client = Client(Store(pools), registry)
        parked = [str(client.start("park", key_on(shard_map, i, "park", "p")).execution_id)
                  for i in range(3)]
        reviewed = [str(client.start("proposal_review", key_on(
            shard_map, i, "proposal_review", "r"), {"amount": 5}).execution_id)
            for i in range(3)]
        worker = Worker(Store(pools), registry, config=WorkerConfig(
            poll_interval_s=1.0, drain_timeout_s=2.0)).start()
        try:
            for run in parked + reviewed:
                wait_until(lambda run=run: client.get(run).state in (  # type: ignore[misc]
                    State.WAITING, State.INPUT_REQUIRED), timeout=30, what=f"{run} parked")
        finally:
            worker.stop()
    return Deployment(urls, parked, reviewed)


@pytest.fixture(params=[0, 1], ids=["home-shard-down", "shard-1-down"])
def one_down(deployment: Deployment, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    down: int = request.param
    allow_connections([deployment.urls[down]], allowed=False)
    try:
        yield replace(deployment, down=down)
    finally:
        allow_connections([deployment.urls[down]], allowed=True)


def _first_words(stdout: str) -> set[str]:
    return {line.split()[0] for line in stdout.splitlines() if line.strip()}


def _counted_text(stdout: str) -> set[str]:
    """`workflow count`'s table as workflow:state:n for every count that is not 0."""
    header, *rows = stdout.splitlines()
    states = header.split()[1:]
    return {f"{name}:{state}:{n}" for name, *ns in (row.split() for row in rows)
            if name != "(all)" for state, n in zip(states, ns, strict=True) if n != "0"}


def _counted(d: Deployment) -> set[str]:
    return {f"park:waiting:{len(d.up(d.parked))}",
            f"proposal_review:input_required:{len(d.up(d.reviewed))}"}


READS: list[tuple[str, tuple[str, ...], Callable[[Deployment], set[str]],
                  Callable[[str], set[str]], Callable[[dict[str, object]], set[str]]]] = [
    ("stale", ("stale", "--stale-after", "signal=0.001", "--stale-after", "interrupt=0.001"),
     lambda d: d.up(d.parked) | d.up(d.reviewed), _first_words,
     lambda shown: {w["execution_id"] for w in shown["stale"]}),  # type: ignore[attr-defined]
    ("workflow list", ("workflow", "list"),
     lambda d: d.up(d.parked) | d.up(d.reviewed), _first_words,
     lambda shown: {r["id"] for r in shown["items"]}),  # type: ignore[attr-defined]
    ("workflow count", ("workflow", "count"), _counted, _counted_text,
     lambda shown: {f"{w}:{s}:{n}" for w, states in shown["by_workflow"].items()  # type: ignore[attr-defined]
                    for s, n in states.items() if n}),
    ("workflow pending", ("workflow", "pending"),
     lambda d: d.up(d.reviewed),
     lambda out: {line.split()[0] for line in out.splitlines() if not line.startswith(" ")},
     lambda shown: {p["execution_id"] for p in shown["items"]}),  # type: ignore[attr-defined]
    ("purge --dry-run", ("purge", "--app", "shardq.tests.app:registry", "--dry-run"),
     lambda d: d.up_names, _first_words,
     lambda shown: {f"{name}:" for name in shown["runs"]}),  # type: ignore[attr-defined]
]


@pytest.mark.parametrize(("args", "expected", "shown_text", "shown_json"),
                         [read[1:] for read in READS], ids=[read[0] for read in READS])
def test_a_read_of_every_shard_serves_the_reachable_ones_and_names_the_missing_one(
    one_down: Deployment, args: tuple[str, ...], expected: Callable[[Deployment], set[str]],
    shown_text: Callable[[str], set[str]],
    shown_json: Callable[[dict[str, object]], set[str]],
) -> None:
    result = run_cli(*args, env=one_down.env)
    assert result.returncode == 8, result.stderr
    assert shown_text(result.stdout) == expected(one_down), result.stdout
    missing = f"shard-{one_down.down}"
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"shardq: error: partial: could not read {missing} ({missing} ("), line
    assert "not currently accepting connections" in line, line
    assert all(name[:-1] not in line for name in one_down.up_names), line

    as_json = run_cli(*args, "--json", env=one_down.env)
    assert as_json.returncode == 8, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert shown["unavailable_shards"] == [missing]
    assert shown_json(shown) == expected(one_down)
    (error_line,) = as_json.stderr.splitlines()
    error = json.loads(error_line)
    assert (error["code"], error["unavailable_shards"]) == (8, [missing])


def test_with_every_shard_up_the_same_reads_are_whole(deployment: Deployment) -> None:
    for _name, args, *_ in READS:
        result = run_cli(*args, env=deployment.env)
        assert (result.returncode, result.stderr) == (0, ""), args
        shown = json.loads(run_cli(*args, "--json", env=deployment.env).stdout)
        assert shown["unavailable_shards"] == [], args


def test_a_run_on_a_reachable_shard_is_served_and_one_on_the_missing_shard_named(
    one_down: Deployment,
) -> None:
    assert one_down.down is not None
    healthy, missing = one_down.parked[2], one_down.parked[one_down.down]
    shown = run_cli("workflow", "show", healthy, env=one_down.env)
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    assert shown.stdout.split()[0] == healthy
    assert "waits on signal 'go'" in shown.stdout
    absent = run_cli("workflow", "show", missing, env=one_down.env)
    assert absent.returncode == 3, absent.stderr
    (line,) = absent.stderr.splitlines()
    assert line.startswith(f"shardq: error: shard-{one_down.down} ("), line
