"""A payment provider's webhook that wakes the `checkout` run waiting for its payment.

    SHARDQ_SHARDS=postgresql://... uvicorn shardq.examples.payment_webhook:app

The provider POSTs {"id": "evt_...", "type": "payment.captured", "data":
{"execution_id": "<the checkout run>", "amount": 42.5}} to /webhooks/payment. The
run gets the signal `payment_captured`, keyed by the event id: providers redeliver
until they see a 2xx, and a redelivery is stored once and answered 200 with
"duplicate": true. Other event types are acknowledged and ignored.

What cannot be used gets one JSON error {"error": "..."}: 415 not application/json,
413 a body over MAX_BODY, 400 not a JSON object, 422 a field missing or wrong, 404 no
such run, 409 the run cannot take the signal (it has finished), 503 a shard is down
(the provider will retry).

A real endpoint first checks the provider's signature over the raw body (its scheme
is the provider's own); it is left out here.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from shardq.bin.examples import registry
from shardq.bin.loading import shard_map_of
from shardq.client.async_client import AsyncClient
from shardq.core.errors import ExecutionNotFound, InvalidArgument, SignalRefused
from shardq.core.rules import RuleBroken, json_value
from shardq.shards.config import ShardMap
from shardq.shards.errors import NotOwner, ShardUnavailable
from shardq.shards.routing import InvalidExecutionId, parse_execution_id

MAX_BODY = 64 << 10
"""Bytes read at most: a payment event is a few hundred."""
CAPTURED, SIGNAL = "payment.captured", "payment_captured"


class Refused(Exception):
    """A request this endpoint will not use: `status` and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def payment_webhook(request: Request) -> JSONResponse:
    """Signal the run the event names, the event id as the idempotency key."""
    event = await _event(request)
    event_id, kind = _text(event, "id"), _text(event, "type")
    if kind != CAPTURED:
        return JSONResponse({"ok": True, "ignored": kind})
    data = event.get("data")
    if not isinstance(data, dict):
        raise Refused(422, "data must be an object")
    try:
        run = parse_execution_id(_text(data, "execution_id", "data."))
    except InvalidExecutionId as exc:
        raise Refused(422, f"data.execution_id: {exc}") from None
    amount = data.get("amount")
    # `checkout` ships on this amount: refused here, not by a failed step later.
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount <= 0:
        raise Refused(422, "data.amount must be a positive number")
    client: AsyncClient = request.app.state.client
    result = await client.signal(run, SIGNAL, {"amount": amount, "event": event_id},
                                 idempotency_key=event_id)
    return JSONResponse({"ok": True, "duplicate": not result.delivered,
                         "execution_id": str(run), "signal_id": result.signal_id})


async def _event(request: Request) -> dict[str, Any]:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise Refused(415, "the body must be application/json")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise Refused(413, f"the body is larger than {MAX_BODY} bytes")
    body = bytearray()
    async for chunk in request.stream():  # a body sent without a length is bounded too
        body += chunk
        if len(body) > MAX_BODY:
            raise Refused(413, f"the body is larger than {MAX_BODY} bytes")
    try:
        event = json_value(bytes(body), "the body")  # strict: UTF-8, no NaN
    except RuleBroken as exc:
        raise Refused(400, str(exc)) from None
    if not isinstance(event, dict):
        raise Refused(400, "the body must be a JSON object")
    return event


def _text(fields: dict[str, Any], key: str, where: str = "") -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value.strip():
        raise Refused(422, f"{where}{key} must be a non-empty string")
    return value  # the rest (no NUL, a bounded length) is the client's to check


async def _error(request: Request, exc: Exception) -> JSONResponse:
    """One JSON error per refusal; a shard's name and address stay inside."""
    status, message = 500, "internal error"
    if isinstance(exc, Refused):
        status, message = exc.status, str(exc)
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, exc.detail
    elif isinstance(exc, ExecutionNotFound):
        status, message = 404, str(exc)
    elif isinstance(exc, SignalRefused):
        status, message = 409, str(exc)
    elif isinstance(exc, InvalidArgument):
        status, message = 422, str(exc)
    elif isinstance(exc, ShardUnavailable | NotOwner):  # NotOwner: a move held it too long
        status, message = 503, "the run's shard is unavailable: retry later"
    return JSONResponse({"error": message}, status_code=status)


REFUSALS = (Refused, HTTPException, ExecutionNotFound, SignalRefused, InvalidArgument,
            ShardUnavailable, NotOwner, Exception)
"""What _error answers. Exception is Starlette's last resort: answered, then re-raised for
the server's log."""


def create_app(shard_map: ShardMap | None = None) -> Starlette:
    """The application over `shard_map`, else the shards the `shardq` command would use
    (SHARDQ_SHARDS_FILE, else SHARDQ_SHARDS), read when it starts."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # One client, so one set of connection pools, for every request served.
        shards_file = os.environ.get("SHARDQ_SHARDS_FILE")
        shards = (shard_map if shard_map is not None
                  else shard_map_of(None, Path(shards_file) if shards_file else None))
        async with AsyncClient.connect(shards, registry) as client:
            app.state.client = client
            yield

    return Starlette(
        routes=[Route("/webhooks/payment", payment_webhook, methods=["POST"])],
        lifespan=lifespan,
        exception_handlers={kind: _error for kind in REFUSALS},
    )


app = create_app()
