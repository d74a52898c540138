"""How a refused request is answered, whichever front end it came through (API, inbox).

Each refusal kind has one status (first match wins, the more special kinds
first) and one body: its text and what a caller acts on. Anything that is not
a refusal is a bug: status 500, logged by the caller, never shown. A reviewer
in the inbox reads a sentence for each reason code (REVIEWER_TEXT), not the
client's message, which is written for developers.

A caller sees shards by name only. The shard layer's messages name a shard by
its label (name and redacted URL) for operators; its host, port, user and
database are no business of a reviewer or an API caller, so they are taken
out here, and the cause of an unavailable shard goes to the server's log.
"""

from __future__ import annotations

from typing import Any

from shardq.client.bulk import TooManyRuns
from shardq.core.errors import (
    DecisionRefused,
    ExecutionNotFound,
    PayloadInvalid,
    QueryFailed,
    ScheduleNotFound,
    SignalRefused,
    UnknownHandler,
    UnknownWorkflow,
    UpdateFailed,
    UpdateRefused,
    UpdateRejected,
    UpdateTimedOut,
)
from shardq.shards.config import ShardMap, redact
from shardq.shards.errors import MapMismatch, SchemaBehind, ShardqError, ShardUnavailable
from shardq.shards.routing import InvalidExecutionId
from shardq.store.schedule_statements import ScheduleExists

STATUS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    (UpdateTimedOut, 202),
    ((ExecutionNotFound, InvalidExecutionId, UnknownWorkflow, UnknownHandler,
      ScheduleNotFound), 404),
    ((UpdateRefused, DecisionRefused, SignalRefused, ScheduleExists, TooManyRuns), 409),
    ((UpdateFailed, UpdateRejected, QueryFailed), 422),
    # A shard found, late, to hold another map or an older schema: the server's
    # configuration is at fault, not the request, and nothing was written.
    ((ShardUnavailable, MapMismatch, SchemaBehind), 503),
    (ShardqError, 400),  # InvalidArgument, PayloadInvalid and every other refusal
)
"""The status of each refusal, first match wins (the more special kinds first)."""


FORM_UNREADABLE = "form_unreadable"
"""The inbox's own code: a posted decision the client refused as malformed (the page
sends only what it offered, so the form was altered or broken)."""

REVIEWER_TEXT: dict[str, tuple[str, str]] = {
    "decided": ("Someone else decided first.", "someone else decided first"),
    "not_open": ("The run no longer waits for this decision: it has moved on, was "
                 "cancelled or asked again. Reload the page to see where it stands.",
                 "no longer waiting for a decision"),
    "timed_out": ("The time allowed for this decision ran out before your answer "
                  "arrived.", "too late"),
    "action_refused": ("This review does not offer that answer.", "answer not offered"),
    "decision_id_reused": ("This form was already used for another decision. Reload the "
                           "page and decide again.", "form used twice"),
    FORM_UNREADABLE: ("The decision could not be read. Reload the page and decide again.",
                      "unreadable form"),
}
"""What a reviewer is told of each reason code the inbox can show: (the sentence on the
page that was refused, the short form in an audit trail). The messages the client
raises are written for developers (they name API calls); the code itself is kept in
small print, for whoever the reviewer asks for help."""


def for_reviewer(code: str | None, short: bool = False) -> str:
    """The sentence (or, `short`, the phrase) a reviewer reads for reason code `code`."""
    sentence, phrase = REVIEWER_TEXT.get(code or "", (
        "The decision could not be applied.", "not applied"))
    return phrase if short else sentence


def status_of(exc: BaseException) -> int:
    return next((code for kinds, code in STATUS if isinstance(exc, kinds)), 500)


def public_text(exc: BaseException, shard_map: ShardMap) -> str:
    """The refusal's text with every shard named by its name alone (no URL)."""
    text = str(exc)
    for shard in shard_map.shards:
        for shown in (shard.label, redact(shard.url), shard.url):
            text = text.replace(shown, shard.name)
    return text


def unavailable_shards(exc: ShardUnavailable, shard_map: ShardMap) -> list[str]:
    """The names of the shards an unavailable-shard error is about."""
    text = str(exc)
    return [s.name for s in shard_map.shards if text.startswith(f"{s.label}:")]


def unavailable_text(names: list[str]) -> str:
    if not names:
        return "a shard is unavailable; try again later"
    return f"shard {', '.join(names)} is unavailable; try again later"


def refusal_body(exc: Exception, shard_map: ShardMap) -> dict[str, Any]:
    """What a refusal says: its text and, per kind, what a caller acts on."""
    if isinstance(exc, PayloadInvalid):
        return {"error": exc.summary, "violations": exc.violations}
    if isinstance(exc, ExecutionNotFound | InvalidExecutionId):
        return {"error": "execution not found"}  # another tenant's run reads the same
    if isinstance(exc, ShardUnavailable):
        names = unavailable_shards(exc, shard_map)
        return {"error": unavailable_text(names), "unavailable_shards": names}
    body: dict[str, Any] = {"error": public_text(exc, shard_map)}
    if isinstance(exc, UpdateTimedOut):
        body.update(update_id=exc.update_id, completed=False)
    elif isinstance(exc, UpdateRefused | SignalRefused):
        body.update(reason_code=exc.reason_code)
    elif isinstance(exc, DecisionRefused):
        body.update(reason_code=exc.reason_code, standing=exc.standing)
    elif isinstance(exc, UpdateFailed):
        body.update(reason_code="handler_failed", update_id=exc.update_id, detail=exc.error)
    elif isinstance(exc, UpdateRejected):
        body.update(reason_code="rejected")
    elif isinstance(exc, QueryFailed):
        body.update(reason_code="query_failed")
    return body
