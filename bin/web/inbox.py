"""The review inbox (`/inbox` on `shardq serve`): what waits for a person, and deciding it.

Server-rendered HTML over the same Client the JSON API uses: no second path to
the store. Sign-in takes an API token (and the reviewer's name, recorded as
the actor of every decision) and keeps both in HttpOnly, SameSite=Strict
cookies scoped to /inbox; everything shown is the token's tenant's.

Safety: templates escape every value (Jinja2 autoescape), so prompts,
payloads, names and violation messages render as text; every form carries a
CSRF token that must match a cookie set by the server (double submit, on top
of SameSite=Strict); the only script is a static file, no inline script or
event handler, and a Content-Security-Policy forbids anything else.

A decision carries a decision id made when the page was rendered, so a double
click or a resubmitted form is the same decision; a decision that lost to
another reviewer's shows the one that stands. An open interrupt's page asks
`.../state` (JSON) every second, so a decision made elsewhere replaces its
buttons before anyone clicks them. A refusal is shown as a sentence for the
reviewer, its reason code in small print for whoever they ask for help.

The pages are the table ROUTES: one module-level handler each, reading the
application's client, tokens and settings from `shared(request)`
(bin/web/state.py); templates/ and static/ sit beside this file.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from shardq.bin.web.forms import fields_of, initial_form, payload_from
from shardq.bin.web.refusals import (
    FORM_UNREADABLE,
    for_reviewer,
    public_text,
    status_of,
    unavailable_shards,
    unavailable_text,
)
from shardq.bin.web.state import shared
from shardq.bin.web.tokens import tenant_for
from shardq.core.errors import DecisionRefused, InvalidArgument, PayloadInvalid
from shardq.core.models import Event, HistoryEvent, State
from shardq.core.rules import check_name
from shardq.shards.config import ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.routing import InvalidExecutionId, parse_execution_id

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
TOKEN_COOKIE, ACTOR_COOKIE, CSRF_COOKIE = "shardq_token", "shardq_actor", "shardq_csrf"
PAGE = 50
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; connect-src 'self'")
WAITED = (("any", 0.0), ("1 hour", 3600.0), ("1 day", 86400.0), ("1 week", 604800.0))
"""The age filter's choices: open at least this long."""
MAX_FORM = 256 << 10


class Refused(Exception):
    """A request the inbox answers with an error page and this status (and a reason
    code in small print, when a reviewer may need to quote one)."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _templates() -> Environment:
    templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                            autoescape=select_autoescape(default=True))
    templates.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
    templates.filters["when"] = _when
    templates.filters["ago"] = _ago
    templates.filters["duration"] = _duration
    templates.filters["for_reviewer"] = for_reviewer
    return templates


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """A page, with the CSRF cookie its forms are checked against (kept if already set)."""
    csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
    html = TEMPLATES.get_template(template).render(
        csrf=csrf, actor=request.cookies.get(ACTOR_COOKIE), **context)
    response = HTMLResponse(html, status)
    response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict",
                        path="/inbox", secure=request.url.scheme == "https")
    return response


def _tenant_of(request: Request, token: str) -> str | None:
    return tenant_for(token, shared(request).tokens)


def _signed_in(request: Request) -> str | None:
    """The tenant of the request's token cookie; None: not signed in."""
    token = request.cookies.get(TOKEN_COOKIE)
    return _tenant_of(request, token) if token else None


Page = Callable[[Request, str], Awaitable[Response]]
"""A signed-in page's body: the request and the tenant its token cookie names."""


def signed_page(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    """A signed-in page: the tenant from the token cookie, errors as pages."""

    async def endpoint(request: Request) -> Response:
        tenant = _signed_in(request)
        if tenant is None:
            return _secured(RedirectResponse("/inbox/login", 303))
        try:
            if request.method == "POST":
                await _check_csrf(request)
            return _secured(await handler(request, tenant))
        except Exception as exc:
            return _secured(_error(request, exc, shared(request).map))

    return endpoint


async def login_form(request: Request) -> Response:
    return _secured(render(request, "login.html"))


async def login(request: Request) -> Response:
    try:
        form = await _check_csrf(request)
    except Refused as exc:
        return _secured(render(request, "login.html", exc.status, error=str(exc)))
    except Exception as exc:
        return _secured(_error(request, exc, shared(request).map))
    token, actor = form.get("token", "").strip(), form.get("actor", "").strip()
    if not actor or len(actor) > 255:
        return _secured(render(request, "login.html", 400, typed=actor,
                               error="your name is needed (at most 255 characters): it "
                                     "is recorded with every decision you make"))
    if _tenant_of(request, token) is None:
        # The name stays typed: only the token was wrong (the token is never echoed).
        return _secured(render(request, "login.html", 401, typed=actor,
                               error="the token is not valid"))
    response = RedirectResponse("/inbox", 303)
    secure = request.url.scheme == "https"
    for name, value in ((TOKEN_COOKIE, token), (ACTOR_COOKIE, actor)):
        response.set_cookie(name, value, httponly=True, samesite="strict", path="/inbox",
                            secure=secure)
    return _secured(response)


@signed_page
async def logout(request: Request, tenant: str) -> Response:
    response = RedirectResponse("/inbox/login", 303)
    for name in (TOKEN_COOKIE, ACTOR_COOKIE):
        response.delete_cookie(name, path="/inbox")
    return response


@signed_page
async def listing(request: Request, tenant: str) -> Response:
    state = shared(request)
    client, stale_after = state.client, state.inbox_stale_after
    q = request.query_params
    workflow = q.get("workflow") or None
    newest = q.get("order") == "newest"
    waited = dict(WAITED).get(q.get("waited", "any"), 0.0)
    page_ = await client.pending_interrupts(
        tenant=tenant, workflow=workflow, cursor=q.get("cursor") or None, limit=PAGE,
        newest_first=newest, waited_s=waited, skip_unavailable=True)
    now = datetime.now(UTC)
    rows = [{"item": p, "stale": (now - p.requested_at).total_seconds() > stale_after
             or (p.deadline is not None and p.deadline < now)} for p in page_.items]
    filters = {"workflow": workflow or "", "order": "newest" if newest else "oldest",
               "waited": q.get("waited", "any")}
    more = ("/inbox?" + urlencode({**filters, "cursor": page_.next_cursor})
            if page_.next_cursor else None)
    return render(request, "list.html", rows=rows, filters=filters, waited=WAITED,
                  more=more, stale_after=stale_after,
                  unavailable=list(page_.unavailable_shards))


@signed_page
async def detail(request: Request, tenant: str) -> Response:
    return await _detail(request, tenant, uuid.uuid4().hex)


async def _detail(request: Request, tenant: str, decision_id: str, status: int = 200,
                  **extra: Any) -> Response:
    client = shared(request).client
    ident = run_id_of(request)
    name = request.path_params["name"]
    view = await client.describe(ident, tenant=tenant)
    execution, events = view.execution, view.history
    asked = _interrupt(events, name)
    if asked is None:
        raise Refused(404, f"this run has asked for no interrupt named {name!r}")
    request_, outcome = asked
    fields = fields_of(request_.payload.get("schema"))
    posted: dict[str, str] | None = extra.pop("posted", None)
    return render(
        request, "detail.html", status, execution=execution, name=name,
        request_=request_, outcome=outcome, decision_id=decision_id, fields=fields,
        state_url=f"/inbox/runs/{execution.id}/interrupts/{quote(name, safe='')}/state",
        # What was posted comes back as it was; a fresh form starts from the value.
        form=posted if posted is not None else initial_form(
            fields, request_.payload.get("value")),
        steps=[e for e in events if e.kind == Event.STEP_COMPLETED],
        audit=[e for e in events if e.name == name and e.kind in (
            Event.INTERRUPT_DECIDED, Event.INTERRUPT_REFUSED, Event.INTERRUPT_TIMED_OUT)],
        **extra)


@signed_page
async def decide(request: Request, tenant: str) -> Response:
    client = shared(request).client
    ident = run_id_of(request)
    name = request.path_params["name"]
    form = await read_form(request)
    action, decision_id = form.get("action", ""), form.get("decision_id", "")
    actor = request.cookies.get(ACTOR_COOKIE) or ""
    payload: Any = None
    if action == "edit":
        events = await client.history(ident, tenant=tenant)
        asked = _interrupt(events, name)
        schema = asked[0].payload.get("schema") if asked else None
        payload, problems = payload_from(fields_of(schema), form)
        if problems:
            return await _detail(request, tenant, decision_id, 400, violations=problems,
                                 posted=form)
    try:
        await client.decide(
            ident, name, action, payload, decision_id=decision_id, actor=actor,
            tenant=tenant)
    except PayloadInvalid as exc:
        return await _detail(request, tenant, decision_id, 400,
                             violations=exc.violations, posted=form)
    except DecisionRefused as exc:
        return await _detail(request, tenant, uuid.uuid4().hex, 409, refusal=exc)
    except InvalidArgument as exc:
        # The page only sends what it offered: this form was altered or is broken.
        # The client's message is for developers; the log keeps it.
        log.info("inbox decision refused: %s", exc, extra={"path": request.url.path})
        raise Refused(400, for_reviewer(FORM_UNREADABLE), FORM_UNREADABLE) from None
    return RedirectResponse(request.url.path, 303)


async def interrupt_state(request: Request) -> Response:
    """Whether interrupt `name` of the run is still open, as JSON: the page of an open
    interrupt polls this and replaces its buttons once it was decided elsewhere."""
    tenant = _signed_in(request)
    if tenant is None:
        return _secured(JSONResponse({"error": "sign in first"}, 401))
    try:
        client = shared(request).client
        ident = run_id_of(request)
        name = request.path_params["name"]
        events = await client.history(ident, tenant=tenant)
        asked = _interrupt(events, name)
        if asked is None:
            raise Refused(404, f"this run has asked for no interrupt named {name!r}")
        return _secured(JSONResponse(_state(*asked)))
    except Exception as exc:
        status, message, _ = _failure(request, exc, shared(request).map)
        return _secured(JSONResponse({"error": message}, status))


def _state(request_: HistoryEvent, outcome: HistoryEvent | None) -> dict[str, Any]:
    """An interrupt's state for the page: `requested` tells a request asked again (a
    later one of the same name) from the one the page shows."""
    state: dict[str, Any] = {"open": outcome is None, "requested": request_.seq}
    if outcome is None:
        return state
    decided = outcome.payload
    timed_out = outcome.kind == Event.INTERRUPT_TIMED_OUT
    summary = (f"Timed out at {_when(decided.get('decided_at'))}: nobody decided."
               if timed_out else
               f"Decided by {decided.get('actor') or 'nobody'} at "
               f"{_when(decided.get('decided_at'))}: {decided.get('action')}.")
    return {**state, "action": "timed_out" if timed_out else decided.get("action"),
            "actor": None if timed_out else decided.get("actor"),
            "decided_at": decided.get("decided_at"), "summary": summary}


@signed_page
async def parked(request: Request, tenant: str) -> Response:
    client = shared(request).client
    q = request.query_params
    runs = await client.list_runs(
        tenant=tenant, state=State.WAITING, limit=PAGE, cursor=q.get("cursor") or None)
    waits = await client.waiting_on_page(runs)
    more = f"/inbox/parked?{urlencode({'cursor': runs.next_cursor})}" if (
        runs.next_cursor) else None
    return render(request, "parked.html", runs=[(r, waits[r.id]) for r in runs.items],
                  more=more)


@signed_page
async def schedules(request: Request, tenant: str) -> Response:
    client = shared(request).client
    after = request.query_params.get("after") or ""
    if after:
        check_name(after, "schedule")  # a page cursor: a schedule's name
    found = await client.schedules(tenant=tenant, after=after, limit=PAGE + 1)
    more = (f"/inbox/schedules?{urlencode({'after': found[PAGE - 1].name})}"
            if len(found) > PAGE else None)
    return render(request, "schedules.html", schedules=found[:PAGE], more=more)


async def static(request: Request) -> Response:
    name = request.path_params["file"]
    if name not in ("inbox.css", "inbox.js"):
        return _secured(HTMLResponse("not found", 404))
    return _secured(FileResponse(HERE / "static" / name))


ROUTES = [
    Route("/inbox/login", login_form, methods=["GET"]),
    Route("/inbox/login", login, methods=["POST"]),
    Route("/inbox/logout", logout, methods=["POST"]),
    Route("/inbox", listing, methods=["GET"]),
    Route("/inbox/parked", parked, methods=["GET"]),
    Route("/inbox/schedules", schedules, methods=["GET"]),
    Route("/inbox/static/{file}", static, methods=["GET"]),
    Route("/inbox/runs/{execution_id}/interrupts/{name}", detail, methods=["GET"]),
    Route("/inbox/runs/{execution_id}/interrupts/{name}", decide, methods=["POST"]),
    Route("/inbox/runs/{execution_id}/interrupts/{name}/state", interrupt_state,
          methods=["GET"]),
]
"""The inbox's pages, all under /inbox."""


async def read_form(request: Request) -> dict[str, str]:
    """A posted urlencoded form (the only kind the pages send), read within MAX_FORM."""
    cached: dict[str, str] | None = getattr(request.state, "form", None)
    if cached is not None:  # the CSRF check read it first
        return cached
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(415, "expected a form (application/x-www-form-urlencoded)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM:
            raise Refused(413, "the form is too large")
        chunks.append(chunk)
    try:
        pairs = parse_qsl(b"".join(chunks).decode("utf-8"), keep_blank_values=True,
                          strict_parsing=False, max_num_fields=200, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "the form is not valid UTF-8 form data") from None
    request.state.form = dict(pairs)
    return request.state.form  # type: ignore[no-any-return]


async def _check_csrf(request: Request) -> dict[str, str]:
    """The posted form, if its CSRF token matches the cookie the server set; else Refused."""
    form = await read_form(request)
    expected = request.cookies.get(CSRF_COOKIE, "")
    if not expected or not hmac.compare_digest(expected, form.get("csrf", "")):
        raise Refused(403, "the form has expired or did not come from this site: reload the "
                           "page and try again")
    return form


def run_id_of(request: Request) -> uuid.UUID:
    try:
        return parse_execution_id(request.path_params["execution_id"])
    except InvalidExecutionId:
        raise Refused(404, "no such run") from None


def _interrupt(
    events: list[HistoryEvent], name: str
) -> tuple[HistoryEvent, HistoryEvent | None] | None:
    """The latest request of interrupt `name` and what resolved it (None: still open)."""
    requested = [e for e in events if e.kind == Event.INTERRUPT_REQUESTED and e.name == name]
    if not requested:
        return None
    last = requested[-1]
    outcome = next((e for e in events if e.position == last.position and e.kind in (
        Event.INTERRUPT_DECIDED, Event.INTERRUPT_TIMED_OUT)), None)
    return last, outcome


def _error(request: Request, exc: Exception, shard_map: ShardMap) -> Response:
    """The error page: shards named by name alone (see refusals.py)."""
    status, message, code = _failure(request, exc, shard_map)
    return render(request, "error.html", status, message=message, code=code)


def _failure(
    request: Request, exc: Exception, shard_map: ShardMap
) -> tuple[int, str, str | None]:
    """A failed request's status, what the reviewer is told and its reason code if any."""
    if isinstance(exc, Refused):
        return exc.status, str(exc), exc.code
    if isinstance(exc, InvalidArgument | InvalidExecutionId):
        status, message = 400, str(exc)
    elif isinstance(exc, ShardUnavailable):
        log.warning("inbox request refused: %s", exc, extra={"path": request.url.path})
        status, message = 503, unavailable_text(unavailable_shards(exc, shard_map))
    else:
        status = status_of(exc)
        message = "no such run" if status == 404 else public_text(exc, shard_map)
        if status == 500:
            log.error("inbox request failed", extra={"path": request.url.path}, exc_info=exc)
            message = "internal error"
    return status, message, None


def _secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    return response


def _when(value: datetime | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: datetime) -> str:
    return _duration((datetime.now(UTC) - value).total_seconds())


def _duration(seconds_: float) -> str:
    seconds = max(0, int(seconds_))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


TEMPLATES = _templates()
"""The pages' templates, every value escaped (autoescape)."""
