"""The embedding example (examples/payment_webhook.py) against real shards: its webhook
wakes a `checkout` run parked on its payment, a redelivered event is stored once (also
when copies arrive at once), every unusable request gets its status and one JSON error
and stores nothing, and `uvicorn` serves it from the shards of SHARDQ_SHARDS."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NamedTuple

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from starlette.applications import Starlette

from shardq.bin.examples import registry
from shardq.client.async_client import AsyncClient
from shardq.client.client import Client
from shardq.core.models import State
from shardq.examples.payment_webhook import MAX_BODY, create_app
from shardq.shards.config import ShardMap
from shardq.shards.routing import new_execution_id
from shardq.worker.worker import Worker

from ..support import all_rows, free_port, wait_until

URL = "/webhooks/payment"
ORDER = {"order_id": "o-1", "items": [{"sku": "tea", "quantity": 2}]}
JSON = {"content-type": "application/json"}
StartWorker = Callable[..., Worker]


class Webhook:
    """The application on an event loop of its own thread, called in-process over httpx's
    ASGI transport, so a test drives it, a worker and the blocking Client side by side."""

    def __init__(self, portal: BlockingPortal, http: httpx.AsyncClient) -> None:
        self.portal = portal
        self.http = http

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.portal.call(partial(self.http.request, method, path, **kwargs))

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


@contextlib.contextmanager
def served(app: Starlette) -> Iterator[Webhook]:
    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[httpx.AsyncClient]:
        # The lifespan as a server runs it: the AsyncClient opens once, before any request.
        async with (app.router.lifespan_context(app),
                    httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                      base_url="http://shop.test") as http):
            yield http

    with start_blocking_portal() as portal, portal.wrap_async_context_manager(opened()) as http:
        yield Webhook(portal, http)


@pytest.fixture
def webhook(shard_map: ShardMap) -> Iterator[Webhook]:
    """The example's application over the test's shards."""
    with served(create_app(shard_map)) as http:
        yield http


def event(run: object, event_id: str = "evt_1", **data: Any) -> dict[str, Any]:
    return {"id": event_id, "type": "payment.captured",
            "data": {"execution_id": str(run), "amount": 42.5, **data}}


def signals(shard_map: ShardMap) -> int:
    return sum(n for (n,) in all_rows(shard_map, "SELECT count(*) FROM shardq.signals"))


def parked(client: Client, run: uuid.UUID) -> None:
    def on_payment() -> bool:
        wait, _ = client.waiting(run)
        return wait is not None and wait.name == "payment_captured"

    wait_until(on_payment, what="the checkout run to park on its payment")


def test_the_webhook_wakes_the_parked_run_and_a_redelivery_stores_nothing(
    webhook: Webhook, client: Client, shard_map: ShardMap, start_worker: StartWorker,
) -> None:
    start_worker(registry)
    run = client.start("checkout", "o-1", ORDER).execution_id
    parked(client, run)

    first = webhook.post(URL, json=event(run))
    assert first.status_code == 200, first.text
    answer = first.json()
    assert (answer["ok"], answer["duplicate"], answer["execution_id"]) == (True, False, str(run))
    again = webhook.post(URL, json=event(run, amount=99))  # the same event, redelivered
    assert again.status_code == 200, again.text
    assert again.json() == {**answer, "duplicate": True}
    assert signals(shard_map) == 1

    done = client.wait(run)
    assert done.state is State.COMPLETED
    assert done.output["payment"] == {"amount": 42.5, "event": "evt_1"}  # the first one's
    assert done.output["shipment"]["paid"] == 42.5

    # A retry after the run finished is still a duplicate (a 2xx: the provider stops);
    # a new event for it is refused, not stored.
    late = webhook.post(URL, json=event(run))
    assert (late.status_code, late.json()["duplicate"]) == (200, True)
    refused = webhook.post(URL, json=event(run, event_id="evt_2"))
    assert refused.status_code == 409, refused.text
    assert list(refused.json()) == ["error"]
    assert signals(shard_map) == 1


def test_copies_of_one_event_at_once_store_one_signal_over_one_client(
    shard_map: ShardMap, client: Client, monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[ShardMap] = []
    connect = AsyncClient.connect

    def counted(shards: ShardMap, *args: Any, **kwargs: Any) -> AsyncClient:
        opened.append(shards)
        return connect(shards, *args, **kwargs)

    monkeypatch.setattr(AsyncClient, "connect", counted)
    run = client.start("checkout", "o-2", ORDER).execution_id
    with served(create_app(shard_map)) as http, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: http.post(URL, json=event(run, "evt_c")), range(16)))
    assert [a.status_code for a in answers] == [200] * 16
    assert sorted(a.json()["duplicate"] for a in answers) == [False] + [True] * 15
    assert len({a.json()["signal_id"] for a in answers}) == 1
    assert signals(shard_map) == 1
    assert opened == [shard_map]  # opened by the lifespan, not per request


def test_other_event_types_are_acknowledged_and_ignored(
    webhook: Webhook, client: Client, shard_map: ShardMap,
) -> None:
    run = client.start("checkout", "o-3", ORDER).execution_id
    answer = webhook.post(URL, json={**event(run), "type": "payment.refunded"})
    assert (answer.status_code, answer.json()) == (200, {"ok": True,
                                                          "ignored": "payment.refunded"})
    assert signals(shard_map) == 0


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _without(key: str, where: str = "") -> Callable[[str], bytes]:
    def body(run: str) -> bytes:
        sent = event(run)
        (sent["data"] if where else sent).pop(key)
        return _json(sent)
    return body


async def _stream(body: bytes) -> AsyncIterator[bytes]:
    """`body` in chunks, sent chunked: no Content-Length to refuse it by."""
    for start in range(0, len(body), 8192):
        yield body[start:start + 8192]


def _with(**fields: Any) -> Callable[[str], bytes]:
    return lambda run: _json({**event(run), **fields})


def _with_data(**data: Any) -> Callable[[str], bytes]:
    return lambda run: _json(event(run, **data))


UNKNOWN_RUN = str(new_execution_id(0))
BIG = MAX_BODY + 1


class Hostile(NamedTuple):
    name: str
    body: Callable[[str], Any]
    """What is sent, made from the run's id (an async iterator: sent chunked)."""
    headers: dict[str, str]
    status: int
    error: str
    """A part of the error's message."""


HOSTILE = [Hostile(*case) for case in [
    ("not-json", lambda run: b"{'id': 'evt_1'}", JSON, 400, "not valid JSON"),
    ("not-utf8", lambda run: b'{"id": "evt_\xff"}', JSON, 400, "not UTF-8"),
    ("empty", lambda run: b"", JSON, 400, "JSON object"),
    ("json-array", lambda run: _json([event(run)]), JSON, 400, "JSON object"),
    ("nan-amount", lambda run: _json(event(run)).replace(b"42.5", b"NaN"), JSON, 400,
     "not valid JSON"),
    # Which amount was meant? json.loads would take the last one and deliver it.
    ("repeated-amount", lambda run: _json(event(run)).replace(
        b'"amount": 42.5', b'"amount": 42.5, "amount": 4250'), JSON, 400,
     "the body repeats the key 'amount' in one object"),
    ("missing-id", _without("id"), JSON, 422, "id must be a non-empty string"),
    ("blank-id", _with(id=" \t"), JSON, 422, "id must be a non-empty string"),
    ("number-id", _with(id=7), JSON, 422, "id must be a non-empty string"),
    ("nul-in-id", _with(id="evt_\u0000x"), JSON, 422, "NUL"),
    ("overlong-id", _with(id="e" * 300), JSON, 422, "at most 255"),
    ("missing-type", _without("type"), JSON, 422, "type must be a non-empty string"),
    ("data-not-object", _with(data=["x"]), JSON, 422, "data must be an object"),
    ("missing-execution-id", _without("execution_id", "data"), JSON, 422,
     "data.execution_id must be"),
    ("malformed-execution-id", _with_data(execution_id="run-1"), JSON, 422,
     "is not an execution id"),
    ("uuid4-execution-id", _with_data(execution_id=str(uuid.uuid4())), JSON, 422,
     "not a shardq execution id"),
    ("unknown-run", _with_data(execution_id=UNKNOWN_RUN), JSON, 404, "not found"),
    ("missing-amount", _without("amount", "data"), JSON, 422, "amount"),
    ("string-amount", _with_data(amount="42.5"), JSON, 422, "positive number"),
    ("bool-amount", _with_data(amount=True), JSON, 422, "positive number"),
    ("zero-amount", _with_data(amount=0), JSON, 422, "positive number"),
    ("negative-amount", _with_data(amount=-1), JSON, 422, "positive number"),
    # Well-formed but too big: refused by size alone, else it would be delivered.
    ("huge-body", lambda run: _json({**event(run), "pad": "x" * BIG}), JSON, 413, "larger"),
    ("huge-body-unannounced", lambda run: _stream(_json({**event(run), "pad": "x" * BIG})),
     JSON, 413, "larger"),
    ("text-plain", lambda run: _json(event(run)), {"content-type": "text/plain"}, 415,
     "application/json"),
    ("form", lambda run: _json(event(run)),
     {"content-type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ("no-content-type", lambda run: _json(event(run)), {}, 415, "application/json"),
]]


@pytest.mark.parametrize("case", HOSTILE, ids=[case.name for case in HOSTILE])
def test_a_hostile_request_gets_its_status_one_json_error_and_stores_nothing(
    webhook: Webhook, client: Client, shard_map: ShardMap, case: Hostile,
) -> None:
    run = client.start("checkout", "o-4", ORDER).execution_id
    answer = webhook.post(URL, content=case.body(str(run)), headers=case.headers)
    assert answer.status_code == case.status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert list(answer.json()) == ["error"], answer.text
    assert case.error in answer.json()["error"]
    assert signals(shard_map) == 0
    assert client.get(run).state is State.PENDING


@pytest.mark.parametrize(("method", "path", "status"),
                         [("GET", URL, 405), ("POST", "/webhooks/refund", 404)])
def test_other_routes_answer_one_json_error(
    webhook: Webhook, method: str, path: str, status: int,
) -> None:
    answer = webhook.request(method, path, json={})
    assert answer.status_code == status
    assert list(answer.json()) == ["error"]


def test_a_shard_that_is_down_is_a_503_naming_no_address() -> None:
    """The provider retries a 5xx; the shard's host and port are not the provider's to see."""
    nowhere = ShardMap.from_urls([f"postgresql://postgres@127.0.0.1:{free_port()}/shardq_x"])
    with served(create_app(nowhere)) as http:
        answer = http.post(URL, json=event(new_execution_id(0)))
    assert answer.status_code == 503, answer.text
    assert answer.json() == {"error": "the run's shard is unavailable: retry later"}


def test_uvicorn_serves_it_from_the_shards_the_cli_reads(
    shard_map: ShardMap, client: Client, tmp_path: Any,
) -> None:
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")},
           "SHARDQ_SHARDS": ",".join(s.url for s in shard_map.shards)}
    with (tmp_path / "uvicorn.err").open("wb") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "shardq.examples.payment_webhook:app",
             "--port", str(port)],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        run = client.start("checkout", "o-5", ORDER).execution_id

        def answered() -> httpx.Response | None:
            assert server.poll() is None, (tmp_path / "uvicorn.err").read_text()
            try:
                return httpx.post(f"http://127.0.0.1:{port}{URL}", json=event(run), timeout=5)
            except httpx.TransportError:
                return None

        answer = wait_until(answered, timeout=30, what="uvicorn to serve the example")
        assert answer.status_code == 200, answer.text
        assert answer.json()["duplicate"] is False
        assert signals(shard_map) == 1
    finally:
        server.terminate()
        server.wait(10)
