"""Hostile requests to the review inbox: a 4xx page, never a 500 or a traceback, nothing
stored. (No browser: these are the requests a browser would not send.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.worker.worker import Worker

from ..app import registry
from ..conftest import STORED
from ..support import Daemon, all_rows, start_api, wait_until

pytestmark = pytest.mark.slow
TOKEN = "sq_inbox-inputs"
FORM = "application/x-www-form-urlencoded"
DECIDE = "/inbox/runs/{run}/interrupts/manager_review"
SIGNAL = "/inbox/runs/{run}/signal"

# (id, method, path, form fields or raw body, extra headers, status)
CASES: list[tuple[str, str, str, dict[str, str] | bytes, dict[str, str], int]] = [
    ("login-bad-token", "POST", "/inbox/login", {"token": "nope", "actor": "a"}, {}, 401),
    ("login-no-name", "POST", "/inbox/login", {"token": TOKEN, "actor": " "}, {}, 400),
    ("login-long-name", "POST", "/inbox/login", {"token": TOKEN, "actor": "a" * 300}, {}, 400),
    ("login-no-csrf", "POST", "/inbox/login", {"token": TOKEN, "actor": "a", "csrf": ""}, {},
     403),
    ("login-json", "POST", "/inbox/login", b'{"token": "x"}',
     {"content-type": "application/json"}, 415),
    ("login-not-utf8", "POST", "/inbox/login", b"token=\xff\xfe&actor=a", {}, 400),
    ("login-huge", "POST", "/inbox/login", b"token=" + b"x" * (300 << 10), {}, 413),
    ("decide-unknown-action", "POST", DECIDE, {"action": "maybe", "decision_id": "d"}, {}, 400),
    ("decide-no-decision-id", "POST", DECIDE, {"action": "approve", "decision_id": ""}, {}, 400),
    ("decide-long-decision-id", "POST", DECIDE, {"action": "approve",
                                                 "decision_id": "d" * 300}, {}, 400),
    ("decide-nul-in-id", "POST", DECIDE, {"action": "approve", "decision_id": "a\x00b"}, {},
     400),
    ("decide-number-not-a-number", "POST", DECIDE,
     {"action": "edit", "decision_id": "d", "field:amount": "lots", "field:reason": "r"}, {},
     400),
    ("decide-infinite-number", "POST", DECIDE,
     {"action": "edit", "decision_id": "d", "field:amount": "1e999", "field:reason": "r"}, {},
     400),
    ("decide-unknown-interrupt", "POST", "/inbox/runs/{run}/interrupts/nope",
     {"action": "approve", "decision_id": "d"}, {}, 404),
    ("decide-bad-run-id", "POST", "/inbox/runs/not-a-run/interrupts/x",
     {"action": "approve", "decision_id": "d"}, {}, 404),
    ("show-bad-run-id", "GET", "/inbox/runs/..%2F..%2Fetc", b"", {}, 404),
    ("show-unknown-run", "GET", "/inbox/runs/01a23b00-a581-8495-a55e-808a42654d6c", b"", {},
     404),
    ("list-bad-workflow", "GET", "/inbox?workflow=bad%20name!", b"", {}, 400),
    ("list-bad-cursor", "GET", "/inbox?cursor=zz", b"", {}, 400),
    ("static-traversal", "GET", "/inbox/static/..%2Finbox.py", b"", {}, 404),
    ("runs-bad-state", "GET", "/inbox/runs?state=asleep", b"", {}, 400),
    ("runs-bad-where", "GET", "/inbox/runs?where=amount%3E%3E1", b"", {}, 400),
    ("runs-where-nul", "GET", "/inbox/runs?where=a%00%3D1", b"", {}, 400),
    ("runs-five-filters", "GET", "/inbox/runs?where=" + "%0A".join(f"a{i}%3D1" for i in range(5)),
     b"", {}, 400),
    ("runs-bad-time", "GET", "/inbox/runs?created_after=yesterday", b"", {}, 400),
    ("runs-naive-time", "GET", "/inbox/runs?created_before=2026-12-01T00:00", b"", {}, 400),
    ("runs-long-filter", "GET", "/inbox/runs?workflow=" + "x" * 5000, b"", {}, 400),
    ("runs-bad-workflow", "GET", "/inbox/runs?workflow=bad%20name!", b"", {}, 400),
    ("runs-bad-cursor", "GET", "/inbox/runs?cursor=zz", b"", {}, 400),
    ("signal-bad-json", "POST", SIGNAL, {"name": "go", "payload": "{"}, {}, 400),
    ("signal-nan", "POST", SIGNAL, {"name": "go", "payload": "NaN"}, {}, 400),
    ("signal-repeated-key", "POST", SIGNAL, {"name": "go", "payload": '{"a":1,"a":2}'}, {},
     400),
    ("signal-bad-name", "POST", SIGNAL, {"name": "bad name!", "payload": ""}, {}, 400),
    ("signal-no-name", "POST", SIGNAL, {"payload": "1"}, {}, 400),
    ("signal-reserved-name", "POST", SIGNAL, {"name": "shardq.x", "payload": ""}, {}, 400),
    ("signal-nul-key", "POST", SIGNAL, {"name": "go", "idempotency_key": "a\x00b"}, {}, 400),
    ("signal-long-key", "POST", SIGNAL, {"name": "go", "idempotency_key": "k" * 300}, {},
     400),
    ("signal-json-body", "POST", SIGNAL, b'{"name": "go"}',
     {"content-type": "application/json"}, 415),
    ("signal-unknown-run", "POST", "/inbox/runs/01a23b00-a581-8495-a55e-808a42654d6c/signal",
     {"name": "go", "payload": "1"}, {}, 404),
    ("cancel-bad-run-id", "POST", "/inbox/runs/not-a-run/cancel", {}, {}, 404),
    ("cancel-unknown-run", "POST", "/inbox/runs/01a23b00-a581-8495-a55e-808a42654d6c/cancel",
     {}, {}, 404),
    ("cancel-get", "GET", "/inbox/runs/{run}/cancel", b"", {}, 405),
    ("state-bad-run-id", "GET", "/inbox/runs/not-a-run/interrupts/x/state", b"", {}, 404),
    ("state-unknown-run", "GET",
     "/inbox/runs/01a23b00-a581-8495-a55e-808a42654d6c/interrupts/manager_review/state", b"",
     {}, 404),
    ("state-unknown-interrupt", "GET", "/inbox/runs/{run}/interrupts/nope/state", b"", {}, 404),
    ("state-bad-name", "GET", "/inbox/runs/{run}/interrupts/bad%20name!/state", b"", {}, 404),
    ("state-post", "POST", "/inbox/runs/{run}/interrupts/manager_review/state",
     {"action": "approve", "decision_id": "d"}, {}, 405),
]


@pytest.fixture
def http(shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path,
         start_worker: Callable[..., Worker]) -> Iterator[httpx.Client]:
    base = start_api(daemons, shard_map, tmp_path, {TOKEN: "acme"})[0]
    start_worker(registry)
    with httpx.Client(base_url=base, timeout=30) as client:
        yield client


def test_hostile_requests_get_a_4xx_page_and_store_nothing(
    http: httpx.Client, shard_map: ShardMap
) -> None:
    with Client.connect(shard_map, registry) as client:
        run = client.start("proposal_review", "hostile", {"amount": 3}, tenant="acme")
        wait_until(lambda: client.get(run.execution_id, tenant="acme").state
                   is State.INPUT_REQUIRED, what="the interrupt")
    http.get("/inbox/login")  # the CSRF cookie
    signed = http.post("/inbox/login", data={"token": TOKEN, "actor": "ann",
                                             "csrf": http.cookies["shardq_csrf"]})
    assert signed.status_code == 303
    before = {t: all_rows(shard_map, f"SELECT count(*) FROM shardq.{t}") for t in STORED}
    for case, method, path, body, headers, status in CASES:
        target = path.replace("{run}", str(run.execution_id))
        if isinstance(body, dict):
            fields = {"csrf": http.cookies["shardq_csrf"], **body}
            answer = http.request(method, target, data=fields, headers=headers)
        else:
            answer = http.request(method, target, content=body or None,
                                  headers={"content-type": FORM, **headers} if body else headers)
        assert answer.status_code == status, (case, answer.status_code, answer.text[-500:])
        assert "Traceback" not in answer.text and "internal error" not in answer.text, case
        assert "Client." not in answer.text, case  # a reviewer's page names no API
        if answer.headers["content-type"].startswith("text/html"):  # not a JSON 404
            assert "script-src 'self'" in answer.headers["content-security-policy"], case
    state = f"/inbox/runs/{run.execution_id}/interrupts/manager_review/state"
    signed_out = httpx.get(str(http.base_url.join(state)), timeout=30)
    assert (signed_out.status_code, signed_out.json()) == (401, {"error": "sign in first"})
    after = {t: all_rows(shard_map, f"SELECT count(*) FROM shardq.{t}") for t in STORED}
    # A refused decision attempt is audited (interrupt.refused): the only row it may add.
    refused = all_rows(shard_map, "SELECT count(*) FROM shardq.events "
                                  "WHERE kind = 'interrupt.refused'")[0][0]
    assert after["history"][0][0] - before["history"][0][0] == refused
    assert {t: v for t, v in after.items() if t != "history"} == {
        t: v for t, v in before.items() if t != "history"}
