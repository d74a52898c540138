"""`shardq workflow signal` and `POST /workflows/{id}/signal/{name}` follow one rule set.

Both read keys and payloads through shardq.bin.web.rules and deliver through one
function; this table pins them to each other: every case is played through the
command line and through a real `shardq serve`, each on a run of its own, and
the two must classify every send alike and store the same signals.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from shardq.client.client import Client
from shardq.shards.config import ShardMap

from ..app import registry
from ..support import Daemon, all_rows, run_cli, start_api

pytestmark = pytest.mark.slow
APP = "shardq.tests.app:registry"
TOKEN = "sq_parity-token"
TENANT = "acme"
PAID = '{"amount": 5}'


@dataclass(frozen=True)
class Send:
    name: str
    payload: str
    key: str | None = None


@dataclass(frozen=True)
class Case:
    id: str
    sends: tuple[Send, ...]
    expected: tuple[str, ...]
    finished: bool = False
    """The run is cancelled after the first send (whose class is then checked too)."""
    unknown: bool = False
    """The sends go to an execution that does not exist."""


CASES = [
    Case("plain", (Send("payment_captured", PAID),), ("delivered",)),
    Case("keyed-repeat", (Send("note", '"a"', "k1"), Send("note", '"a"', "k1")),
         ("delivered", "duplicate")),
    Case("key-per-run-not-per-name", (Send("note", "1", "k2"), Send("other", "2", "k2")),
         ("delivered", "duplicate")),
    Case("empty-key", (Send("note", "1", ""),), ("bad_request",)),
    Case("blank-key", (Send("note", "1", "   "),), ("bad_request",)),
    Case("empty-payload", (Send("note", ""),), ("delivered",)),
    Case("nan-payload", (Send("note", "NaN"),), ("bad_request",)),
    Case("broken-json", (Send("note", '{"a": '),), ("bad_request",)),
    Case("repeated-key", (Send("payment_captured", '{"amount": 5, "amount": 0}'),),
         ("bad_request",)),
    Case("repeated-nested-key", (Send("note", '[{"a": {"b": 1, "b": 2}}]', "k4"),),
         ("bad_request",)),
    Case("breaks-schema", (Send("payment_captured", '{"amount": 0}'),),
         ("invalid:/amount",)),
    Case("missing-field", (Send("payment_captured", "{}"),), ("invalid:/amount",)),
    Case("reserved-name", (Send("shardq:update:add_item", "1"),), ("bad_request",)),
    Case("bad-name", (Send("no such", "1"),), ("bad_request",)),
    Case("finished", (Send("note", "1", "k3"), Send("note", "1"), Send("note", "1", "k3")),
         ("delivered", "finished", "duplicate"), finished=True),
    Case("unknown-run", (Send("note", "1"),), ("not_found",), unknown=True),
]


@pytest.fixture
def server(shard_map: ShardMap, daemons: Callable[..., Daemon],
           tmp_path: Path) -> Iterator[httpx.Client]:
    base = start_api(daemons, shard_map, tmp_path, {TOKEN: TENANT})[0] + "/api/shardq"
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=30) as http:
        yield http


def via_cli(shard_map: ShardMap, run: str, send: Send) -> str:
    args = ["workflow", "signal", run, send.name, "--payload", send.payload, "--tenant",
            TENANT, "--app", APP, "--json"]
    if send.key is not None:
        args += ["--idempotency-key", send.key]
    done = run_cli(*args, env={"SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards)})
    assert done.stderr.count("\n") <= 1, done.stderr
    if done.returncode == 0:
        return "delivered" if json.loads(done.stdout)["delivered"] else "duplicate"
    if done.returncode == 2:
        return "bad_request"
    assert done.returncode == 7, (done.returncode, done.stderr)
    error = json.loads(done.stderr)
    if "violations" in error:
        return "invalid:" + ",".join(v["field_path"] for v in error["violations"])
    if "not found" in error["error"]:
        return "not_found"
    if "takes no more signals" in error["error"]:
        return "finished"
    return "bad_request"


def via_http(http: httpx.Client, run: str, send: Send) -> str:
    path = f"/workflows/{run}/signal/{quote(send.name, safe='')}"
    headers, params = {}, {}
    if send.key is not None and send.key.strip():
        headers["Idempotency-Key"] = send.key
    elif send.key is not None:  # a header cannot carry blanks alone: the query form can
        params["idempotency_key"] = send.key
    answer = http.post(path, content=send.payload.encode(), headers=headers, params=params)
    body = answer.json()
    if answer.status_code == 202:
        return "delivered" if body["signal_delivered"] else "duplicate"
    if answer.status_code == 400 and "violations" in body:
        return "invalid:" + ",".join(v["field_path"] for v in body["violations"])
    return {400: "bad_request", 404: "not_found", 409: "finished"}[answer.status_code]


def test_the_command_line_and_the_http_api_decide_every_send_alike(
    shard_map: ShardMap, server: httpx.Client
) -> None:
    with Client.connect(shard_map, registry) as client:
        runs = {(case.id, channel): (
            str(uuid.UUID("01a23b00-a581-8495-a55e-808a42654d6c")) if case.unknown else
            str(client.start("cart", f"{case.id}-{channel}", {"customer": "c"},
                             tenant=TENANT).execution_id))
            for case in CASES for channel in ("cli", "http")}

        def play(case: Case, channel: str) -> list[str]:
            run = runs[(case.id, channel)]
            seen = []
            for index, send in enumerate(case.sends):
                seen.append(via_cli(shard_map, run, send) if channel == "cli"
                            else via_http(server, run, send))
                if case.finished and index == 0:
                    client.cancel(run, tenant=TENANT)
            return seen

        with ThreadPoolExecutor(8) as pool:
            played = {(c.id, ch): pool.submit(play, c, ch) for c in CASES for ch in ("cli", "http")}
            outcomes = {key: future.result() for key, future in played.items()}
    for case in CASES:
        cli, http = outcomes[(case.id, "cli")], outcomes[(case.id, "http")]
        assert cli == http == list(case.expected), (case.id, cli, http)
        if not case.unknown:
            assert stored(shard_map, runs[(case.id, "cli")]) == stored(
                shard_map, runs[(case.id, "http")]), case.id


def stored(shard_map: ShardMap, run: str) -> list[tuple[object, ...]]:
    return all_rows(shard_map, "SELECT name, payload, idempotency_key FROM shardq.signals "
                               "WHERE execution_id = %s ORDER BY id", run)
