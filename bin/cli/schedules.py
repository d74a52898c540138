"""`shardq schedule ...`: schedules, created, read and changed (docs/schedules.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli.common import (
    Settings,
    app_option,
    by_rule,
    emit,
    errors_as_exit_codes,
    json_option,
    open_client,
    pass_settings,
)
from shardq.bin.cli.workflow import json_argument, tenant_option
from shardq.bin.loading import load_registry
from shardq.core import rules

if TYPE_CHECKING:
    from shardq.core.schedules import Schedule


@click.group("schedule")
def schedule() -> None:
    """Schedules: runs of a workflow started by a clock (cron or interval)."""


name_argument = click.argument(
    "name", callback=by_rule(lambda value: rules.check_name(value, "schedule")))


def _payload(found: Schedule) -> dict[str, Any]:
    return {"name": found.name, "tenant": found.tenant, "workflow": found.workflow,
            "input": found.input, "cron": found.cron, "every_s": found.every_s,
            "timezone": found.timezone, "overlap": found.overlap,
            "catchup_window_s": found.catchup_s, "paused": found.paused,
            "next_at": found.next_at, "last_tick": found.last_tick,
            "last_run": found.last_run, "buffered_at": found.buffered_at,
            "triggered_at": found.triggered_at, "started": found.started,
            "skipped": found.skipped, "missed": found.missed}


def _line(found: Schedule) -> str:
    clock = (f"cron {found.cron!r} ({found.timezone})" if found.cron is not None
             else f"every {found.every_s:g} s")
    state = "paused" if found.paused else (
        f"next {found.next_at.isoformat()}" if found.next_at else "fires no more")
    return (f"{found.name}  {found.workflow}  {clock}  overlap {found.overlap}  {state}  "
            f"started {found.started}  skipped {found.skipped}  missed {found.missed}")


@schedule.command("create")
@json_option
@app_option
@tenant_option
@name_argument
@click.option("--workflow", required=True, help="The workflow each tick starts a run of.")
@click.option("--cron", help="A cron expression (5 fields), read in --timezone.")
@click.option("--every", type=float, help="Or an interval, in seconds (>= 1).")
@click.option("--timezone", default="UTC", show_default=True,
              help="The IANA time zone the cron expression is read in (DST included).")
@click.option("--overlap", default="skip", show_default=True,
              type=click.Choice(["skip", "buffer_one", "allow"]),
              help="A tick while the last run still runs: skip it, hold one, or run it.")
@click.option("--catchup-window", type=float, default=600.0, show_default=True,
              help="Seconds: ticks missed by more than this are counted, not run.")
@click.option("--input", "input_value", callback=json_argument, metavar="JSON|@FILE|-",
              help="Each run's input: JSON text, @FILE or - for stdin.")
@pass_settings
def schedule_create(
    settings: Settings, app: str | None, tenant: str, name: str, workflow: str,
    cron: str | None, every: float | None, timezone: str, overlap: str,
    catchup_window: float, input_value: Any,
) -> None:
    """Create schedule NAME: its first tick comes after now. Exit 7 for a bad field
    (a cron expression that never fires, an unknown time zone or workflow) or a name
    already taken."""
    with errors_as_exit_codes():
        registry = load_registry(app)
        with open_client(settings, registry) as client:
            found = client.create_schedule(
                name, workflow, input_value, cron=cron, every=every, timezone=timezone,
                overlap=overlap, catchup_window=catchup_window, tenant=tenant)
    emit(settings, _payload(found), _line(found))


@schedule.command("list")
@json_option
@tenant_option
@click.option("--after", default="", help="Names after this one (the next page).")
@pass_settings
def schedule_list(settings: Settings, tenant: str, after: str) -> None:
    """The tenant's schedules, by name, 100 at a time."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.schedules(tenant=tenant, after=after)
    emit(settings, {"schedules": [_payload(f) for f in found]},
         "\n".join(_line(f) for f in found) or "no schedule")


@schedule.command("show")
@json_option
@tenant_option
@name_argument
@pass_settings
def schedule_show(settings: Settings, tenant: str, name: str) -> None:
    """Show schedule NAME (exit 7 when there is none)."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.schedule(name, tenant=tenant)
    emit(settings, _payload(found), _line(found))


def _change(action: str, summary: str) -> click.Command:
    @json_option
    @tenant_option
    @name_argument
    @pass_settings
    def change(settings: Settings, tenant: str, name: str) -> None:
        with open_client(settings) as client, errors_as_exit_codes():
            found = getattr(client, f"{action}_schedule")(name, tenant=tenant)
        emit(settings, _payload(found), _line(found))

    change.__doc__ = summary
    return schedule.command(action)(change)


_change("pause", "Pause schedule NAME: no tick starts a run until it is resumed.")
_change("resume", "Resume schedule NAME from its first tick after now.")
_change("trigger", "Start a run of schedule NAME now, whatever its overlap policy.")
_change("delete", "Delete schedule NAME; the runs it started go on.")

COMMANDS = [schedule]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
