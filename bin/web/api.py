"""The HTTP management API (`shardq serve`): thin routes over the Client, one rule set.

Every route is scoped to the tenant of its bearer token (bin/web/tokens.py);
another tenant's run is answered exactly as an unknown one. Client mistakes
are 4xx with one JSON error object, never a 500 and never a traceback: bad
JSON (a key twice in one object included) 400, wrong content type 415, a body
over MAX_BODY 413, no or a bad token 401. Validation failures carry `violations`
({"message", "field_path"}); their messages echo the caller's input, so a UI
must escape them.

The routes are the table ROUTES: one module-level handler each, reading the
application's client and tokens from `shared(request)` (bin/web/state.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shardq.bin.web import rules
from shardq.bin.web.openapi import BODY_KEYS, PREFIX
from shardq.bin.web.refusals import refusal_body, status_of
from shardq.bin.web.state import shared
from shardq.bin.web.tokens import tenant_for
from shardq.client.bulk import DEFAULT_MAX_RUNS
from shardq.client.requests import DEFAULT_UPDATE_WAIT
from shardq.core.errors import SignalRefused
from shardq.core.models import Event, Execution, UpdateResult
from shardq.core.rules import MAX_WAIT, Limits, parse_moment
from shardq.shards.config import ShardMap
from shardq.shards.routing import InvalidExecutionId, parse_execution_id

log = logging.getLogger(__name__)

MAX_BODY = Limits().max_input_bytes + (64 << 10)
"""The largest body read: a run's input at its bound plus room for the envelope."""
IDEMPOTENCY_HEADER = b"idempotency-key"


class ApiError(Exception):
    def __init__(self, status: int, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.details = details


def _tenant_of(request: Request, tokens: list[tuple[str, str]]) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise ApiError(401, "a bearer token is required")
    tenant = tenant_for(presented, tokens)
    if tenant is None:
        raise ApiError(401, "the token is not valid")
    return tenant


# -- request parts ---------------------------------------------------------------


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise ApiError(413, f"the body is larger than {MAX_BODY} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_object(request: Request, operation: str) -> dict[str, Any]:
    """The body of `operation`: a JSON object holding only the keys its document names.

    A key it does not name is refused, never ignored: `inputs` for `input` would
    otherwise start a run without its input."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise ApiError(415, "the body must be application/json")
    value = rules.json_value(await _body(request), "the body")
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    known = BODY_KEYS[operation]
    unknown = sorted(set(value) - known)
    if unknown:
        raise ApiError(400, f"unknown key{'s' if len(unknown) > 1 else ''} in the body: "
                            f"{', '.join(unknown)}",
                       violations=[_unknown_key(key, known) for key in unknown])
    return value


def _unknown_key(key: str, known: frozenset[str]) -> dict[str, str]:
    from difflib import get_close_matches

    close = get_close_matches(key, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return {"message": f"unknown key {key!r}{hint}; expected {', '.join(sorted(known))}",
            "field_path": "/" + key.replace("~", "~0").replace("/", "~1")}


def _field(body: dict[str, Any], name: str, kind: type, *, required: bool = True) -> Any:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ApiError(400, f"`{name}` must be a {kind.__name__}")
    return value


def _idempotency_key(request: Request) -> str | None:
    """The header wins over `?idempotency_key=`; either, when present, must be usable."""
    raw = [v for k, v in request.headers.raw if k.lower() == IDEMPOTENCY_HEADER]
    # Both are read by the rules, so a blank one is refused even where the other wins.
    query = rules.idempotency_key(request.query_params.get("idempotency_key"),
                                  "idempotency_key")
    if raw:
        return rules.idempotency_key(raw[0], "the Idempotency-Key header")
    return query


def _execution_id(request: Request) -> Any:
    try:
        return parse_execution_id(request.path_params["execution_id"])
    except InvalidExecutionId:
        raise ApiError(404, "execution not found") from None


def _limit(request: Request) -> int:
    """`?limit=` items a page holds (default 100; the client refuses it outside 1..1000)."""
    limit = request.query_params.get("limit", "100")
    if not limit.isdigit():
        raise ApiError(400, "limit must be an integer within 1..1000")
    return int(limit)


def _wait(request: Request) -> float:
    """`?wait=` seconds an update call waits for its response (default 30, at most 600)."""
    raw = request.query_params.get("wait")
    if raw is None:
        return DEFAULT_UPDATE_WAIT
    try:
        wait = float(raw)
    except ValueError:
        raise ApiError(400, "wait must be a number of seconds within 0..600") from None
    if not 0 <= wait <= MAX_WAIT:
        raise ApiError(400, "wait must be a number of seconds within 0..600")
    return wait


def _update_result(result: UpdateResult) -> dict[str, Any]:
    return {"execution_id": str(result.execution_id), "update_id": result.update_id,
            "completed": True, "response": result.response, "accepted": result.accepted}


def _execution(e: Execution) -> dict[str, Any]:
    return {"execution_id": str(e.id), "workflow": e.workflow_name,
            "workflow_version": e.workflow_version, "workflow_id": e.workflow_id,
            "state": e.state.value, "input": e.input, "output": e.output, "error": e.error,
            "cancel_requested": e.cancel_requested, "created_at": e.created_at.isoformat(),
            "priority": e.priority, "concurrency_key": e.concurrency_key,
            "waiting_for_slot": e.waiting_for_slot, "build_id": e.build_id, "pinned": e.pinned,
            "attributes": e.attributes,
            "finished_at": e.finished_at.isoformat() if e.finished_at else None}


# -- the routes ------------------------------------------------------------------


Handler = Callable[[Request, str], Awaitable[Response]]
"""A route's body: the request and the tenant its token names."""


def _api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A route: the tenant from the bearer token, every failure answered as a refusal."""

    async def endpoint(request: Request) -> Response:
        state = shared(request)
        try:
            return await handler(request, _tenant_of(request, state.tokens))
        except Exception as exc:
            return _refusal(request, exc, state.map)

    return endpoint


@_api
async def start(request: Request, tenant: str) -> Response:
    client = shared(request).client
    body = await _json_object(request, "start")
    workflow_id = _field(body, "workflow_id", str)
    result = await client.start(request.path_params["name"], workflow_id, body.get("input"),
                                tenant=tenant, priority=_field(body, "priority", int,
                                                               required=False))
    return JSONResponse({"execution_id": str(result.execution_id),
                         "created": result.created}, 201 if result.created else 200)


@_api
async def signal(request: Request, tenant: str) -> Response:
    state = shared(request)
    client = state.client
    ident = _execution_id(request)
    key = _idempotency_key(request)
    payload = rules.json_value(await _body(request), "the signal payload")
    result = await rules.send_signal_async(state.signals, ident,
                                           request.path_params["signal_name"], payload, key,
                                           tenant)
    if isinstance(result.error, SignalRefused):
        run = await client.get(ident, tenant=tenant)
        return JSONResponse({"error": str(result.error), "state": run.state.value,
                             "reason_code": result.error.reason_code}, 409)
    if result.error is not None:
        raise result.error
    return JSONResponse({"ok": True, "signal_delivered": result.delivered}, 202)


@_api
async def signal_with_start(request: Request, tenant: str) -> Response:
    client = shared(request).client
    body = await _json_object(request, "signalWithStart")
    result = await client.signal_with_start(
        request.path_params["name"],
        _field(body, "workflow_id", str), body.get("input"), _field(body, "signal", str),
        body.get("payload"), idempotency_key=_field(body, "idempotency_key", str,
                                                      required=False), tenant=tenant,
        priority=_field(body, "priority", int, required=False))
    return JSONResponse({"execution_id": str(result.execution_id),
                         "created": result.created, "signal_delivered": result.delivered},
                        201 if result.created else 202)


@_api
async def decide(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    body = await _json_object(request, "decide")
    result = await client.decide(
        ident, request.path_params["name"], _field(body, "action", str),
        body.get("payload"), decision_id=_field(body, "decision_id", str),
        actor=_field(body, "actor", str), tenant=tenant)
    return JSONResponse({"accepted": result.accepted, "decision": result.decision.as_json()})


@_api
async def query(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    argument = rules.json_value(await _body(request), "the query argument")
    result = await client.query(ident, request.path_params["name"], argument, tenant=tenant)
    return JSONResponse({"result": result})


@_api
async def update(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    key = _idempotency_key(request)
    wait = _wait(request)
    argument = rules.json_value(await _body(request), "the update argument")
    result = await client.update(ident, request.path_params["name"], argument,
                                 idempotency_key=key, tenant=tenant, wait=wait)
    return JSONResponse(_update_result(result))


@_api
async def update_with_start(request: Request, tenant: str) -> Response:
    client = shared(request).client
    body = await _json_object(request, "updateWithStart")
    key = _field(body, "idempotency_key", str, required=False)
    key = rules.idempotency_key(key, "idempotency_key")
    wait = _wait(request)
    result = await client.update_with_start(
        request.path_params["name"], _field(body, "workflow_id", str),
        body.get("input"), _field(body, "update", str), body.get("argument"),
        idempotency_key=key, tenant=tenant, wait=wait,
        priority=_field(body, "priority", int, required=False))
    return JSONResponse({**_update_result(result), "created": result.created},
                        201 if result.created else 200)


@_api
async def interface(request: Request, tenant: str) -> Response:
    return JSONResponse(shared(request).client.interface(request.path_params["name"]))


@_api
async def cancel(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    state = await client.cancel(ident, tenant=tenant)
    return JSONResponse({"execution_id": str(ident), "state": state.value})


@_api
async def set_priority(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    priority = _field(await _json_object(request, "setPriority"), "priority", int)
    state = await client.set_priority(ident, priority, tenant=tenant)
    return JSONResponse({"execution_id": str(ident), "priority": priority,
                         "state": state.value})


@_api
async def listing(request: Request, tenant: str) -> Response:
    client = shared(request).client
    q = request.query_params
    limit = _limit(request)
    state = q.get("state")  # checked by the client
    priority = q.get("priority")
    if priority is not None and not (priority.isascii() and priority.isdigit()):
        raise ApiError(400, "priority must be a whole number within 0..9")
    after, before = (None if q.get(name) is None else parse_moment(q[name], name)
                     for name in ("created_after", "created_before"))
    page = await client.list_runs(tenant=tenant, state=state, workflow=q.get("workflow"),
                                  limit=limit, cursor=q.get("cursor"),
                                  priority=None if priority is None else int(priority),
                                  created_after=after, created_before=before,
                                  where=q.getlist("where") or None)
    return JSONResponse({"items": [_execution(e) for e in page.items],
                         "next_cursor": page.next_cursor})


@_api
async def counts(request: Request, tenant: str) -> Response:
    counted = await shared(request).client.count_runs(
        tenant=tenant, workflow=request.query_params.get("workflow"),
        where=request.query_params.getlist("where") or None)
    answer = counted.as_json()
    del answer["unavailable_shards"]  # a shard down is a 503 here, as for a page
    return JSONResponse(answer)


def _bulk(body: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A bulk action's filters and bound from its body (client/bulk.py checks them)."""
    # The state and `where` are checked by the client, as a page's.
    after, before = (None if body.get(name) is None
                     else parse_moment(_field(body, name, str), name)
                     for name in ("created_after", "created_before"))
    max_runs = _field(body, "max_runs", int, required=False)
    return {"tenant": tenant, "state": _field(body, "state", str, required=False),
            "workflow": _field(body, "workflow", str, required=False),
            "where": body.get("where"), "created_after": after, "created_before": before,
            "dry_run": bool(_field(body, "dry_run", bool, required=False)),
            "max_runs": DEFAULT_MAX_RUNS if max_runs is None else max_runs}


@_api
async def cancel_matching(request: Request, tenant: str) -> Response:
    body = await _json_object(request, "cancelMatching")
    result = await shared(request).client.cancel_matching(
        actor=_field(body, "actor", str, required=False), **_bulk(body, tenant))
    return JSONResponse(result.as_json())


@_api
async def signal_matching(request: Request, tenant: str) -> Response:
    body = await _json_object(request, "signalMatching")
    result = await shared(request).client.signal_matching(
        _field(body, "name", str), body.get("payload"),
        idempotency_key=_field(body, "idempotency_key", str, required=False),
        **_bulk(body, tenant))
    return JSONResponse(result.as_json())


@_api
async def show(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    view = await client.describe(ident, tenant=tenant)
    execution, wait, buffered, events = (view.execution, view.wait, view.pending,
                                         view.history)
    return JSONResponse({
        **_execution(execution),
        "open_wait": None if wait is None else {
            "kind": wait.kind, "name": wait.name, "started_at": wait.started_at.isoformat(),
            "deadline": wait.deadline.isoformat() if wait.deadline else None,
            "request": wait.request},
        "rate_limited": None if view.rate_limited is None else {
            "limiter": view.rate_limited.limiter,
            "until": view.rate_limited.until.isoformat()},
        "pending_signals": [{"signal_id": b.id, "name": b.name, "payload": b.payload,
                             "received_at": b.received_at.isoformat()} for b in buffered],
        "children": [{"execution_id": str(c.child_id), "workflow": c.workflow,
                      "workflow_id": c.workflow_id, "policy": c.policy, "ended": c.ended}
                     for c in view.children],
        "parent": next(({"execution_id": e.payload["parent"],
                         "position": e.payload["position"]}
                        for e in events if e.kind == Event.CHILD_OF), None),
        # Every decision attempt on the run's interrupts, accepted or refused: its audit.
        "decisions": [{"interrupt": e.name, "accepted": e.kind == Event.INTERRUPT_DECIDED,
                       **e.payload} for e in events
                      if e.kind in (Event.INTERRUPT_DECIDED, Event.INTERRUPT_REFUSED)],
    })


@_api
async def history(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = _execution_id(request)
    events = await client.history(ident, tenant=tenant)
    return JSONResponse({"events": [
        {"seq": e.seq, "position": e.position, "kind": e.kind, "name": e.name,
         "payload": e.payload,
         "recorded_at": e.recorded_at.isoformat() if e.recorded_at else None}
        for e in events]})


@_api
async def interrupts(request: Request, tenant: str) -> Response:
    client = shared(request).client
    q = request.query_params
    limit = _limit(request)
    page = await client.pending_interrupts(
        tenant=tenant, workflow=q.get("workflow"), cursor=q.get("cursor"), limit=limit,
        skip_unavailable=True)
    return JSONResponse({"unavailable_shards": list(page.unavailable_shards), "items": [
        {"execution_id": str(p.execution_id), "workflow": p.workflow_name,
         "workflow_id": p.workflow_id, "name": p.name, "prompt": p.prompt,
         "actions": list(p.actions), "schema": p.schema, "value": p.value,
         "requested_at": p.requested_at.isoformat(),
         "deadline": p.deadline.isoformat() if p.deadline else None}
        for p in page.items], "next_cursor": page.next_cursor})


async def healthz(request: Request) -> Response:
    """Per-shard reachability; no token needed (a load balancer asks)."""
    from shardq.shards.check import check_shard

    shard_map = shared(request).map
    statuses = await asyncio.to_thread(
        lambda: [check_shard(shard_map, s) for s in shard_map.shards])
    shards = {st.shard.name: st.problem is None for st in statuses}
    return JSONResponse({"ok": all(shards.values()), "shards": shards},
                        200 if all(shards.values()) else 503)


async def openapi(request: Request) -> Response:
    return JSONResponse(shared(request).document)


async def index(request: Request) -> Response:
    """The API's root, the URL `shardq serve` prints: where to go from here. No token
    needed: it names public paths only, for whoever opens the printed URL first."""
    return JSONResponse(INDEX)


INDEX = {
    "service": "shardq management API",
    "openapi": PREFIX + "/openapi.json",
    "healthz": PREFIX + "/healthz",
    "inbox": "/inbox",
    "authentication": "Authorization: Bearer TOKEN (`shardq api-token TENANT` makes one)",
}
"""The root's answer; paths, not URLs, so it stays right behind a proxy."""


ROUTES = [
    Route(PREFIX + path, endpoint, methods=[method]) for path, endpoint, method in (
        ("/workflows/{name}/start", start, "POST"),
        ("/workflows/{name}/signal-with-start", signal_with_start, "POST"),
        ("/workflows/{execution_id}/signal/{signal_name}", signal, "POST"),
        ("/workflows/{execution_id}/interrupts/{name}/decision", decide, "POST"),
        ("/workflows/{execution_id}/cancel", cancel, "POST"),
        ("/workflows/{execution_id}/priority", set_priority, "POST"),
        ("/workflows/{execution_id}/query/{name}", query, "POST"),
        ("/workflows/{execution_id}/update/{name}", update, "POST"),
        ("/workflows/{name}/update-with-start", update_with_start, "POST"),
        ("/workflows/registered/{name}/interface", interface, "GET"),
        ("/workflows/counts", counts, "GET"),
        ("/bulk/cancel", cancel_matching, "POST"),
        ("/bulk/signal", signal_matching, "POST"),
        ("/workflows/{execution_id}/history", history, "GET"),
        ("/workflows/{execution_id}", show, "GET"),
        ("/workflows", listing, "GET"),
        ("/interrupts", interrupts, "GET"),
        ("/healthz", healthz, "GET"),
        ("/openapi.json", openapi, "GET"),
        ("", index, "GET"),
        # Without it the router would redirect (307) every method, not refuse (405).
        ("/", index, "GET"),
    )
]
"""The API's routes, in match order (a literal segment before the parameter it shadows)."""


def _refusal(request: Request, exc: Exception, shard_map: ShardMap) -> JSONResponse:
    """The answer to a request that failed: a 4xx for every client mistake, 503 for a shard
    that is down (named, its cause logged here, not shown), and a bare 500 (logged,
    never a traceback) for a bug."""
    if isinstance(exc, ApiError):
        return JSONResponse({"error": str(exc), **exc.details}, exc.status)
    status = status_of(exc)
    if status == 500:
        log.error("request failed", extra={"path": request.url.path}, exc_info=exc)
        return JSONResponse({"error": "internal error"}, 500)
    if status == 503:
        log.warning("request refused: %s", exc, extra={"path": request.url.path})
    return JSONResponse(refusal_body(exc, shard_map), status)
