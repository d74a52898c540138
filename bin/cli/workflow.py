"""`shardq workflow ...`: start, signal, query, update, inspect, decide and cancel runs.

Keys and JSON values are read by the rules the HTTP API reads them by
(bin/web/rules.py), so the command line and the API cannot drift apart.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from shardq.bin.cli.common import (
    ENV_APP,
    EXIT_WORKFLOW,
    Seconds,
    Settings,
    app_client,
    app_option,
    check_limit,
    check_moment,
    emit,
    emit_partial,
    errors_as_exit_codes,
    fail,
    json_option,
    load_registry,
    open_client,
    pass_settings,
    where_option,
)
from shardq.core.models import Event, State

if TYPE_CHECKING:
    from datetime import datetime

    from shardq.core.models import Execution, UpdateResult

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@click.group("workflow")
def workflow() -> None:
    """Start, signal, inspect and cancel workflow runs."""


def json_argument(_ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """JSON text, `@path` (a UTF-8 file) or `-` (stdin): big inputs need not fit in argv.

    Read by the rules the HTTP API reads bodies by (shardq.core.rules)."""
    from shardq.core.rules import RuleBroken, json_value

    if value is None:
        return None
    try:
        return json_value(_read_value(value, param), "the value")
    except RuleBroken as exc:
        raise click.BadParameter(str(exc).removeprefix("the value "), param=param) from None


def _read_value(value: str, param: click.Parameter) -> str:
    source = "stdin" if value == "-" else value[1:]
    try:
        if value == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        if value.startswith("@"):
            return Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {source}: {exc.strerror}", param=param) from None
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{source} is not UTF-8 text (byte {exc.start}: {exc.reason})", param=param
        ) from None
    return value


def _execution_id(_ctx: click.Context, param: click.Parameter, value: str) -> uuid.UUID:
    from shardq.shards.routing import InvalidExecutionId, parse_execution_id

    try:
        return parse_execution_id(value)
    except InvalidExecutionId as exc:
        raise click.BadParameter(str(exc), param=param) from None


def _check_cursor(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The --cursor of `workflow list` or of `workflow pending` (each pages its own way)."""
    from shardq.core.errors import InvalidArgument
    from shardq.store.listing import Cursor, InboxCursor

    decode = InboxCursor.decode if ctx.command.name == "pending" else Cursor.decode
    if value is not None:
        try:
            decode(value)
        except InvalidArgument:
            raise click.BadParameter(
                "is not a cursor: pass the next_cursor a previous page printed", param=param
            ) from None
    return value


def _execution_payload(e: Execution) -> dict[str, Any]:
    from dataclasses import asdict

    return {**asdict(e), "state": e.state.value}


def _check_key(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Read by the rules the HTTP API reads the Idempotency-Key header by
    (shardq.core.rules)."""
    from shardq.core.rules import RuleBroken, idempotency_key

    try:
        return idempotency_key(value, "the key")
    except RuleBroken as exc:
        raise click.BadParameter(str(exc).removeprefix("the key "), param=param) from None


tenant_option = click.option("--tenant", default="default", show_default=True)
execution_id_argument = click.argument("execution_id", callback=_execution_id)
payload_option = click.option(
    "--payload-json", "--payload", "payload", callback=json_argument, metavar="JSON|@FILE|-",
    help="The signal's JSON payload: JSON text, @FILE or - for stdin (--payload is an alias).",
)
start_input_option = click.option(
    "--input", "input_value", callback=json_argument, metavar="JSON|@FILE|-",
    help="The input if the run is started: JSON text, @FILE or - for stdin.")


def _check_priority(_ctx: click.Context, param: click.Parameter,
                    value: int | None) -> int | None:
    from shardq.core.errors import InvalidArgument
    from shardq.core.rules import check_priority

    try:
        return None if value is None else check_priority(value)
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param=param) from None


priority_option = click.option(
    "--priority", type=int, callback=_check_priority, metavar="0-9",
    help="The new run's priority, higher claimed first (default: the workflow's own, "
         "else 0).")


def _check_concurrency(_ctx: click.Context, param: click.Parameter,
                       value: str | None) -> tuple[str, int] | None:
    """KEY=LIMIT, read by the client's rules (the key may hold '=': the last one splits)."""
    from shardq.core.errors import InvalidArgument
    from shardq.core.rules import check_concurrency

    if value is None:
        return None
    key, sep, limit = value.rpartition("=")
    if not sep or not (limit.isascii() and limit.lstrip("-").isdigit()):
        raise click.BadParameter(f"{value!r} is not KEY=LIMIT (LIMIT a whole number)",
                                 param=param)
    try:
        return check_concurrency((key, int(limit)))
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param=param) from None


concurrency_option = click.option(
    "--concurrency", callback=_check_concurrency, metavar="KEY=LIMIT",
    help="At most LIMIT runs of KEY at once (default: the workflow's own, if it declares "
         "one).")
key_option = click.option(
    "--idempotency-key", callback=_check_key,
    help="Repeats with this key are delivered once (per run).",
)


def _signal_text(delivered: bool, created: bool | None = None) -> str:
    text = "delivered" if delivered else "duplicate (already delivered with this key)"
    return text if created is None else ("started, " if created else "existing run, ") + text


@workflow.command("start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.option("--input", "input_value", callback=json_argument, metavar="JSON|@FILE|-",
              help="The run's input: JSON text, @FILE or - for stdin.")
@priority_option
@concurrency_option
@pass_settings
def workflow_start(
    settings: Settings, app: str | None, tenant: str, name: str, workflow_id: str,
    input_value: Any, priority: int | None, concurrency: tuple[str, int] | None,
) -> None:
    """Start NAME with the business key WORKFLOW_ID (idempotent on the key)."""
    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings, registry) as client, errors_as_exit_codes():
        result = client.start(name, workflow_id, input_value, tenant=tenant, priority=priority,
                              concurrency=concurrency)
    emit(
        settings,
        {"execution_id": str(result.execution_id), "created": result.created,
         "state": result.state.value},
        f"{result.execution_id} {'started' if result.created else 'already exists'} "
        f"({result.state.value})",
    )


@workflow.command("signal")
@json_option
@tenant_option
@execution_id_argument
@click.argument("name")
@payload_option
@key_option
@click.option("--app", envvar=ENV_APP, metavar="MODULE:ATTR",
              help="The app's Registry: the payload is checked against the schema the "
                   f"run's workflow publishes for NAME [env {ENV_APP}; optional here].")
@pass_settings
def workflow_signal(
    settings: Settings, tenant: str, execution_id: uuid.UUID, name: str,
    payload: Any, idempotency_key: str | None, app: str | None,
) -> None:
    """Send signal NAME to a run."""
    from shardq.bin.web.rules import send_signal
    from shardq.core.errors import PayloadInvalid

    with errors_as_exit_codes():
        registry = load_registry(app) if app else None
    with open_client(settings, registry) as client, errors_as_exit_codes():
        result = send_signal(client, execution_id, name, payload, idempotency_key, tenant)
        if isinstance(result.error, PayloadInvalid):
            fail(str(result.error), EXIT_WORKFLOW, {"violations": result.error.violations})
        if result.error is not None:
            raise result.error
    emit(
        settings,
        {"execution_id": str(result.execution_id), "signal_id": result.signal_id,
         "signal_name": result.signal_name, "delivered": result.delivered},
        _signal_text(result.delivered),
    )


@workflow.command("signal-with-start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.argument("signal_name")
@start_input_option
@payload_option
@key_option
@priority_option
@pass_settings
def workflow_signal_with_start(
    settings: Settings, app: str | None, tenant: str, name: str, workflow_id: str,
    signal_name: str, input_value: Any, payload: Any, idempotency_key: str | None,
    priority: int | None,
) -> None:
    """Send SIGNAL_NAME to the run of NAME with key WORKFLOW_ID, starting it if it has none."""
    with errors_as_exit_codes():
        registry = load_registry(app)
    with open_client(settings, registry) as client, errors_as_exit_codes():
        result = client.signal_with_start(
            name, workflow_id, input_value, signal_name, payload,
            idempotency_key=idempotency_key, tenant=tenant, priority=priority,
        )
    emit(
        settings,
        {"execution_id": str(result.execution_id), "created": result.created,
         "signal_id": result.signal_id, "signal_name": result.signal_name,
         "delivered": result.delivered},
        f"{result.execution_id} {_signal_text(result.delivered, result.created)}",
    )


@workflow.command("interface")
@json_option
@app_option
@click.argument("name")
@pass_settings
def workflow_interface(settings: Settings, app: str | None, name: str) -> None:
    """The signals, queries and updates workflow NAME publishes, with their JSON Schemas."""
    with errors_as_exit_codes():
        published = load_registry(app).get(name).interface()
    lines = [f"{kind[:-1]} {entry['name']}" + (f": {entry['description']}"
                                                if "description" in entry else "")
             for kind, entries in published.items() for entry in entries]
    emit(settings, published, "\n".join(lines) or f"{name} publishes nothing")


argument_option = click.option(
    "--arg", "argument", callback=json_argument, metavar="JSON|@FILE|-",
    help="The handler's JSON argument: JSON text, @FILE or - for stdin.")
wait_option = click.option(
    "--wait", default=30.0, show_default=True, type=Seconds(zero_ok=True, maximum=600),
    help="Seconds to wait for the run to handle the update (it stays stored after).")


@workflow.command("query")
@json_option
@app_option
@tenant_option
@execution_id_argument
@click.argument("name")
@argument_option
@pass_settings
def workflow_query(
    settings: Settings, app: str | None, tenant: str, execution_id: uuid.UUID, name: str,
    argument: Any,
) -> None:
    """Answer query NAME from the run's committed state (no worker needed)."""
    with app_client(settings, app) as client, errors_as_exit_codes():
        result = _refusing_payloads(lambda: client.query(execution_id, name, argument,
                                                          tenant=tenant))
    emit(settings, {"result": result}, json.dumps(result, indent=2))


@workflow.command("update")
@json_option
@app_option
@tenant_option
@execution_id_argument
@click.argument("name")
@argument_option
@key_option
@wait_option
@pass_settings
def workflow_update(
    settings: Settings, app: str | None, tenant: str, execution_id: uuid.UUID, name: str,
    argument: Any, idempotency_key: str | None, wait: float,
) -> None:
    """Ask the run to handle update NAME; prints the handler's response once recorded."""
    with app_client(settings, app) as client, errors_as_exit_codes():
        result = _refusing_payloads(lambda: client.update(
            execution_id, name, argument, idempotency_key=idempotency_key, tenant=tenant,
            wait=wait))
    _emit_update(settings, result)


@workflow.command("update-with-start")
@json_option
@app_option
@tenant_option
@click.argument("name")
@click.argument("workflow_id")
@click.argument("update_name")
@start_input_option
@argument_option
@key_option
@wait_option
@priority_option
@pass_settings
def workflow_update_with_start(
    settings: Settings, app: str | None, tenant: str, name: str, workflow_id: str,
    update_name: str, input_value: Any, argument: Any, idempotency_key: str | None,
    wait: float, priority: int | None,
) -> None:
    """Update the run of NAME with key WORKFLOW_ID, starting it if it has none."""
    with app_client(settings, app) as client, errors_as_exit_codes():
        result = _refusing_payloads(lambda: client.update_with_start(
            name, workflow_id, input_value, update_name, argument,
            idempotency_key=idempotency_key, tenant=tenant, wait=wait, priority=priority))
    _emit_update(settings, result)


def _refusing_payloads(call: Callable[[], T]) -> T:
    """`call()`; a payload that breaks its schema exits 7 with the violations (--json)."""
    from shardq.core.errors import PayloadInvalid, UpdateTimedOut

    try:
        return call()
    except PayloadInvalid as exc:
        fail(str(exc), EXIT_WORKFLOW, {"violations": exc.violations})
    except UpdateTimedOut as exc:
        fail(str(exc), EXIT_WORKFLOW, {"update_id": exc.update_id, "completed": False})


def _emit_update(settings: Settings, result: UpdateResult) -> None:
    emit(settings, {"execution_id": str(result.execution_id), "update_id": result.update_id,
                    "response": result.response, "accepted": result.accepted,
                    "created": result.created},
         json.dumps(result.response, indent=2)
         + ("" if result.accepted else "\n(already recorded with this key)"))


@workflow.command("show")
@json_option
@tenant_option
@execution_id_argument
@click.option("--history/--no-history", default=True, show_default=True)
@pass_settings
def workflow_show(settings: Settings, tenant: str, execution_id: uuid.UUID, history: bool) -> None:
    """Show a run: its state, open wait, buffered signals and history."""
    from dataclasses import asdict
    from datetime import UTC, datetime

    with open_client(settings) as client, errors_as_exit_codes():
        view = client.describe(execution_id, tenant=tenant, history=history)
    execution, wait, buffered, events = view.execution, view.wait, view.pending, view.history
    now = datetime.now(UTC)
    lines = [
        f"{execution.id}  {execution.workflow_name} v{execution.workflow_version}  "
        f"{execution.workflow_id}  {execution.state.value}  priority {execution.priority}"
    ]
    if execution.concurrency_key is not None:
        lines.append(f"  concurrency key {execution.concurrency_key!r}"
                     + (": waiting for a slot" if execution.waiting_for_slot else ""))
    if execution.build_id is not None:
        lines.append(f"  build {execution.build_id}"
                     + (" (pinned)" if execution.pinned else " (any worker)"))
    if execution.attributes:
        lines.append(f"  attributes {json.dumps(execution.attributes, sort_keys=True)}")
    if view.rate_limited is not None:
        lines.append(f"  rate limited by {view.rate_limited.limiter!r} until "
                     f"{view.rate_limited.until.isoformat()}")
    if wait is not None:
        deadline = f", deadline {wait.deadline.isoformat()}" if wait.deadline else ""
        lines.append(f"  waits on {wait.kind} {wait.name!r} for "
                     f"{(now - wait.started_at).total_seconds():.0f} s{deadline}")
    lines += [f"  child of {e.payload['parent']} (its call {e.payload['position']})"
              for e in events if e.kind == Event.CHILD_OF]
    lines += [f"  child {c.workflow} {c.workflow_id!r} ({c.child_id}, policy {c.policy}): "
              f"{c.ended or 'running'}" for c in view.children]
    lines += [f"  buffered signal {b.name!r} (id {b.id}), "
              f"{(now - b.received_at).total_seconds():.0f} s old" for b in buffered]
    lines += [f"  {e.seq:>6} {e.position if e.position is not None else '-':>4} "
              f"{e.kind:<18} {e.name}  {json.dumps(e.payload)}" for e in events]
    emit(settings, {**_execution_payload(execution),
                    "open_wait": asdict(wait) if wait else None,
                    "rate_limited": asdict(view.rate_limited) if view.rate_limited else None,
                    "children": [asdict(c) for c in view.children],
                    "pending_signals": [asdict(b) for b in buffered],
                    "history": [asdict(e) for e in events]},
         "\n".join(lines))


def page_options(f: F) -> F:
    """--limit and --cursor of a command that lists a page at a time."""
    limit = click.option("--limit", default=100, show_default=True, callback=check_limit,
                         help="Page size, 1..1000.")
    cursor = click.option("--cursor", callback=_check_cursor,
                          help="next_cursor of the previous page.")
    return limit(cursor(f))


@workflow.command("list")
@json_option
@tenant_option
@click.option("--state", type=click.Choice([s.value for s in State]),
              help="Only runs in this state.")
@click.option("--workflow", "workflow_name", help="Only runs of this workflow.")
@click.option("--priority", type=int, callback=_check_priority, metavar="0-9",
              help="Only runs of this priority.")
@click.option("--created-after", callback=check_moment, metavar="TIME",
              help="Only runs created at or after this ISO 8601 time (with its offset).")
@click.option("--created-before", callback=check_moment, metavar="TIME",
              help="Only runs created before this ISO 8601 time.")
@where_option
@page_options
@pass_settings
def workflow_list(
    settings: Settings, tenant: str, state: str | None, workflow_name: str | None,
    priority: int | None, created_after: datetime | None, created_before: datetime | None,
    where: tuple[Any, ...], limit: int, cursor: str | None,
) -> None:
    """List runs over every shard, oldest first, one page at a time.

    A shard that cannot be read is named on stderr (exit 8); the page holds the
    others' runs, and its cursor goes past what that shard holds before it."""
    with open_client(settings) as client, errors_as_exit_codes():
        page = client.list_runs(tenant=tenant, state=state, workflow=workflow_name, limit=limit,
                                cursor=cursor, skip_unavailable=True, priority=priority,
                                created_after=created_after, created_before=created_before,
                                where=where or None)
        asked = len(client.map.shards)
    lines = [f"{e.id}  {e.workflow_name:<12} {e.workflow_id:<24} {e.state.value}"
             for e in page.items]
    if page.next_cursor:
        lines.append(f"next page: --cursor {page.next_cursor}")
    emit_partial(settings, {"items": [_execution_payload(e) for e in page.items],
                            "next_cursor": page.next_cursor}, "\n".join(lines), page,
                 asked=asked)


@workflow.command("cancel")
@json_option
@tenant_option
@execution_id_argument
@click.option("--actor", help="Who cancels: recorded as the decision of an open interrupt.")
@pass_settings
def workflow_cancel(
    settings: Settings, tenant: str, execution_id: uuid.UUID, actor: str | None
) -> None:
    """Cancel a run (at once when parked, at its next checkpoint when running)."""
    with open_client(settings) as client, errors_as_exit_codes():
        state = client.cancel(execution_id, tenant=tenant, actor=actor)
    emit(settings, {"execution_id": str(execution_id), "state": state.value}, state.value)


@workflow.command("set-priority")
@json_option
@tenant_option
@execution_id_argument
@click.argument("priority", type=int, callback=_check_priority, metavar="0-9")
@pass_settings
def workflow_set_priority(
    settings: Settings, tenant: str, execution_id: uuid.UUID, priority: int
) -> None:
    """Give a live run a new priority (higher claimed first), for its next claim and every
    later wake; a finished run is left as it ended. Prints the run's state."""
    with open_client(settings) as client, errors_as_exit_codes():
        state = client.set_priority(execution_id, priority, tenant=tenant)
    emit(settings, {"execution_id": str(execution_id), "priority": priority,
                    "state": state.value}, f"{state.value}  priority {priority}")


@workflow.command("pending")
@json_option
@tenant_option
@click.option("--workflow", "workflow_name", help="Only interrupts of this workflow's runs.")
@page_options
@pass_settings
def workflow_pending(
    settings: Settings, tenant: str, workflow_name: str | None, limit: int, cursor: str | None,
) -> None:
    """List open interrupts (runs waiting for a person) over every shard, oldest first.

    A shard that cannot be read is named on stderr (exit 8); the others' are shown."""
    from dataclasses import asdict
    from datetime import UTC, datetime

    with open_client(settings) as client, errors_as_exit_codes():
        page = client.pending_interrupts(tenant=tenant, workflow=workflow_name, limit=limit,
                                         cursor=cursor, skip_unavailable=True)
        asked = len(client.map.shards)
    now = datetime.now(UTC)
    lines = []
    for p in page.items:
        deadline = f", deadline {p.deadline.isoformat()}" if p.deadline else ""
        waited = (now - p.requested_at).total_seconds()
        lines.append(f"{p.execution_id}  {p.workflow_name} {p.workflow_id}  {p.name}  "
                     f"[{'/'.join(p.actions)}]  waiting {waited:.0f} s{deadline}\n"
                     f"    {p.prompt}")
    if page.next_cursor:
        lines.append(f"next page: --cursor {page.next_cursor}")
    empty = "nothing waits for a decision" + (" on the shards read"
                                               if page.unavailable_shards else "")
    emit_partial(settings, {"items": [asdict(p) for p in page.items],
                            "next_cursor": page.next_cursor},
                 "\n".join(lines) if lines else empty, page, asked=asked)


@workflow.command("decide")
@json_option
@tenant_option
@execution_id_argument
@click.argument("interrupt")
@click.option("--action", required=True, type=click.Choice(["approve", "edit", "reject"]))
@click.option(
    "--payload-json", "--payload", "payload", callback=json_argument, metavar="JSON|@FILE|-",
    help="The decision's JSON payload (the edited value for edit): JSON text, @FILE or -.",
)
@click.option("--decision-id", required=True,
              help="Names this decision: sending it again changes nothing.")
@click.option("--actor", required=True, help="Who decides (recorded in the run's history).")
@pass_settings
def workflow_decide(
    settings: Settings, tenant: str, execution_id: uuid.UUID, interrupt: str, action: str,
    payload: Any, decision_id: str, actor: str,
) -> None:
    """Decide the run's open interrupt INTERRUPT: approve, edit or reject."""
    from shardq.core.errors import DecisionRefused, PayloadInvalid

    with open_client(settings) as client, errors_as_exit_codes():
        try:
            result = client.decide(execution_id, interrupt, action, payload,
                                   decision_id=decision_id, actor=actor, tenant=tenant)
        except PayloadInvalid as exc:
            fail(str(exc), EXIT_WORKFLOW, {"violations": exc.violations})
        except DecisionRefused as exc:
            fail(str(exc), EXIT_WORKFLOW,
                 {"reason_code": exc.reason_code, "standing": exc.standing})
    decision = result.decision
    emit(settings, {"execution_id": str(execution_id), "accepted": result.accepted,
                    "decision": decision.as_json()},
         f"{decision.action} by {decision.actor} "
         + ("accepted" if result.accepted else "(already recorded: nothing changed)"))


COMMANDS = [workflow]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
