"""`shardq serve` while one shard refuses connections: the API and the review inbox serve
what the other shards hold, name the missing shard (by name only), and answer at once.

The down shard's URL carries a recognisable user, password, host, port and database;
none of them may reach a caller or a reviewer, in any body or page.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from shardq.bin.web.tokens import hash_token
from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for, new_execution_id
from shardq.worker.worker import Worker

from ..app import registry
from ..support import Daemon, free_port, wait_for_health, wait_until

pytestmark = pytest.mark.slow
TOKEN = "sq_outage-token"
FAST_S = 2.0
"""A refused shard must not cost a request a pool timeout (10 s by default)."""


@dataclass
class Site:
    http: httpx.Client
    secrets: list[str]
    run_key: str
    """The workflow_id of a run on the reachable shard, parked on its interrupt."""
    answers: list[httpx.Response] = field(default_factory=list)

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        began = time.monotonic()
        answer = self.http.get(path, **kwargs)  # type: ignore[arg-type]  # httpx's keywords
        assert time.monotonic() - began < FAST_S, path
        self.answers.append(answer)
        return answer


@pytest.fixture
def site(shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path,
         start_worker: Callable[..., Worker]) -> Iterator[Site]:
    up = shard_map.shards[0]
    with Client.connect(shard_map, registry) as client:
        key = next(k for k in (f"outage-{i}" for i in range(200)) if shard_map.for_bucket(
            bucket_for("acme", "proposal_review", k)) == up)
        run = client.start("proposal_review", key, {"amount": 5}, tenant="acme").execution_id
        start_worker(registry)
        wait_until(lambda: client.get(run, tenant="acme").state is State.INPUT_REQUIRED,
                   what="the interrupt")
    port = free_port()
    dead = free_port()  # nothing listens there: connections are refused
    secrets = ["leaky_user", "leaky-pass-7731", "127.0.0.42", str(dead), "leaky_db",
               "postgresql://"]
    down_url = f"postgresql://leaky_user:leaky-pass-7731@127.0.0.42:{dead}/leaky_db"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"acme {hash_token(TOKEN)}\n")
    server = daemons(["--shards", f"{up.url},{down_url}", "serve", "--app",
                      "shardq.tests.app:registry", "--port", str(port), "--tokens-file",
                      str(tokens)])
    server.wait_for("shardq API on")
    base = f"http://127.0.0.1:{port}"
    wait_for_health(base, 503)
    with httpx.Client(base_url=base, timeout=30) as http:
        yield Site(http, secrets, key)


def test_the_api_serves_the_reachable_shards_and_names_the_missing_one(
    site: Site, shard_map: ShardMap
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    health = site.get("/api/shardq/healthz")
    assert (health.status_code, health.json()) == (
        503, {"ok": False, "shards": {"shard-0": True, "shard-1": False}})
    for _ in range(3):  # every request, not only the first, answers at once
        listed = site.get("/api/shardq/interrupts", headers=auth)
        assert listed.status_code == 200, listed.text
        assert listed.json()["unavailable_shards"] == ["shard-1"]
        assert [i["workflow_id"] for i in listed.json()["items"]] == [site.run_key]
    unavailable = {"error": "shard shard-1 is unavailable; try again later",
                   "unavailable_shards": ["shard-1"]}
    runs = site.get("/api/shardq/workflows", headers=auth)
    assert (runs.status_code, runs.json()) == (503, unavailable)
    on_down = new_execution_id(shard_map.shards[1].first_bucket)
    one = site.get(f"/api/shardq/workflows/{on_down}", headers=auth)
    assert (one.status_code, one.json()) == (503, unavailable)
    _nothing_leaked(site)


def test_the_inbox_lists_the_reachable_shards_with_a_notice_and_hides_connections(
    site: Site, shard_map: ShardMap
) -> None:
    site.get("/inbox/login")  # the CSRF cookie
    signed = site.http.post("/inbox/login", data={
        "token": TOKEN, "actor": "ann", "csrf": site.http.cookies["shardq_csrf"]})
    assert signed.status_code == 303
    inbox = site.get("/inbox")
    assert inbox.status_code == 200
    assert site.run_key in inbox.text
    assert ("Not shown: what waits on shard shard-1, which cannot be reached right now."
            in inbox.text)
    parked = site.get("/inbox/parked")
    assert parked.status_code == 503
    assert "shard shard-1 is unavailable; try again later" in parked.text
    on_down = new_execution_id(shard_map.shards[1].first_bucket)
    page = site.get(f"/inbox/runs/{on_down}")
    assert page.status_code == 503
    assert "shard shard-1 is unavailable" in page.text
    _nothing_leaked(site)


def _nothing_leaked(site: Site) -> None:
    for answer in site.answers:
        shown = answer.text + "".join(f"{k}: {v}" for k, v in answer.headers.items())
        for secret in site.secrets:
            assert secret not in shown, (answer.url, secret, shown[:500])
