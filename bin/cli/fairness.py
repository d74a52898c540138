"""`shardq fairness ...`: tenants' weights in fair claims, read and changed without a
restart (docs/flow-control.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli.common import (
    Settings,
    by_rule,
    emit,
    errors_as_exit_codes,
    json_option,
    open_client,
    pass_settings,
)
from shardq.core import rules

if TYPE_CHECKING:
    from shardq.core.flow import TenantWeights


@click.group("fairness")
def fairness() -> None:
    """Tenants' weights in fair claims: show them, set or reset one."""


tenant_argument = click.argument(
    "tenant", callback=by_rule(lambda value: rules.check_name(value, "tenant")))


def _payload(found: TenantWeights) -> dict[str, Any]:
    return {"weights": found.weights, "differing": found.differing}


def _text(found: TenantWeights) -> str:
    lines = [f"{tenant}  weight {weight}" for tenant, weight in found.weights.items()]
    lines += [f"{tenant}  differs between shards: "
              + ", ".join(f"{shard} {weight}" for shard, weight in seen.items())
              + " (set it again)" for tenant, seen in found.differing.items()]
    return "\n".join(lines) or "every tenant weighs 1"


@fairness.command("show")
@json_option
@pass_settings
def fairness_show(settings: Settings) -> None:
    """The weights operators gave tenants (any other tenant weighs 1), and any tenant
    whose weight differs between shards."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.tenant_weights()
    emit(settings, _payload(found), _text(found))


@fairness.command("set")
@json_option
@tenant_argument
@click.argument("weight", type=int, callback=by_rule(rules.check_tenant_weight))
@pass_settings
def fairness_set(settings: Settings, tenant: str, weight: int) -> None:
    """Give TENANT a WEIGHT (1..1000) on every shard: under a backlog, each claim shares
    its batch between the tenants with due runs in proportion to their weights."""
    with open_client(settings) as client, errors_as_exit_codes():
        client.set_tenant_weight(tenant, weight)
        found = client.tenant_weights()
    emit(settings, _payload(found), _text(found))


@fairness.command("reset")
@json_option
@tenant_argument
@pass_settings
def fairness_reset(settings: Settings, tenant: str) -> None:
    """Take back TENANT's weight on every shard: it weighs 1 again."""
    with open_client(settings) as client, errors_as_exit_codes():
        client.set_tenant_weight(tenant, None)
        found = client.tenant_weights()
    emit(settings, _payload(found), _text(found))


COMMANDS = [fairness]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
