"""The OpenAPI 3.1 document of the HTTP API (`GET /api/shardq/openapi.json`).

Written by hand next to the routes (api.py) rather than generated, so it
says what the routes promise: every status a route answers with, the shape of
each body. A test validates it (openapi-spec-validator) and fuzzes every
route with schemathesis against a real `shardq serve`: no input yields a 500.
"""

from __future__ import annotations

import copy
from typing import Any

from shardq.core.models import State
from shardq.core.rules import NAME_PATTERN

PREFIX = "/api/shardq"
ANY_JSON: dict[str, Any] = {}
"""A JSON Schema that accepts every JSON value."""

_VIOLATION = {"type": "object", "required": ["message", "field_path"], "properties": {
    "message": {"type": "string"}, "field_path": {"type": "string"}}}
_SHARD_NAMES = {"type": "array", "items": {"type": "string"},
                "description": "Shards (by name) that could not be reached"}
ERROR = {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "string"},
    "violations": {"type": "array", "items": _VIOLATION},
    "reason_code": {"type": "string"},
    "unavailable_shards": _SHARD_NAMES,
}}
EXECUTION = {"type": "object", "required": ["execution_id", "workflow", "state"], "properties": {
    "execution_id": {"type": "string", "format": "uuid"},
    "workflow": {"type": "string"}, "workflow_version": {"type": "integer"},
    "workflow_id": {"type": "string"}, "state": {"type": "string"},
    "input": ANY_JSON, "output": ANY_JSON, "error": ANY_JSON,
    "cancel_requested": {"type": "boolean"}, "created_at": {"type": "string"},
    "priority": {"type": "integer"},
    "concurrency_key": {"type": ["string", "null"]}, "waiting_for_slot": {"type": "boolean"},
    "build_id": {"type": ["string", "null"]}, "pinned": {"type": "boolean"},
    "attributes": {"type": "object", "description": "Its search attributes"},
    "finished_at": {"type": ["string", "null"]},
    "open_wait": {"type": ["object", "null"]},
    "rate_limited": {"type": ["object", "null"], "properties": {
        "limiter": {"type": "string"}, "until": {"type": "string"}}},
    "pending_signals": {"type": "array", "items": {"type": "object"}},
    "decisions": {"type": "array", "items": {"type": "object"}},
    "children": {"type": "array", "items": {"type": "object", "properties": {
        "execution_id": {"type": "string"}, "workflow": {"type": "string"},
        "workflow_id": {"type": "string"}, "policy": {"type": "string"},
        "ended": {"type": ["string", "null"]}}}},
    "parent": {"type": ["object", "null"], "properties": {
        "execution_id": {"type": "string"}, "position": {"type": "integer"}}},
}}
UPDATE_RESULT = {"type": "object", "required": ["update_id", "completed"], "properties": {
    "execution_id": {"type": "string"}, "update_id": {"type": "integer"},
    "completed": {"type": "boolean"}, "response": ANY_JSON, "accepted": {"type": "boolean"},
    "created": {"type": "boolean"},
}}
_STATUS_TEXT = {
    200: "OK", 201: "Created", 202: "Accepted (see the body)", 400: "Bad request or payload",
    401: "No or bad bearer token", 404: "Not found (another tenant's run reads the same)",
    409: "Refused in the run's current state", 413: "Body too large",
    415: "Not application/json", 422: "Handled, and refused or failed", 503: "A shard is down",
}


def _json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _responses(ok: dict[int, dict[str, Any]], *errors: int) -> dict[str, Any]:
    out = {str(code): {"description": _STATUS_TEXT[code], "content": _json_content(schema)}
           for code, schema in ok.items()}
    for code in (*errors, 400, 401, 503):  # any route: a name or a value it refuses
        out[str(code)] = {"description": _STATUS_TEXT[code], "content": _json_content(ERROR)}
    return out


def _path(name: str, what: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": what,
            "schema": schema or _NAME}


def _query(name: str, schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": what,
            "schema": schema}


def _op(op_id: str, summary: str, responses: dict[str, Any], *parameters: dict[str, Any],
        body: dict[str, Any] | None = None, body_required: bool = True) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary,
                          "security": [{"bearer": []}], "parameters": list(parameters),
                          "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": _json_content(body)}
    return op


def _obj(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _envelope(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    """A request body of named fields: a key it does not name is refused (400), not
    ignored, so `inputs` for `input` cannot start a run without its input."""
    return {**_obj(required, **properties), "additionalProperties": False}


_STRING = {"type": "string"}
_NAME = {"type": "string", "pattern": f"^{NAME_PATTERN}$"}
_WORKFLOW_ID = {"type": "string", "minLength": 1, "maxLength": 512}
_PRIORITY = {"type": ["integer", "null"], "minimum": 0, "maximum": 9,
             "description": "The new run's priority, higher claimed first (default: the "
                            "workflow's own)"}
_KEY = {"type": "string", "pattern": "\\S"}
_BODY_KEY = {"anyOf": [_KEY, {"type": "null"}]}
"""A body's idempotency key: a usable string, or null (or left out) for none."""
_LABEL = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "\\S"}
"""An idempotency key: present means usable (blank is refused, never read as no key)."""
_EXECUTION_ID = _path("execution_id", "The run's execution id",
                      {"type": "string", "format": "uuid"})
_WORKFLOW = _path("name", "A registered workflow's name")
_KEY_QUERY = _query("idempotency_key", _KEY,
                    "Exactly-once key (the Idempotency-Key header wins when both are given)")
_KEY_HEADER = {"name": "Idempotency-Key", "in": "header", "required": False,
               "description": "Exactly-once key; present but empty is refused",
               "schema": _KEY}
_WAIT = _query("wait", {"type": "number", "minimum": 0, "maximum": 600},
               "Seconds to wait for the update's response (default 30)")
_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "Page size")
_PAGE_ITEMS: dict[str, Any] = {"items": {"type": "array", "items": {"type": "object"}},
                               "next_cursor": {"type": ["string", "null"]}}
_COUNTS = {"type": "object", "properties": {s.value: {"type": "integer"} for s in State},
           "required": [s.value for s in State], "additionalProperties": False}
_WHERE = {"type": "array", "items": {"type": "string"}, "maxItems": 4,
          "description": "Search attribute filters, NAME OP VALUE (OP one of = < <= > >=; "
                         "VALUE read as JSON when it is a number, true, false or a "
                         "\"string\"), all met"}
_BULK_FILTERS: dict[str, dict[str, Any]] = {  # each optional: null or absent, not set
    "state": {"enum": [*(s.value for s in State if not s.terminal), None]},
    "workflow": {**_NAME, "type": ["string", "null"]},
    "where": {"type": ["array", "object", "null"], "maxItems": 4, "items": {"type": "string"}},
    "created_after": {"type": ["string", "null"], "format": "date-time"},
    "created_before": {"type": ["string", "null"], "format": "date-time"},
    "dry_run": {"type": ["boolean", "null"]},
    "max_runs": {"type": ["integer", "null"], "minimum": 1, "maximum": 100_000}}
_OPTIONAL_LABEL = {**_LABEL, "type": ["string", "null"]}
_IDS = {"type": "array", "items": {"type": "string", "format": "uuid"}}
_BULK = _obj(["action", "dry_run", "matched", "done", "skipped"], action=_STRING,
             dry_run={"type": "boolean"}, matched=_IDS, done=_IDS,
             skipped={"type": "object", "additionalProperties": _STRING})
_PAGE_OF = {"type": "object", "required": ["items", "next_cursor"], "properties": _PAGE_ITEMS}
_INTERRUPT = {"type": "object", "required": [
    "execution_id", "workflow", "workflow_id", "name", "prompt", "actions", "schema", "value",
    "requested_at", "deadline"], "properties": {
    "execution_id": {"type": "string", "format": "uuid"}, "workflow": _STRING,
    "workflow_id": _STRING, "name": _STRING, "prompt": _STRING,
    "actions": {"type": "array", "items": _STRING},
    "schema": {"type": ["object", "null"], "description": "What an `edit` payload must match"},
    "value": {**ANY_JSON, "description": "What is under review (`ctx.interrupt(value=...)`): "
              "where an edit starts from; null when the request has none"},
    "requested_at": _STRING, "deadline": {"type": ["string", "null"]}}}
_INTERRUPTS_PAGE = {"type": "object", "required": ["items", "next_cursor", "unavailable_shards"],
                    "properties": {**_PAGE_ITEMS, "items": {"type": "array", "items": _INTERRUPT},
                                   "unavailable_shards": _SHARD_NAMES}}
_AFTER_START = {
    name: {"operationId": op_id, "parameters": {"execution_id": "$response.body#/execution_id"}}
    for name, op_id in (("GetRun", "getRun"), ("History", "getHistory"),
                        ("Signal", "signal"), ("Query", "query"), ("Update", "update"),
                        ("Cancel", "cancel"))
}
"""OpenAPI links: a started run's id feeds the routes about one run (stateful fuzzing)."""
_STARTED = _obj(["execution_id", "created"], execution_id=_STRING,
                created={"type": "boolean"})


def _started(*codes: int) -> dict[int, dict[str, Any]]:
    return {code: _STARTED for code in codes}


def _linked(responses: dict[str, Any], *codes: int) -> dict[str, Any]:
    for code in codes:
        responses[str(code)]["links"] = _AFTER_START
    return responses
_SCHEDULE_NAME = _path("name", "The schedule's name")
_TIME = {"type": ["string", "null"]}
_SCHEDULE = _obj(
    ["name", "workflow", "input", "cron", "every", "timezone", "overlap", "catchup_window",
     "paused", "next_at", "last_tick", "last_run", "buffered_at", "triggered_at", "started",
     "skipped", "missed"], name=_STRING, workflow=_STRING, input=ANY_JSON,
    cron={"type": ["string", "null"]}, every={"type": ["number", "null"]}, timezone=_STRING,
    overlap=_STRING, catchup_window={"type": "number"}, paused={"type": "boolean"},
    next_at=_TIME, last_tick=_TIME, last_run=_TIME, buffered_at=_TIME, triggered_at=_TIME,
    started={"type": "integer"}, skipped={"type": "integer"}, missed={"type": "integer"})
_SIGNALLED = _obj(["ok", "signal_delivered"], ok={"type": "boolean"},
                  signal_delivered={"type": "boolean"})

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "shardq management API", "version": "1",
             "description": "Every route is scoped to the tenant of its bearer token. "
                            "Violation messages echo the caller's input: escape them."},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "paths": {
        f"{PREFIX}/workflows/{{name}}/start": {"post": _op(
            "start", "Start a run (201), or find the run of this workflow_id (200)",
            _linked(_responses(_started(200, 201), 400, 404, 413, 415), 200, 201), _WORKFLOW,
            body=_envelope(["workflow_id"], workflow_id=_WORKFLOW_ID, input=ANY_JSON,
                           priority=_PRIORITY))},
        f"{PREFIX}/workflows/{{name}}/signal-with-start": {"post": _op(
            "signalWithStart", "Signal the run of a workflow key, starting it if it has none",
            _responses(_started(201, 202), 400, 404, 409, 413, 415), _WORKFLOW,
            body=_envelope(["workflow_id", "signal"], workflow_id=_WORKFLOW_ID, input=ANY_JSON,
                      signal=_NAME, payload=ANY_JSON, idempotency_key=_BODY_KEY,
                      priority=_PRIORITY))},
        f"{PREFIX}/workflows/{{name}}/update-with-start": {"post": _op(
            "updateWithStart", "Update the run of a workflow key, starting it if it has none",
            _responses({200: UPDATE_RESULT, 201: UPDATE_RESULT, 202: UPDATE_RESULT}, 400, 404,
                       409, 413, 415, 422), _WORKFLOW, _WAIT,
            body=_envelope(["workflow_id", "update"], workflow_id=_WORKFLOW_ID, input=ANY_JSON,
                      update=_NAME, argument=ANY_JSON, idempotency_key=_BODY_KEY,
                      priority=_PRIORITY))},
        f"{PREFIX}/workflows/{{execution_id}}/signal/{{signal_name}}": {"post": _op(
            "signal", "Deliver a signal; the body is its raw JSON payload (may be empty)",
            _responses({202: _SIGNALLED}, 400, 404, 409, 413), _EXECUTION_ID,
            _path("signal_name", "The signal's name"), _KEY_HEADER, _KEY_QUERY,
            body=ANY_JSON, body_required=False)},
        f"{PREFIX}/workflows/{{execution_id}}/query/{{name}}": {"post": _op(
            "query", "Answer a query from the run's committed state; the body is its JSON argument",
            _responses({200: _obj(["result"], result=ANY_JSON)}, 400, 404, 413, 422),
            _EXECUTION_ID, _path("name", "The query's name"), body=ANY_JSON,
            body_required=False)},
        f"{PREFIX}/workflows/{{execution_id}}/update/{{name}}": {"post": _op(
            "update", "Ask the run to handle an update; the body is its JSON argument. 200 "
            "with the response once committed, 202 when not handled within `wait`",
            _responses({200: UPDATE_RESULT, 202: UPDATE_RESULT}, 400, 404, 409, 413, 422),
            _EXECUTION_ID, _path("name", "The update's name"), _KEY_HEADER, _KEY_QUERY,
            _WAIT, body=ANY_JSON, body_required=False)},
        f"{PREFIX}/workflows/{{execution_id}}/interrupts/{{name}}/decision": {"post": _op(
            "decide", "Decide an open interrupt",
            _responses({200: _obj(["accepted", "decision"], accepted={"type": "boolean"},
                                  decision={"type": "object"})}, 400, 404, 409, 413, 415),
            _EXECUTION_ID, _path("name", "The interrupt's name"),
            body=_envelope(["action", "decision_id", "actor"],
                      action={"enum": ["approve", "edit", "reject"]}, payload=ANY_JSON,
                      decision_id=_LABEL, actor=_LABEL))},
        f"{PREFIX}/workflows/{{execution_id}}/cancel": {"post": _op(
            "cancel", "Cancel a run", _responses({200: _obj(["execution_id", "state"],
                                                  execution_id=_STRING, state=_STRING)}, 404),
            _EXECUTION_ID)},
        f"{PREFIX}/workflows/{{execution_id}}/priority": {"post": _op(
            "setPriority", "Give a live run a new priority (a finished run is left as it ended)",
            _responses({200: _obj(["execution_id", "priority", "state"], execution_id=_STRING,
                                  priority={"type": "integer"}, state=_STRING)},
                       400, 404, 409, 413, 415),
            _EXECUTION_ID,
            body=_envelope(["priority"], priority={"type": "integer", "minimum": 0,
                                                   "maximum": 9}))},
        f"{PREFIX}/workflows/counts": {"get": _op(
            "countRuns", "Runs per workflow and state over every shard, exact",
            _responses({200: _obj(["by_state", "by_workflow", "total"], by_state=_COUNTS,
                                  by_workflow={"type": "object",
                                               "additionalProperties": _COUNTS},
                                  total={"type": "integer"})}, 400),
            _query("workflow", _NAME, "Only runs of this workflow"),
            _query("where", _WHERE, "Only runs with these search attributes (counted from "
                   "the runs they match)"))},
        **{f"{PREFIX}/bulk/{action}": {"post": _op(
            f"{action}Matching", f"{summary} every live run the filters match (at least "
            "one), or none when more than `max_runs` match (409); `dry_run`: list them only",
            _responses({200: _BULK}, 400, 409, 413, 415),
            body=_envelope(required, **fields, **_BULK_FILTERS))}
           for action, summary, required, fields in (
               ("cancel", "Cancel", [], {"actor": _OPTIONAL_LABEL}),
               ("signal", "Send signal `name` (with `payload`; each run once per "
                "`idempotency_key`) to", ["name"],
                {"name": _NAME, "payload": ANY_JSON, "idempotency_key": _OPTIONAL_LABEL}))},
        f"{PREFIX}/workflows/{{execution_id}}": {"get": _op(
            "getRun", "A run: state, open wait, pending signals", _responses({200: EXECUTION}, 404),
            _EXECUTION_ID)},
        f"{PREFIX}/workflows/{{execution_id}}/history": {"get": _op(
            "getHistory", "A run's history",
            _responses({200: _obj(["events"], events={"type": "array"})}, 404),
            _EXECUTION_ID)},
        f"{PREFIX}/workflows/registered/{{name}}/interface": {"get": _op(
            "getInterface", "The signals, queries and updates a workflow publishes",
            _responses({200: _obj(["signals", "queries", "updates"],
                                  signals={"type": "array"}, queries={"type": "array"},
                                  updates={"type": "array"})}, 404), _WORKFLOW)},
        f"{PREFIX}/workflows": {"get": _op(
            "listRuns", "Runs over every shard, a keyset page", _responses({200: _PAGE_OF}, 400),
            _query("state", {"enum": [s.value for s in State]}, "Only runs in this state"),
            _query("workflow", _NAME, "Only runs of this workflow"),
            _query("priority", {"type": "integer", "minimum": 0, "maximum": 9},
                   "Only runs of this priority"),
            _query("created_after", {"type": "string", "format": "date-time"},
                   "Only runs created at or after this time (ISO 8601, with its offset)"),
            _query("created_before", {"type": "string", "format": "date-time"},
                   "Only runs created before this time (ISO 8601, with its offset)"),
            _query("where", _WHERE, "Only runs with these search attributes"), _LIMIT,
            _query("cursor", {"type": "string", "pattern": "^[A-Za-z0-9_-]{22}$"},
                   "The next_cursor of the previous page"))},
        f"{PREFIX}/interrupts": {"get": _op(
            "listInterrupts", "Open interrupts over every shard, oldest first, a keyset page. "
            "A shard that cannot be reached does not fail the page: it is named in "
            "`unavailable_shards` and its interrupts are missing (start again from the first "
            "page once it is back: the cursor is a position)",
            _responses({200: _INTERRUPTS_PAGE}, 400),
            _query("workflow", _NAME, "Only interrupts of this workflow's runs"), _LIMIT,
            _query("cursor", {"type": "string", "pattern": "^[A-Za-z0-9_-]{32}$"},
                   "The next_cursor of the previous page"))},
        f"{PREFIX}/schedules": {
            "post": _op("createSchedule", "Create a schedule: a run of `workflow` at every "
                        "tick of `cron` (in `timezone`) or `every` seconds (201)",
                        _responses({201: _SCHEDULE}, 400, 404, 409, 413, 415),
                        body=_envelope(["name", "workflow"], name=_NAME, workflow=_NAME,
                                       input=ANY_JSON, cron={"type": ["string", "null"]},
                                       every={"type": ["number", "null"], "minimum": 1},
                                       timezone={"type": ["string", "null"]},
                                       overlap={"enum": ["skip", "buffer_one", "allow", None]},
                                       catchup_window={"type": ["number", "null"],
                                                       "minimum": 0})),
            "get": _op("listSchedules", "The tenant's schedules by name, a page after `after`",
                       _responses({200: _obj(["items", "next_after"], items={
                           "type": "array", "items": _SCHEDULE},
                           next_after={"type": ["string", "null"]})}, 400),
                       _query("after", _STRING, "The next_after of the previous page"),
                       _LIMIT)},
        f"{PREFIX}/schedules/{{name}}": {
            "get": _op("getSchedule", "A schedule", _responses({200: _SCHEDULE}, 404),
                       _SCHEDULE_NAME),
            "delete": _op("deleteSchedule", "Delete a schedule; its runs go on",
                          _responses({200: _SCHEDULE}, 404), _SCHEDULE_NAME)},
        **{f"{PREFIX}/schedules/{{name}}/{action}": {"post": _op(
            f"{action}Schedule", summary, _responses({200: _SCHEDULE}, 404), _SCHEDULE_NAME)}
           for action, summary in (
               ("pause", "Pause a schedule: no tick starts a run until it is resumed"),
               ("resume", "Resume a schedule from its first tick after now"),
               ("trigger", "Start a run of the schedule now, whatever its overlap policy"))},
        PREFIX: {"get": {
            "operationId": "index", "summary": "Where to go from here: the OpenAPI document, "
            "/healthz and the review inbox (no token needed)",
            "responses": {"200": {"description": "OK", "content": _json_content(_obj(
                ["openapi", "healthz", "inbox"], service=_STRING, openapi=_STRING,
                healthz=_STRING, inbox=_STRING, authentication=_STRING))}}}},
        f"{PREFIX}/healthz": {"get": {
            "operationId": "healthz", "summary": "Per-shard reachability (no token needed)",
            "responses": {code: {"description": text, "content": _json_content(_obj(
                ["ok", "shards"], ok={"type": "boolean"}, shards={"type": "object"}))}
                for code, text in (("200", "Every shard answers"),
                                   ("503", "A shard does not answer"))}}},
    },
}


def _body_keys() -> dict[str, frozenset[str]]:
    found = {}
    for operations in OPENAPI["paths"].values():
        for operation in operations.values():
            schema = operation.get("requestBody", {}).get("content", {}).get(
                "application/json", {}).get("schema", {})
            if schema.get("additionalProperties") is False:
                found[operation["operationId"]] = frozenset(schema["properties"])
    return found


BODY_KEYS = _body_keys()
"""The keys each JSON-object body may hold, by operationId: the routes refuse any other
key from this, so the document and the behaviour cannot disagree."""


def document(workflows: list[str]) -> dict[str, Any]:
    """OPENAPI for a server whose app registers `workflows`: the routes that name a
    registered workflow list the names, so a caller (or a fuzzer) can start real runs
    and follow the links into the routes about one run."""
    served = copy.deepcopy(OPENAPI)
    if not workflows:
        return served
    for path, operations in served["paths"].items():
        if "{name}" not in path or "{execution_id}" in path or "/schedules/" in path:
            continue
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "name" and parameter["in"] == "path":
                    parameter["schema"] = {**parameter["schema"], "enum": sorted(workflows)}
    return served
