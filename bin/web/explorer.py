"""The run explorer (`/inbox/runs` on `shardq serve`), beside the review inbox: every run
of the signed-in tenant, found by state, workflow, search attributes and creation time,
with its counts; a run's page with its history as a timeline, its children and parent,
its open wait and buffered signals, the outbox rows it owes and is owed; and the
actions an operator takes on one run: cancel, send a signal, decide its interrupt
(the inbox's page).

The inbox's rules hold (bin/web/inbox.py): server-rendered over the same AsyncClient as
the JSON API, every value escaped, every form with its CSRF token, the token's tenant
only, a Content-Security-Policy that allows the static script alone. A page costs
what the API's calls cost: a listing page and a count (docs/operations.md, "Listing
and counting runs"), a run's describe, and one small read of each shard's outbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from shardq.bin.web.inbox import (
    ACTOR_COOKIE,
    PAGE,
    Refused,
    read_form,
    render,
    run_id_of,
    signed_page,
)
from shardq.bin.web.state import shared
from shardq.core.errors import InvalidArgument, PayloadInvalid, SignalRefused
from shardq.core.models import Event, HistoryEvent, State
from shardq.core.rules import RuleBroken, json_value, parse_moment

FILTERS = ("state", "workflow", "where", "created_after", "created_before")
"""The list's query parameters besides its cursor, as the form names them."""
MAX_FIELD = 4096
"""The longest value a list filter may have in a request."""


def _filters(request: Request) -> tuple[dict[str, Any], dict[str, str]]:
    """The list's filters as `list_runs` takes them, and as the form shows them back.

    A filter too long, or a time with no offset, is a 400 page; the state, names and
    attribute filters are checked by the client (a 400 page too)."""
    q = request.query_params
    shown = {name: q.get(name, "") for name in FILTERS}
    if any(len(v) > MAX_FIELD for v in shown.values()):
        raise Refused(400, "a filter is too long")
    where = [line.strip() for line in shown["where"].splitlines() if line.strip()]
    return {"state": shown["state"] or None, "workflow": shown["workflow"].strip() or None,
            "where": where or None,
            **{name: parse_moment(shown[name], name) if shown[name].strip() else None
               for name in ("created_after", "created_before")}}, shown


@signed_page
async def runs(request: Request, tenant: str) -> Response:
    client = shared(request).client
    filters, shown = _filters(request)
    page = await client.list_runs(tenant=tenant, limit=PAGE, skip_unavailable=True,
                                  cursor=request.query_params.get("cursor") or None, **filters)
    # Counts by state come from counters; counting by attributes reads every run they
    # match (operations.md), so a page does it only when asked.
    by_attributes = bool(filters["where"]) and request.query_params.get("count") == "1"
    counted = await client.count_runs(tenant=tenant, workflow=filters["workflow"],
                                      where=filters["where"] if by_attributes else None,
                                      skip_unavailable=True)
    kept = {k: v for k, v in shown.items() if v}
    by_state = [(s.value, n, "/inbox/runs?" + urlencode({**kept, "state": s.value}))
                for s, n in counted.by_state.items()]
    more = ("/inbox/runs?" + urlencode({**kept, "cursor": page.next_cursor})
            if page.next_cursor else None)
    unavailable = sorted({*page.unavailable_shards, *counted.unavailable_shards})
    count_link = ("/inbox/runs?" + urlencode({**kept, "count": "1"})
                  if filters["where"] and not by_attributes else None)
    return render(request, "runs.html", runs=page.items, filters=shown, by_state=by_state,
                  total=counted.total, states=[s.value for s in State], more=more,
                  count_link=count_link,
                  unavailable=unavailable)


@signed_page
async def run_page(request: Request, tenant: str) -> Response:
    return await _run_page(request, tenant)


async def _run_page(request: Request, tenant: str, status: int = 200, **extra: Any) -> Response:
    client = shared(request).client
    ident = run_id_of(request)
    view = await client.describe(ident, tenant=tenant)
    outbox = await client.outbox_of(ident, tenant=tenant)
    parent = next((e.payload for e in view.history if e.kind == Event.CHILD_OF), None)
    interrupt = (view.wait.name if view.wait is not None and view.wait.kind == "interrupt"
                 else None)
    return render(request, "run.html", status, execution=view.execution, wait=view.wait,
                  pending=view.pending, timeline=timeline(view.history),
                  children=view.children, parent=parent, outbox=outbox, interrupt=interrupt,
                  live=not view.execution.state.terminal,
                  signal_form=extra.pop("signal_form", {}), **extra)


def timeline(events: list[HistoryEvent]) -> list[dict[str, Any]]:
    """The history as the page draws it: each event with the call it belongs to (its
    colour), what it says in a few words, and its payload."""
    return [{"event": e, "call": e.kind.split(".", 1)[0], "summary": _summary(e)}
            for e in events]


def _summary(e: HistoryEvent) -> str:
    """A few words on an event, from its payload: the durable facts an operator scans for."""
    say = _SUMMARIES.get(e.kind)
    return say(e.payload) if say is not None else ""


def _failure(p: dict[str, Any]) -> str:
    error = p.get("error") or {}
    return f"{error.get('type')}: {error.get('message')}" if error else ""


def _until(p: dict[str, Any]) -> str:
    return f"until {p['wake_at']}" if p.get("wake_at") else ""


def _to(p: dict[str, Any]) -> str:
    reason = p.get("reason_code") or p.get("reason")
    return f"to {p.get('target')}" + (f": {reason}" if reason else "")


def _children(workflows: list[str], ids: list[str]) -> str:
    """A batch of starts in a line: how many, of which workflows, the first and last id."""
    names = ", ".join(sorted(set(workflows)))
    shown = " .. ".join(dict.fromkeys(ids[:1] + ids[-1:]))  # the first, and the last
    return f"{len(ids)} children of {names}: {shown}"


_SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    Event.STEP_FAILED: lambda p: f"attempt {p.get('attempt')}: {_failure(p)}"
                                 + ("" if p.get("final") else f", again in {p.get('retry_in')} s"),
    Event.TIMER_STARTED: _until, Event.SIGNAL_WAITING: _until,
    Event.CONDITION_WAITING: _until,
    Event.INTERRUPT_DECIDED: lambda p: f"{p.get('action')} by {p.get('actor')}",
    Event.EXTERNAL_SENT: _to, Event.EXTERNAL_QUEUED: _to, Event.EXTERNAL_FAILED: _to,
    Event.CHILD_STARTED: lambda p: f"{p.get('workflow')} {p.get('workflow_id')}",
    Event.CHILDREN_STARTED: lambda p: _children(p.get("workflow") or [],
                                                p.get("workflow_id") or []),
    Event.ATTRIBUTES_SET: lambda p: ", ".join(
        f"{k}={json.dumps(v)}" for k, v in sorted((p.get("values") or {}).items())),
    "run.failed": _failure, "run.timed_out": _failure,
}
"""What each kind of event says in the timeline's summary column (others: nothing)."""


@signed_page
async def cancel(request: Request, tenant: str) -> Response:
    ident = run_id_of(request)
    await shared(request).client.cancel(ident, tenant=tenant,
                                        actor=request.cookies.get(ACTOR_COOKIE) or None)
    return RedirectResponse(f"/inbox/runs/{ident}", 303)


@signed_page
async def signal(request: Request, tenant: str) -> Response:
    """Send the run a signal from the page's form: its name, its JSON payload (empty:
    null) and an optional idempotency key. A refusal is shown beside the form, which
    keeps what was typed."""
    client = shared(request).client
    ident = run_id_of(request)
    form = await read_form(request)
    name, text, key = (form.get(f, "") for f in ("name", "payload", "idempotency_key"))
    kept = {"name": name, "payload": text, "idempotency_key": key}
    try:
        payload = json_value(text, "the payload")
    except RuleBroken as exc:
        return await _run_page(request, tenant, 400, signal_form=kept, signal_error=str(exc))
    try:
        await client.signal(ident, name, payload, idempotency_key=key.strip() or None,
                            tenant=tenant)
    except PayloadInvalid as exc:
        return await _run_page(request, tenant, 400, signal_form=kept,
                               signal_error=str(exc), violations=exc.violations)
    except (InvalidArgument, SignalRefused) as exc:
        return await _run_page(request, tenant, 409 if isinstance(exc, SignalRefused) else 400,
                               signal_form=kept, signal_error=str(exc))
    return RedirectResponse(f"/inbox/runs/{ident}", 303)


ROUTES = [
    Route("/inbox/runs", runs, methods=["GET"]),
    Route("/inbox/runs/{execution_id}", run_page, methods=["GET"]),
    Route("/inbox/runs/{execution_id}/cancel", cancel, methods=["POST"]),
    Route("/inbox/runs/{execution_id}/signal", signal, methods=["POST"]),
]
"""The explorer's pages, under /inbox (where the sign-in cookies are sent)."""
