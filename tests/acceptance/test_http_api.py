"""The HTTP API as a caller meets it: a real `shardq serve` process, driven with httpx."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.worker.worker import Worker

from ..conftest import STORED
from ..support import Daemon, all_rows, start_api, wait_until

pytestmark = pytest.mark.slow
ROOT_PATH = "/api/shardq"
TOKEN, OTHER = "sq_test-token-a", "sq_test-token-b"
StartWorker = Callable[..., Worker]


@dataclass
class Api:
    http: httpx.Client
    other: httpx.Client
    anonymous: httpx.Client


@pytest.fixture
def api(shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path) -> Iterator[Api]:
    base, _ = start_api(daemons, shard_map, tmp_path, {TOKEN: "acme", OTHER: "globex"})
    base += ROOT_PATH
    with (httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                       timeout=30) as http,
          httpx.Client(base_url=base, headers={"Authorization": f"Bearer {OTHER}"},
                       timeout=30) as other,
          httpx.Client(base_url=base, timeout=30) as anonymous):
        yield Api(http, other, anonymous)


def start_park(api: Api, key: str) -> str:
    made = api.http.post("/workflows/park/start", json={"workflow_id": key})
    assert made.status_code == 201, made.text
    return str(made.json()["execution_id"])


def test_start_signal_show_and_the_status_codes(api: Api, start_worker: StartWorker) -> None:
    from ..app import registry

    start_worker(registry)
    run = start_park(api, "h-1")
    again = api.http.post("/workflows/park/start", json={"workflow_id": "h-1"})
    assert (again.status_code, again.json()["execution_id"]) == (200, run)
    assert api.http.get("/healthz").json()["ok"] is True

    keyed = api.http.post(f"/workflows/{run}/signal/go?idempotency_key=from-query",
                          content=b'{"n": 1}', headers={"Idempotency-Key": "from-header"})
    assert (keyed.status_code, keyed.json()) == (202, {"ok": True, "signal_delivered": True})
    # The header won: the same header again is a duplicate, the query key is new.
    assert api.http.post(f"/workflows/{run}/signal/go", content=b'{"n": 1}',
                         headers={"Idempotency-Key": "from-header"}).json()[
        "signal_delivered"] is False
    wait_until(lambda: api.http.get(f"/workflows/{run}").json()["state"] == "completed",
               what="completed")
    shown = api.http.get(f"/workflows/{run}").json()
    assert shown["output"] == {"n": 1}
    finished = api.http.post(f"/workflows/{run}/signal/go", content=b"")
    assert finished.status_code == 409
    assert finished.json()["state"] == State.COMPLETED.value
    retried = api.http.post(f"/workflows/{run}/signal/go", content=b'{"n": 1}',
                            headers={"Idempotency-Key": "from-header"})
    assert (retried.status_code, retried.json()["signal_delivered"]) == (202, False)
    kinds = [e["kind"] for e in api.http.get(f"/workflows/{run}/history").json()["events"]]
    assert kinds[-1] == "run.completed"
    listed = api.http.get("/workflows", params={"workflow": "park", "limit": 10}).json()
    assert [i["execution_id"] for i in listed["items"]] == [run]


def test_another_tenant_s_run_looks_unknown(api: Api) -> None:
    run = start_park(api, "h-2")
    unknown = "01a23b00-a581-8495-a55e-808a42654d6c"
    for path in (f"/workflows/{run}", f"/workflows/{run}/history"):
        theirs, nobody = api.other.get(path), api.other.get(path.replace(run, unknown))
        assert (theirs.status_code, theirs.json()) == (nobody.status_code, nobody.json())
        assert theirs.status_code == 404
    probe = api.other.post(f"/workflows/{run}/signal/go", content=b"1")
    assert (probe.status_code, probe.json()) == (404, {"error": "execution not found"})
    assert api.other.get("/workflows").json()["items"] == []


def test_a_priority_is_given_at_start_shown_with_the_run_and_filters_the_list(
    api: Api,
) -> None:
    urgent = api.http.post("/workflows/park/start",
                           json={"workflow_id": "prio-7", "priority": 7}).json()["execution_id"]
    start_park(api, "prio-0")
    assert api.http.get(f"/workflows/{urgent}").json()["priority"] == 7
    listed = api.http.get("/workflows", params={"priority": "7"}).json()["items"]
    assert [(r["execution_id"], r["priority"]) for r in listed] == [(urgent, 7)]
    assert len(api.http.get("/workflows").json()["items"]) == 2


@pytest.mark.parametrize(("params", "says"), [
    ({"created_after": "yesterday"}, "created_after: 'yesterday' is not an ISO 8601 time"),
    ({"created_before": "2026-12-01T00:00:00"}, "has no offset"),
    ({"created_after": "2026-13-01T00:00:00Z"}, "is not an ISO 8601 time"),
    ({"created_after": "\x00"}, "is not an ISO 8601 time"),
])
def test_a_creation_window_filters_the_list_and_a_bad_one_is_a_400(
    api: Api, params: dict[str, str], says: str,
) -> None:
    run = start_park(api, "window")
    # The window is the id's millisecond, the starting client's clock: a little before
    # created_at, the row's insert on its shard.
    created = datetime.fromisoformat(api.http.get(f"/workflows/{run}").json()["created_at"])
    after = (created - timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    for window, expected in (({"created_after": after}, [run]),
                             ({"created_after": created.isoformat(timespec="seconds")
                               .replace("+00:00", "+01:00")}, [run]),
                             ({"created_before": "2000-01-01T00:00:00+02:00"}, []),
                             ({"created_after": "2000-01-01T00:00:00Z",
                               "created_before": "2999-01-01T00:00:00Z"}, [run])):
        answer = api.http.get("/workflows", params=window)
        assert answer.status_code == 200, answer.text
        assert [r["execution_id"] for r in answer.json()["items"]] == expected
    refused = api.http.get("/workflows", params=params)
    assert refused.status_code == 400, refused.text
    assert says in refused.json()["error"]


def test_counts_are_the_tenant_s_and_a_bad_filter_is_a_400(api: Api) -> None:
    run = start_park(api, "counted")
    state = api.http.get(f"/workflows/{run}").json()["state"]
    answer = api.http.get("/workflows/counts")
    assert answer.status_code == 200, answer.text
    counted = answer.json()
    assert (counted["total"], counted["by_state"][state]) == (1, 1)
    assert counted["by_workflow"] == {"park": counted["by_state"]}
    assert api.http.get("/workflows/counts", params={"workflow": "nope"}).json()["total"] == 0
    for bad in ("", "x" * 300, "a\x00b"):
        refused = api.http.get("/workflows/counts", params={"workflow": bad})
        assert refused.status_code == 400, (bad, refused.text)
        assert "workflow" in refused.json()["error"]


def test_runs_are_listed_counted_and_acted_on_by_their_attributes(
    api: Api, start_worker: StartWorker,
) -> None:
    from ..app import registry

    start_worker(registry)
    runs = [api.http.post("/workflows/tagged/start", json={
        "workflow_id": f"t-{i}", "input": {"region": ("eu", "us")[i % 2], "amount": i}}
    ).json()["execution_id"] for i in range(4)]
    wait_until(lambda: all(api.http.get(f"/workflows/{r}").json()["state"] == "waiting"
                           for r in runs), what="every run parked", timeout=20)
    listed = api.http.get("/workflows", params={"where": ["region=eu", "amount>=1"]})
    assert [r["execution_id"] for r in listed.json()["items"]] == [runs[2]]
    assert listed.json()["items"][0]["attributes"] == {"region": "eu", "amount": 2}
    counted = api.http.get("/workflows/counts", params={"where": "region=us"}).json()
    assert counted["by_state"]["waiting"] == 2
    assert api.other.get("/workflows", params={"where": "region=eu"}).json()["items"] == []
    over = api.http.post("/bulk/cancel", json={"workflow": "tagged",
                                                             "max_runs": 3})
    assert over.status_code == 409, over.text
    assert "more than 3 live runs match" in over.json()["error"]
    dry = api.http.post("/bulk/cancel", json={"where": ["region=eu"],
                                                            "dry_run": True}).json()
    assert (dry["matched"], dry["done"]) == (sorted(runs[0::2]), [])
    sent = api.http.post("/bulk/signal", json={
        "name": "go", "payload": 5, "idempotency_key": "k", "where": {"region": "us"}})
    assert sent.status_code == 200, sent.text
    assert sorted(sent.json()["done"]) == sorted(runs[1::2])
    wait_until(lambda: all(api.http.get(f"/workflows/{r}").json()["state"] == "completed"
                           for r in runs[1::2]), what="the signalled runs ended", timeout=20)
    cancelled = api.http.post("/bulk/cancel", json={"where": ["region=eu"]})
    assert sorted(cancelled.json()["done"]) == sorted(runs[0::2])
    assert {api.http.get(f"/workflows/{r}").json()["state"] for r in runs[0::2]} == {
        "cancelled"}


@pytest.mark.parametrize(("path", "body", "says"), [
    ("cancel", {}, "a bulk action needs a filter"),
    ("cancel", {"workflow": "tagged", "max_runs": 0}, "max_runs must be"),
    ("cancel", {"workflow": "tagged", "max_runs": "9"}, "`max_runs` must be a int"),
    ("cancel", {"where": "region=eu"}, "where must be a mapping of attribute names"),
    ("cancel", {"where": ["region>>eu"]}, "is not NAME OP VALUE"),
    ("cancel", {"where": {"region": None}}, "a string, number, boolean or datetime"),
    ("cancel", {"state": "completed"}, "state must be one of"),
    ("cancel", {"created_after": "soon"}, "is not an ISO 8601 time"),
    ("cancel", {"workflow": "tagged", "colour": "red"}, "unknown key"),
    ("cancel", {"workflow": "tagged", "dry_run": "yes"}, "`dry_run` must be a bool"),
    ("signal", {"workflow": "tagged"}, "`name` must be a str"),
    ("signal", {"name": "bad name", "workflow": "tagged"}, "signal name"),
])
def test_a_bad_bulk_action_is_a_400_and_acts_on_nothing(
    api: Api, path: str, body: dict[str, Any], says: str,
) -> None:
    made = api.http.post("/workflows/tagged/start", json={
        "workflow_id": "stays", "input": {"region": "eu", "amount": 1}})
    run = made.json()["execution_id"]
    refused = api.http.post(f"/bulk/{path}", json=body)
    assert refused.status_code == 400, refused.text
    assert says in refused.json()["error"]
    assert api.http.get(f"/workflows/{run}").json()["state"] == "pending"
    listed = api.http.get("/workflows", params={"where": "a\x00=1"})
    assert listed.status_code == 400, listed.text


def test_a_live_run_s_priority_is_changed_and_a_bad_change_changes_nothing(api: Api) -> None:
    run = start_park(api, "prio-change")
    changed = api.http.post(f"/workflows/{run}/priority", json={"priority": 4})
    assert changed.status_code == 200, changed.text
    assert changed.json() == {"execution_id": run, "priority": 4, "state": "pending"}
    for bad in ({"priority": 10}, {"priority": None}, {"priority": "5"}, {"priority": True},
                {}, {"priority": 1, "level": 2}):
        refused = api.http.post(f"/workflows/{run}/priority", json=bad)
        assert refused.status_code == 400, (bad, refused.text)
    assert api.http.get(f"/workflows/{run}").json()["priority"] == 4


def test_concurrent_identical_keyed_deliveries_store_one_signal(
    api: Api, shard_map: ShardMap
) -> None:
    run = start_park(api, "h-3")

    def deliver(_: int) -> bool:
        answer = api.http.post(f"/workflows/{run}/signal/other", content=b'"x"',
                               headers={"Idempotency-Key": "webhook-7"})
        assert answer.status_code == 202, answer.text
        return bool(answer.json()["signal_delivered"])

    with ThreadPoolExecutor(20) as pool:
        delivered = list(pool.map(deliver, range(200)))
    assert delivered.count(True) == 1
    assert all_rows(shard_map, "SELECT count(*) FROM shardq.signals") in ([(1,), (0,)],
                                                                         [(0,), (1,)])


def test_a_decision_over_http(api: Api, start_worker: StartWorker) -> None:
    from ..app import registry

    start_worker(registry)
    made = api.http.post("/workflows/proposal_review/start",
                         json={"workflow_id": "p-1", "input": {"amount": 10}})
    run = made.json()["execution_id"]
    wait_until(lambda: api.http.get("/interrupts").json()["items"], what="the interrupt")
    (item,) = api.http.get("/interrupts").json()["items"]
    assert item["value"] == {"amount": 10, "reason": "travel"}  # the proposal under review
    path = f"/workflows/{run}/interrupts/manager_review/decision"
    bad = api.http.post(path, json={"action": "edit", "payload": {"amount": -1},
                                    "decision_id": "d", "actor": "ann"})
    assert bad.status_code == 400
    assert sorted(v["field_path"] for v in bad.json()["violations"]) == ["/amount", "/reason"]
    good = api.http.post(path, json={"action": "approve", "decision_id": "d", "actor": "ann"})
    assert (good.status_code, good.json()["accepted"]) == (200, True)
    late = api.http.post(path, json={"action": "reject", "decision_id": "e", "actor": "bob"})
    assert (late.status_code, late.json()["reason_code"]) == (409, "decided")
    audit = api.http.get(f"/workflows/{run}").json()["decisions"]
    # bob's refusal is audited while the run is open; once the worker finished it, a
    # refused decision stores nothing (its history ends with its outcome).
    assert [(d["actor"], d["accepted"]) for d in audit] in (
        [("ann", True), ("bob", False)], [("ann", True)])
    assert audit[0]["action"] == "approve" and audit[0]["interrupt"] == "manager_review"


BAD_PRIORITIES: list[tuple[str, str, str, dict[str, object], int]] = [
    (f"start-priority-{name}", "POST", "/workflows/park/start",
     {"json": {"workflow_id": f"prio-{name}", "priority": bad}}, 400)
    for name, bad in (("negative", -1), ("ten", 10), ("huge", 2**70), ("fraction", 1.5),
                      ("text", "5"), ("bool", True))
]
BAD_REQUESTS: list[tuple[str, str, str, dict[str, object], int]] = [
    # (id, method, path, httpx keyword arguments, status)
    ("no-token", "POST", "/workflows/park/start", {"json": {"workflow_id": "x"},
                                                   "headers": {"Authorization": ""}}, 401),
    ("bad-token", "GET", "/workflows", {"headers": {"Authorization": "Bearer nope"}}, 401),
    ("not-bearer", "GET", "/workflows", {"headers": {"Authorization": f"Basic {TOKEN}"}}, 401),
    ("bad-json", "POST", "/workflows/park/start",
     {"content": b"{", "headers": {"Content-Type": "application/json"}}, 400),
    ("nan-json", "POST", "/workflows/park/start",
     {"content": b'{"workflow_id": "n", "input": NaN}',
      "headers": {"Content-Type": "application/json"}}, 400),
    ("not-utf8-json", "POST", "/workflows/park/start",
     {"content": b'{"workflow_id": "\xff"}', "headers": {"Content-Type": "application/json"}},
     400),
    ("wrong-type", "POST", "/workflows/park/start",
     {"content": b"{}", "headers": {"Content-Type": "text/plain"}}, 415),
    ("array-body", "POST", "/workflows/park/start", {"json": ["x"]}, 400),
    ("id-not-string", "POST", "/workflows/park/start", {"json": {"workflow_id": 5}}, 400),
    ("huge-body", "POST", "/workflows/park/start",
     {"content": b'{"workflow_id": "h", "input": "' + b"x" * (10 << 20) + b'"}',
      "headers": {"Content-Type": "application/json"}}, 413),
    ("unknown-workflow", "POST", "/workflows/nope/start", {"json": {"workflow_id": "x"}}, 404),
    ("quote-in-name", "POST", "/workflows/pa'rk/start", {"json": {"workflow_id": "x"}}, 400),
    ("nul-in-id", "POST", "/workflows/park/start", {"json": {"workflow_id": "a\u0000b"}}, 400),
    ("traversal", "GET", "/workflows/..%2F..%2Fetc%2Fpasswd", {}, 404),
    ("bad-execution-id", "POST", "/workflows/not-a-uuid/signal/go", {"content": b"1"}, 404),
    ("bad-signal-name", "POST", "/workflows/{run}/signal/bad%20name", {"content": b"1"}, 400),
    ("empty-key-header", "POST", "/workflows/{run}/signal/go",
     {"content": b"1", "headers": {"Idempotency-Key": ""}}, 400),
    ("non-utf8-key-header", "POST", "/workflows/{run}/signal/go",
     {"content": b"1", "headers": [("Idempotency-Key", b"\xff\xfe")]}, 400),
    ("bad-payload", "POST", "/workflows/{run}/signal/go", {"content": b"{nope"}, 400),
    *BAD_PRIORITIES,
    ("signal-with-start-priority", "POST", "/workflows/park/signal-with-start",
     {"json": {"workflow_id": "prio-s", "signal": "go", "priority": 11}}, 400),
    ("update-with-start-priority", "POST", "/workflows/cart/update-with-start",
     {"json": {"workflow_id": "prio-u", "input": {"customer": "c"}, "update": "add_item",
               "argument": {"sku": "a", "quantity": 1}, "priority": -2}}, 400),
    ("list-priority-word", "GET", "/workflows", {"params": {"priority": "high"}}, 400),
    ("set-priority-ten", "POST", "/workflows/{run}/priority", {"json": {"priority": 10}}, 400),
    ("set-priority-missing", "POST", "/workflows/{run}/priority", {"json": {}}, 400),
    ("set-priority-not-json", "POST", "/workflows/{run}/priority", {"content": b"3"}, 415),
    ("set-priority-bad-id", "POST", "/workflows/not-a-uuid/priority",
     {"json": {"priority": 1}}, 404),
    ("set-priority-unknown-run", "POST",
     "/workflows/01a23b00-a581-8495-a55e-808a42654d6c/priority", {"json": {"priority": 1}}, 404),
    ("list-priority-ten", "GET", "/workflows", {"params": {"priority": "10"}}, 400),
    ("bad-limit", "GET", "/workflows", {"params": {"limit": "lots"}}, 400),
    ("zero-limit", "GET", "/workflows", {"params": {"limit": "0"}}, 400),
    ("bad-state", "GET", "/workflows", {"params": {"state": "bogus"}}, 400),
    ("bad-cursor", "GET", "/workflows", {"params": {"cursor": "zz"}}, 400),
    ("bad-decision", "POST", "/workflows/{run}/interrupts/x/decision",
     {"json": {"action": "maybe", "decision_id": "d", "actor": "a"}}, 400),
    ("start-bad-input", "POST", "/workflows/cart/start",
     {"json": {"workflow_id": "c-bad", "input": {"customer": ""}}}, 400),
    ("signal-breaks-schema", "POST", "/workflows/{cart}/signal/payment_captured",
     {"content": b'{"amount": 0}'}, 400),
    ("query-unknown", "POST", "/workflows/{cart}/query/nope", {}, 404),
    ("query-bad-json", "POST", "/workflows/{cart}/query/contents", {"content": b"{"}, 400),
    ("update-unknown", "POST", "/workflows/{cart}/update/nope", {"content": b"1"}, 404),
    ("update-breaks-schema", "POST", "/workflows/{cart}/update/add_item",
     {"json": {"sku": "", "quantity": 0}}, 400),
    ("update-bad-wait", "POST", "/workflows/{cart}/update/add_item",
     {"json": {"sku": "a", "quantity": 1}, "params": {"wait": "forever"}}, 400),
    ("update-negative-wait", "POST", "/workflows/{cart}/update/add_item",
     {"json": {"sku": "a", "quantity": 1}, "params": {"wait": "-1"}}, 400),
    ("update-empty-key", "POST", "/workflows/{cart}/update/add_item",
     {"json": {"sku": "a", "quantity": 1}, "headers": {"Idempotency-Key": ""}}, 400),
    ("update-with-start-no-update", "POST", "/workflows/cart/update-with-start",
     {"json": {"workflow_id": "c-bad"}}, 400),
    ("update-with-start-bad-input", "POST", "/workflows/cart/update-with-start",
     {"json": {"workflow_id": "c-bad", "input": {}, "update": "add_item",
               "argument": {"sku": "a", "quantity": 1}}}, 400),
    ("update-with-start-empty-key", "POST", "/workflows/cart/update-with-start",
     {"json": {"workflow_id": "c-bad", "input": {"customer": "c"}, "update": "add_item",
               "argument": {"sku": "a", "quantity": 1}, "idempotency_key": ""}}, 400),
    # A key the body's schema does not name is refused, not ignored (additionalProperties).
    ("start-unknown-key", "POST", "/workflows/park/start",
     {"json": {"workflow_id": "typo-1", "inputs": {"n": 1}}}, 400),
    ("start-unknown-key-only", "POST", "/workflows/park/start",
     {"json": {"workflow_id": "typo-2", "input": None, "tenant": "globex"}}, 400),
    ("signal-with-start-unknown-key", "POST", "/workflows/park/signal-with-start",
     {"json": {"workflow_id": "typo-3", "signal": "go", "paylaod": 1}}, 400),
    ("update-with-start-unknown-key", "POST", "/workflows/cart/update-with-start",
     {"json": {"workflow_id": "typo-4", "input": {"customer": "c"}, "update": "add_item",
               "argument": {"sku": "a", "quantity": 1}, "idempotencyKey": "k"}}, 400),
    ("decide-unknown-key", "POST", "/workflows/{run}/interrupts/x/decision",
     {"json": {"action": "approve", "decision_id": "d", "actor": "a", "reason": "ok"}}, 400),
    ("interface-unknown", "GET", "/workflows/registered/nope/interface", {}, 404),
    ("no-route", "GET", "/nothing/here", {}, 404),
    ("wrong-method", "DELETE", "/workflows", {}, 405),
    ("root-wrong-method", "POST", "", {"json": {}}, 405),
    ("root-slash-wrong-method", "DELETE", "/", {}, 405),
    # The inbox's state poll is the inbox's: its cookie, never a bearer token, opens it.
    ("inbox-state-bearer-token", "GET", "{origin}/inbox/runs/{run}/interrupts/x/state", {},
     401),
]


def counts(shard_map: ShardMap) -> dict[str, int]:
    return {t: sum(n for (n,) in all_rows(shard_map, f"SELECT count(*) FROM shardq.{t}"))
            for t in STORED}


def test_malformed_requests_are_4xx_one_json_error_and_store_nothing(
    api: Api, shard_map: ShardMap
) -> None:
    run = start_park(api, "h-4")
    cart = api.http.post("/workflows/cart/start", json={
        "workflow_id": "c-4", "input": {"customer": "ann"}}).json()["execution_id"]
    origin = str(api.http.base_url.copy_with(path="/")).rstrip("/")
    before = counts(shard_map)
    for case, method, path, kwargs, status in BAD_REQUESTS:
        target = path.replace("{run}", run).replace("{cart}", cart).replace("{origin}", origin)
        answer = api.http.request(method, target, **kwargs)  # type: ignore[arg-type]  # a table of mixed keyword arguments
        assert answer.status_code == status, (case, answer.status_code, answer.text)
        body = answer.json()
        assert isinstance(body.get("error"), str), (case, body)
        assert "Traceback" not in answer.text, case
    assert counts(shard_map) == before
    assert json.loads(api.http.get("/openapi.json").text)["openapi"] == "3.1.0"


REPEATED_KEYS: list[tuple[str, str, bytes, str]] = [
    # (id, path, raw JSON body, the refusal): a key twice in one object, anywhere in
    # the body of every route that takes one, is a 400; json.loads would keep the last.
    ("start-top", "/workflows/park/start", b'{"workflow_id": "r-1", "workflow_id": "r-2"}',
     "the body repeats the key 'workflow_id' in one object"),
    ("start-input-nested", "/workflows/park/start",
     b'{"workflow_id": "r-3", "input": {"order": {"id": 1, "id": 2}}}',
     "the body repeats the key 'id' in one object"),
    ("signal-payload", "/workflows/{run}/signal/go", b'{"amount": 1, "amount": 2}',
     "the signal payload repeats the key 'amount' in one object"),
    ("signal-payload-nested", "/workflows/{run}/signal/go",
     b'{"lines": [{"sku": "a"}, {"sku": "a", "sku": "b"}]}',
     "the signal payload repeats the key 'sku' in one object"),
    ("signal-with-start-top", "/workflows/park/signal-with-start",
     b'{"workflow_id": "r-4", "signal": "go", "signal": "stop"}',
     "the body repeats the key 'signal' in one object"),
    ("signal-with-start-payload", "/workflows/park/signal-with-start",
     b'{"workflow_id": "r-5", "signal": "go", "payload": {"n": 1, "n": 2}}',
     "the body repeats the key 'n' in one object"),
    ("decision-top", "/workflows/{review}/interrupts/manager_review/decision",
     b'{"action": "approve", "decision_id": "d-1", "actor": "ann", "action": "reject"}',
     "the body repeats the key 'action' in one object"),
    ("decision-payload", "/workflows/{review}/interrupts/manager_review/decision",
     b'{"action": "edit", "decision_id": "d-2", "actor": "ann",'
     b' "payload": {"amount": 5, "reason": "travel", "amount": 500}}',
     "the body repeats the key 'amount' in one object"),
    ("query-argument", "/workflows/{cart}/query/contents", b'{"a": 1, "a": 2}',
     "the query argument repeats the key 'a' in one object"),
    ("update-argument", "/workflows/{cart}/update/add_item?wait=0",
     b'{"sku": "pen", "quantity": 1, "quantity": 100}',
     "the update argument repeats the key 'quantity' in one object"),
    ("update-with-start-top", "/workflows/cart/update-with-start?wait=0",
     b'{"workflow_id": "c-r", "input": {"customer": "c"}, "update": "add_item",'
     b' "argument": {"sku": "a", "quantity": 1}, "workflow_id": "c-s"}',
     "the body repeats the key 'workflow_id' in one object"),
    ("update-with-start-argument", "/workflows/cart/update-with-start?wait=0",
     b'{"workflow_id": "c-t", "input": {"customer": "c"}, "update": "add_item",'
     b' "argument": {"sku": "a", "sku": "b", "quantity": 1}}',
     "the body repeats the key 'sku' in one object"),
]


def test_a_key_twice_in_one_object_is_refused_on_every_json_route_and_stores_nothing(
    api: Api, shard_map: ShardMap, start_worker: StartWorker,
) -> None:
    from ..app import registry

    start_worker(registry)
    run = start_park(api, "dup-1")
    cart = api.http.post("/workflows/cart/start", json={
        "workflow_id": "dup-2", "input": {"customer": "ann"}}).json()["execution_id"]
    review = api.http.post("/workflows/proposal_review/start", json={
        "workflow_id": "dup-3", "input": {"amount": 5}}).json()["execution_id"]
    wait_until(lambda: api.http.get("/interrupts").json()["items"], what="the interrupt")
    def parked() -> bool:  # nothing of the worker's left to write during the table
        return all(api.http.get(f"/workflows/{r}").json()["state"] == "waiting"
                   for r in (run, cart))

    wait_until(parked, what="the parked runs")
    before = counts(shard_map)
    for case, path, body, refusal in REPEATED_KEYS:
        target = path.format(run=run, cart=cart, review=review)
        answer = api.http.post(target, content=body,
                               headers={"Content-Type": "application/json"})
        assert (answer.status_code, answer.json()) == (400, {"error": refusal}), case
    assert counts(shard_map) == before
    assert [i["execution_id"] for i in api.http.get("/interrupts").json()["items"]] == [review]


def test_the_urls_serve_prints_lead_somewhere(
    shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path
) -> None:
    _, server = start_api(daemons, shard_map, tmp_path, {TOKEN: "acme"})
    printed = re.findall(r"^(shardq API on|inbox at) (\S+)$", server.stderr(), re.M)
    assert [what for what, _ in printed] == ["shardq API on", "inbox at"], server.stderr()
    (_, root), (_, inbox) = printed
    with httpx.Client(timeout=30) as http:
        index = http.get(root)  # no token: a newcomer opens the printed URL first
        assert index.status_code == 200, index.text
        named = index.json()
        assert {key: named[key] for key in ("openapi", "healthz", "inbox")} == {
            "openapi": "/api/shardq/openapi.json", "healthz": "/api/shardq/healthz",
            "inbox": "/inbox"}
        for path in (named["openapi"], named["healthz"]):
            assert http.get(httpx.URL(root).join(path)).status_code == 200, path
        assert http.get(root + "/").json() == named
        page = http.get(inbox, follow_redirects=True)
        assert page.status_code == 200 and "Sign in" in page.text
        assert str(page.url) == str(httpx.URL(root).join(named["inbox"])) + "/login"


def test_an_unknown_body_key_is_named_and_nothing_starts(api: Api) -> None:
    typo = api.http.post("/workflows/park/start",
                         json={"workflow_id": "typo-1", "inputs": {"n": 1}, "zz": 1})
    assert typo.status_code == 400
    assert typo.json() == {
        "error": "unknown keys in the body: inputs, zz",
        "violations": [
            {"message": "unknown key 'inputs' (did you mean 'input'?); expected input, "
                        "priority, workflow_id", "field_path": "/inputs"},
            {"message": "unknown key 'zz'; expected input, priority, workflow_id",
             "field_path": "/zz"}]}
    assert api.http.get("/workflows", params={"workflow": "park"}).json()["items"] == []
    # The document says the same: these bodies take no other key.
    paths = api.http.get("/openapi.json").json()["paths"]
    bodies = [operation["requestBody"]["content"]["application/json"]["schema"]
              for operations in paths.values() for operation in operations.values()
              if operation.get("requestBody") and operation["operationId"] in (
                  "start", "signalWithStart", "updateWithStart", "decide")]
    assert len(bodies) == 4
    assert all(body["additionalProperties"] is False for body in bodies)


def test_published_contracts_over_http(api: Api, start_worker: StartWorker) -> None:
    from ..app import CART_ITEM, registry

    interface = api.http.get("/workflows/registered/cart/interface").json()
    assert [u["name"] for u in interface["updates"]] == ["add_item"]
    assert interface["updates"][0]["schema"] == CART_ITEM
    assert [s["name"] for s in interface["signals"]] == ["payment_captured"]
    assert "response_schema" not in interface["signals"][0]
    refused = api.http.post("/workflows/cart/start", json={"workflow_id": "c-1", "input": {}})
    assert (refused.status_code, refused.json()) == (400, {
        "error": "input validation failed",
        "violations": [{"message": "'customer' is a required property",
                        "field_path": "/customer"}]})
    made = api.http.post("/workflows/cart/start",
                         json={"workflow_id": "c-1", "input": {"customer": "ann"}})
    cart = made.json()["execution_id"]
    # No worker yet: the query replays committed history; the update is stored, not handled.
    contents = api.http.post(f"/workflows/{cart}/query/contents")
    assert (contents.status_code, contents.json()["result"]["status"]) == (200, "open")
    pen = {"sku": "pen", "quantity": 2}
    pending = api.http.post(f"/workflows/{cart}/update/add_item", json=pen,
                            params={"wait": "0.2"}, headers={"Idempotency-Key": "add-pen"})
    assert (pending.status_code, pending.json()["completed"]) == (202, False)
    start_worker(registry)
    done = api.http.post(f"/workflows/{cart}/update/add_item", json=pen,
                         headers={"Idempotency-Key": "add-pen"})
    assert done.status_code == 200, done.text
    assert (done.json()["response"], done.json()["update_id"], done.json()["accepted"]) == (
        1, pending.json()["update_id"], False)
    twice = api.http.post(f"/workflows/{cart}/update/add_item", json=pen)
    assert (twice.status_code, twice.json()["reason_code"]) == (422, "rejected")
    assert "pen is already in the cart" in twice.json()["error"]
    missing = api.http.post(f"/workflows/{cart}/query/item", content=b"7")
    assert (missing.status_code, missing.json()["reason_code"]) == (422, "query_failed")
    assert api.http.post(f"/workflows/{cart}/query/item", content=b"0").json() == {
        "result": "pen"}
    bad = api.http.post(f"/workflows/{cart}/update/add_item", json={"sku": "ink"})
    assert (bad.status_code, bad.json()["error"]) == (400, "update payload validation failed")
    assert bad.json()["violations"] == [{"message": "'quantity' is a required property",
                                         "field_path": "/quantity"}]
    started = api.http.post("/workflows/cart/update-with-start", json={
        "workflow_id": "c-2", "input": {"customer": "bob"}, "update": "add_item",
        "argument": {"sku": "cup", "quantity": 1}, "idempotency_key": "c2-cup"})
    assert (started.status_code, started.json()["response"]) == (201, 1), started.text
    again = api.http.post("/workflows/cart/update-with-start", json={
        "workflow_id": "c-2", "input": {"customer": "bob"}, "update": "add_item",
        "argument": {"sku": "cup", "quantity": 1}, "idempotency_key": "c2-cup"})
    assert (again.status_code, again.json()["accepted"]) == (200, False)

    unpaid = api.http.post(f"/workflows/{cart}/signal/payment_captured", content=b"{}")
    assert (unpaid.status_code, unpaid.json()["error"]) == (400,
                                                            "signal payload validation failed")
    paid = api.http.post(f"/workflows/{cart}/signal/payment_captured",
                         content=b'{"amount": 9.5}')
    assert paid.status_code == 202
    wait_until(lambda: api.http.get(f"/workflows/{cart}").json()["state"] == "completed",
               what="the cart shipped")
    finished = api.http.post(f"/workflows/{cart}/query/contents").json()["result"]
    assert finished == {"customer": "ann", "status": "shipped", "items": [pen]}
    late = api.http.post(f"/workflows/{cart}/update/add_item", json=pen)
    assert (late.status_code, late.json()["reason_code"]) == (409, "run_finished")
    theirs = api.other.post(f"/workflows/{cart}/query/contents")
    assert (theirs.status_code, theirs.json()) == (404, {"error": "execution not found"})


def test_several_server_processes_share_the_port_and_stop_together(
    shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path
) -> None:
    base, server = start_api(daemons, shard_map, tmp_path, {TOKEN: "acme"}, "--workers", "2")
    children = {pid: _started(pid) for pid in subprocess.run(
        ["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True, check=False,
    ).stdout.split()}
    assert len(children) >= 2  # uvicorn's supervisor and its worker processes
    with httpx.Client(base_url=base + ROOT_PATH, timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        made = [http.post("/workflows/park/start", json={"workflow_id": f"w-{i}"})
                for i in range(20)]
        assert {m.status_code for m in made} == {201}
        run = made[0].json()["execution_id"]
        sent = http.post(f"/workflows/{run}/signal/go", content=b"1",
                         headers={"Idempotency-Key": "k"})
        assert sent.json() == {"ok": True, "signal_delivered": True}
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit(30) == 0

    def lingering() -> list[str]:
        """Children still running: the same pid and start time (pid_max is 32,768 and
        the suite spawns thousands of processes, so a pid comes round again), not a
        zombie."""
        return [pid for pid, started in children.items() if _started(pid) == started
                and "zombie" not in _status(pid)]

    # No worker process outlives the server. multiprocessing's resource tracker,
    # one of the children, exits once it reads its parent's end of file: allow
    # it that moment, which on a loaded machine is not instant.
    wait_until(lambda: not lingering(), timeout=10, what="the server's children to exit")


def _status(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def _started(pid: str) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError):
        return None
