"""The management API's schedule routes (docs/schedules.md, docs/http-api.md): create,
list, show, pause, resume, trigger and delete the token's tenant's schedules. The
OpenAPI document describes them with the rest (bin/web/openapi.py)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shardq.bin.web.api import ApiError, _api, _field, _json_object, _limit
from shardq.bin.web.openapi import PREFIX
from shardq.bin.web.state import shared
from shardq.core.schedules import DEFAULT_CATCHUP_S, Schedule


def schedule_json(found: Schedule) -> dict[str, Any]:
    """A schedule as the API answers it (times in ISO 8601, null when unset)."""
    def when(value: Any) -> str | None:
        return None if value is None else value.isoformat()

    return {"name": found.name, "workflow": found.workflow, "input": found.input,
            "cron": found.cron, "every": found.every_s, "timezone": found.timezone,
            "overlap": found.overlap, "catchup_window": found.catchup_s,
            "paused": found.paused, "next_at": when(found.next_at),
            "last_tick": when(found.last_tick),
            "last_run": None if found.last_run is None else str(found.last_run),
            "buffered_at": when(found.buffered_at), "triggered_at": when(found.triggered_at),
            "started": found.started, "skipped": found.skipped, "missed": found.missed}


@_api
async def create(request: Request, tenant: str) -> Response:
    body = await _json_object(request, "createSchedule")
    catchup = _number(body, "catchup_window")
    found = await shared(request).client.create_schedule(
        _field(body, "name", str), _field(body, "workflow", str), body.get("input"),
        cron=_field(body, "cron", str, required=False), every=_number(body, "every"),
        timezone=_field(body, "timezone", str, required=False) or "UTC",
        overlap=_field(body, "overlap", str, required=False) or "skip",
        catchup_window=DEFAULT_CATCHUP_S if catchup is None else catchup, tenant=tenant)
    return JSONResponse(schedule_json(found), 201)


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"`{name}` must be a number")
    return float(value)


@_api
async def listing(request: Request, tenant: str) -> Response:
    after = request.query_params.get("after", "")
    found = await shared(request).client.schedules(tenant=tenant, after=after,
                                                   limit=_limit(request))
    return JSONResponse({"items": [schedule_json(s) for s in found],
                         "next_after": found[-1].name if found else None})


@_api
async def show(request: Request, tenant: str) -> Response:
    found = await shared(request).client.schedule(request.path_params["name"], tenant=tenant)
    return JSONResponse(schedule_json(found))


def _change(action: str) -> Any:
    @_api
    async def change(request: Request, tenant: str) -> Response:
        found = await getattr(shared(request).client, f"{action}_schedule")(
            request.path_params["name"], tenant=tenant)
        return JSONResponse(schedule_json(found))

    return change


def _by_method(**handlers: Any) -> Any:
    """One route for a path's methods: starlette's 405 then lists all of them."""
    async def endpoint(request: Request) -> Response:
        method = request.method.lower()
        # Starlette answers HEAD on every GET route: with the GET's handler.
        handler = handlers["get" if method == "head" else method]
        return await handler(request)  # type: ignore[no-any-return]

    return endpoint


ROUTES = [
    Route(PREFIX + "/schedules", _by_method(get=listing, post=create), methods=["GET", "POST"]),
    *[Route(PREFIX + f"/schedules/{{name}}/{action}", _change(action), methods=["POST"])
      for action in ("pause", "resume", "trigger")],
    Route(PREFIX + "/schedules/{name}", _by_method(get=show, delete=_change("delete")),
          methods=["GET", "DELETE"]),
]
"""The schedule routes, mounted beside api.ROUTES (bin/web/app.py)."""
