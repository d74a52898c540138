"""`shardq limits ...`: concurrency limits per key, read and changed without a restart
(docs/flow-control.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli.common import (
    Settings,
    by_rule,
    check_limit,
    emit,
    errors_as_exit_codes,
    json_option,
    open_client,
    pass_settings,
)
from shardq.core import rules

if TYPE_CHECKING:
    from shardq.core.flow import ConcurrencyLimit


@click.group("limits")
def limits() -> None:
    """Concurrency limits per key: show them, set or reset an operator's limit."""


key_argument = click.argument("key", callback=by_rule(rules.check_concurrency_key))


def _payload(k: ConcurrencyLimit) -> dict[str, Any]:
    return {"key": k.key, "limit": k.limit, "declared": k.declared, "override": k.override,
            "running": k.running, "waiting": k.waiting}


def _line(k: ConcurrencyLimit) -> str:
    source = "declared" if k.override is None else f"set by an operator; declared {k.declared}"
    return f"{k.key}  limit {k.limit} ({source})  running {k.running}  waiting {k.waiting}"


@limits.command("show")
@json_option
@key_argument
@pass_settings
def limits_show(settings: Settings, key: str) -> None:
    """Show KEY's limit, its runs holding a slot and its runs waiting for one (exit 7 when
    no start has declared KEY)."""
    from shardq.core.errors import ConcurrencyKeyNotFound

    with open_client(settings) as client, errors_as_exit_codes():
        found = client.concurrency_limit(key)
        if found is None:
            raise ConcurrencyKeyNotFound(key)
    emit(settings, _payload(found), _line(found))


@limits.command("set")
@json_option
@key_argument
@click.argument("limit", type=int, callback=by_rule(rules.check_concurrency_limit))
@pass_settings
def limits_set(settings: Settings, key: str, limit: int) -> None:
    """Give KEY an operator's LIMIT, which wins over the one its starts declare until
    `limits reset`. A higher limit starts waiting runs at once; a lower one lets the
    runs holding slots finish."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.set_concurrency_limit(key, limit)
    emit(settings, _payload(found), _line(found))


@limits.command("reset")
@json_option
@key_argument
@pass_settings
def limits_reset(settings: Settings, key: str) -> None:
    """Take back KEY's operator limit: the limit its starts declare applies again."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.set_concurrency_limit(key, None)
    emit(settings, _payload(found), _line(found))


@limits.command("list")
@json_option
@click.option("--limit", "count", default=20, show_default=True, callback=check_limit,
              help="How many keys, 1..1000.")
@pass_settings
def limits_list(settings: Settings, count: int) -> None:
    """The keys with the most runs waiting for a slot, most first, over every shard."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.busiest_concurrency_keys(count)
    emit(settings, {"keys": [_payload(k) for k in found]},
         "\n".join(_line(k) for k in found) or "no run waits for a slot")


COMMANDS = [limits]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
