"""`shardq serve` and `shardq metrics` started while their shards refuse connections, with a
map the shards do not hold: once the shards answer, neither acts on the wrong map.

The worker and the relay stop with exit 4 when they find out (test_outbox_faults.py); a
server answers every request that reaches such a shard with 503 and writes nothing, and
the exporter reports the shard down, until an operator restarts it with the right map.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from shardq.bin.web.tokens import hash_token
from shardq.shards.config import ShardMap
from shardq.shards.migrations import migrate

from ..support import (
    Daemon,
    allow_connections,
    free_port,
    rows,
    scrape,
    value,
    wait_for_health,
    wait_until,
)

pytestmark = pytest.mark.slow
TOKEN = "sq_late-map-token"


def test_a_server_and_an_exporter_started_on_refusing_shards_never_use_a_wrong_map(
    fresh_databases: Callable[..., list[str]], daemons: Callable[..., Daemon], tmp_path: Path,
) -> None:
    urls = fresh_databases(3, "late")
    migrate(ShardMap.from_urls(urls))
    wrong = ",".join(urls[:2])  # two shards' map for three shards' databases
    tokens = tmp_path / "tokens"
    tokens.write_text(f"default {hash_token(TOKEN)}\n")
    api_port, metrics_port = free_port(), free_port()
    root = f"http://127.0.0.1:{api_port}"
    base = f"{root}/api/shardq"
    allow_connections(urls, allowed=False)
    try:
        server = daemons(["--shards", wrong, "serve", "--app", "shardq.tests.app:registry",
                          "--port", str(api_port), "--tokens-file", str(tokens)])
        exporter = daemons(["--shards", wrong, "metrics", "--port", str(metrics_port),
                            "--cache-seconds", "0"])
        wait_for_health(root, 503)  # it answers, its shards down
        exporter.wait_for("store exporter on")
        assert value(scrape(metrics_port), "shardq_shard_up", shard="shard-0") == 0
    finally:
        allow_connections(urls, allowed=True)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    answers = []

    def start(key: str) -> httpx.Response:
        answer = httpx.post(f"{base}/workflows/onboarding/start", headers=auth, timeout=30,
                            json={"workflow_id": key})
        answers.append(answer)
        assert answer.status_code == 503, answer.text
        return answer

    # The server's map poll tried the shards while they refused connections: for up to
    # a second (pools.DOWN_PROBE_INTERVAL_S) a shard is still taken for down, and then
    # its first reach finds the mismatch. Never a run stored meanwhile.
    wait_until(lambda: "map mismatch" in start("late-0").json()["error"],
               what="the server naming the map mismatch", timeout=15)
    for key in ("late-1", "late-2", "late-3", "late-4"):
        assert "map mismatch" in start(key).json()["error"], answers[-1].text
    assert "Traceback" not in server.stderr()
    assert sum(rows(u, "SELECT count(*) FROM shardq.executions")[0][0] for u in urls) == 0
    samples = wait_until(lambda: scrape(metrics_port), what="a scrape")
    assert value(samples, "shardq_shard_up", shard="shard-0") == 0
    assert value(samples, "shardq_shard_up", shard="shard-1") == 0
