"""`shardq workflow cancel-matching` and `signal-matching`: bulk actions by query, with
a dry run and a bound (client/bulk.py; docs/operations.md, "Search attributes")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from shardq.bin.cli.common import (
    Settings,
    by_rule,
    check_moment,
    emit,
    errors_as_exit_codes,
    json_option,
    open_client,
    pass_settings,
    where_option,
)
from shardq.bin.cli.workflow import key_option, payload_option
from shardq.core import rules
from shardq.core.models import State

F = TypeVar("F", bound=Callable[..., Any])


def _bulk_filters(f: F) -> F:
    """The filters of a bulk action: a listing's."""
    for option in reversed((
        click.option("--tenant", default="default", show_default=True,
                     callback=by_rule(lambda value: rules.check_name(value, "tenant"))),
        click.option("--all-tenants", is_flag=True, help="Every tenant's runs."),
        click.option("--state", type=click.Choice([s.value for s in State if not s.terminal]),
                     help="Only runs in this state."),
        click.option("--workflow", "workflow_name", help="Only runs of this workflow."),
        where_option,
        click.option("--created-after", callback=check_moment, metavar="TIME",
                     help="Only runs created at or after this ISO 8601 time."),
        click.option("--created-before", callback=check_moment, metavar="TIME",
                     help="Only runs created before this ISO 8601 time."),
        click.option("--max-runs", type=int, default=1000, show_default=True,
                     help="Do nothing when more live runs than this match."),
        click.option("--dry-run", is_flag=True, help="List the runs; act on none."),
    )):
        f = option(f)
    return f


def _query(tenant: str, all_tenants: bool, state: str | None, workflow_name: str | None,
           where: tuple[Any, ...], after: datetime | None,
           before: datetime | None) -> dict[str, Any]:
    return {"tenant": None if all_tenants else tenant, "state": state,
            "workflow": workflow_name, "where": where or None, "created_after": after,
            "created_before": before}


def _emit(settings: Settings, result: Any) -> None:
    verb = {"cancel": "cancelled", "signal": "signalled"}[result.action]
    lines = [f"{len(result.matched)} live run(s) match"
             + (" (dry run: nothing done)" if result.dry_run else f"; {len(result.done)} {verb}")]
    lines += [f"  {ident}" for ident in (result.matched if result.dry_run else result.done)]
    lines += [f"  {ident} skipped: {why}" for ident, why in result.skipped.items()]
    emit(settings, result.as_json(), "\n".join(lines))


@click.command("cancel-matching")
@json_option
@_bulk_filters
@click.option("--actor", help="Who cancels: recorded as the decision of an open interrupt.")
@pass_settings
def workflow_cancel_matching(
    settings: Settings, tenant: str, all_tenants: bool, state: str | None,
    workflow_name: str | None, where: tuple[Any, ...], created_after: datetime | None,
    created_before: datetime | None, max_runs: int, dry_run: bool, actor: str | None,
) -> None:
    """Cancel every live run the filters match (at least one filter), or none when more
    than --max-runs match (exit 7)."""
    with open_client(settings) as client, errors_as_exit_codes():
        result = client.cancel_matching(
            dry_run=dry_run, max_runs=max_runs, actor=actor, **_query(
                tenant, all_tenants, state, workflow_name, where, created_after,
                created_before))
    _emit(settings, result)


@click.command("signal-matching")
@json_option
@click.argument("name")
@payload_option
@key_option
@_bulk_filters
@pass_settings
def workflow_signal_matching(
    settings: Settings, name: str, payload: Any, idempotency_key: str | None,
    tenant: str, all_tenants: bool, state: str | None, workflow_name: str | None,
    where: tuple[Any, ...], created_after: datetime | None, created_before: datetime | None,
    max_runs: int, dry_run: bool,
) -> None:
    """Send signal NAME to every live run the filters match (at least one filter), or to
    none when more than --max-runs match (exit 7). With --idempotency-key, each run
    takes it once: the command can be run again after a failure."""
    with open_client(settings) as client, errors_as_exit_codes():
        result = client.signal_matching(
            name, payload, idempotency_key=idempotency_key, dry_run=dry_run, max_runs=max_runs,
            **_query(tenant, all_tenants, state, workflow_name, where, created_after,
                     created_before))
    _emit(settings, result)


WORKFLOW_COMMANDS = [workflow_cancel_matching, workflow_signal_matching]
"""What this module adds to the `shardq workflow` group (bin/cli/main.py)."""
