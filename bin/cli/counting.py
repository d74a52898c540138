"""`shardq workflow count`: runs per workflow and state over every shard, exact, at the
cost of a few counter rows and the task rows a shard holds (docs/operations.md,
"Listing and counting runs")."""

from __future__ import annotations

from typing import Any

import click

from shardq.bin.cli.common import (
    Settings,
    by_rule,
    emit_partial,
    errors_as_exit_codes,
    json_option,
    open_client,
    pass_settings,
    where_option,
)
from shardq.core import rules
from shardq.core.models import State

_COLUMNS = list(State)


@click.command("count")
@json_option
@click.option("--tenant", default="default", show_default=True,
              callback=by_rule(lambda value: rules.check_name(value, "tenant")))
@click.option("--all-tenants", is_flag=True, help="Count every tenant's runs.")
@click.option("--workflow", "workflow_name", help="Only runs of this workflow.",
              callback=by_rule(lambda value: value if value is None
                               else rules.check_name(value, "workflow")))
@where_option
@pass_settings
def workflow_count(settings: Settings, tenant: str, all_tenants: bool,
                   workflow_name: str | None, where: tuple[Any, ...]) -> None:
    """Count runs per workflow and state over every shard (with --where, the runs those
    attributes match, read: a count that costs its matches).

    A shard that cannot be read is named on stderr (exit 8); the counts are the
    other shards'."""
    with open_client(settings) as client, errors_as_exit_codes():
        counts = client.count_runs(tenant=None if all_tenants else tenant,
                                   workflow=workflow_name, skip_unavailable=True,
                                   where=where or None)
    width = max([8, *(len(w) for w in counts.by_workflow)])
    lines = [f"{'workflow':<{width}}  " + "  ".join(f"{s.value:>14}" for s in _COLUMNS)]
    rows = [*sorted(counts.by_workflow.items()), ("(all)", counts.by_state)]
    lines += [f"{name:<{width}}  " + "  ".join(f"{states[s]:>14,}" for s in _COLUMNS)
              for name, states in rows]
    emit_partial(settings, counts.as_json(), "\n".join(lines), counts,
                 asked=len(client.map.shards))


WORKFLOW_COMMANDS = [workflow_count]
"""What this module adds to the `shardq workflow` group (bin/cli/main.py)."""
