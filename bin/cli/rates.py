"""`shardq rates ...`: rate limiters, read and changed without a restart
(docs/flow-control.md)."""

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
    from shardq.core.flow import RateLimit, RateLimiter


@click.group("rates")
def rates() -> None:
    """Rate limiters: show them, set or reset an operator's rate."""


name_argument = click.argument(
    "name", callback=by_rule(lambda value: rules.check_name(value, "rate limiter")))


def _numbers(limit: RateLimit) -> dict[str, Any]:
    return {"rate": limit.rate, "per": limit.per, "burst": limit.burst}


def _payload(found: RateLimiter) -> dict[str, Any]:
    return {"name": found.name, **_numbers(found.limit), "declared": _numbers(found.declared),
            "override": None if found.override is None else _numbers(found.override),
            "waiting": found.waiting, "backlog_s": round(found.backlog_s, 3)}


def _said(limit: RateLimit) -> str:
    return f"{limit.rate} per {limit.per:g} s, burst {limit.burst}"


def _line(found: RateLimiter) -> str:
    source = ("declared" if found.override is None
              else f"set by an operator; declared {_said(found.declared)}")
    backlog = f"  next slot in {found.backlog_s:.1f} s" if found.backlog_s >= 0.05 else ""
    return f"{found.name}  {_said(found.limit)} ({source})  waiting {found.waiting}{backlog}"


@rates.command("show")
@json_option
@name_argument
@pass_settings
def rates_show(settings: Settings, name: str) -> None:
    """Show limiter NAME: its rate, the steps parked for a slot, how far ahead slots are
    given (exit 7 when no worker has declared NAME)."""
    from shardq.core.errors import RateLimiterNotFound

    with open_client(settings) as client, errors_as_exit_codes():
        found = client.rate_limiter(name)
        if found is None:
            raise RateLimiterNotFound(name)
    emit(settings, _payload(found), _line(found))


@rates.command("list")
@json_option
@pass_settings
def rates_list(settings: Settings) -> None:
    """Every limiter the workers have declared, by name."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.rate_limiters()
    emit(settings, {"limiters": [_payload(f) for f in found]},
         "\n".join(_line(f) for f in found) or "no rate limiter is declared")


@rates.command("set")
@json_option
@name_argument
@click.argument("rate", type=int)
@click.option("--per", type=float, default=1.0, show_default=True,
              help="The period RATE steps start in, in seconds.")
@click.option("--burst", type=int, default=1, show_default=True,
              help="How many may start at once after a quiet spell.")
@pass_settings
def rates_set(settings: Settings, name: str, rate: int, per: float, burst: int) -> None:
    """Give limiter NAME an operator's RATE per --per seconds, which wins over the declared
    one until `rates reset`. Steps already parked keep the slot they were given."""
    from shardq.core.errors import InvalidArgument

    try:
        limit = rules.check_rate_limit(rate, per, burst)
    except InvalidArgument as exc:
        raise click.UsageError(str(exc)) from None
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.set_rate_limit(name, limit)
    emit(settings, _payload(found), _line(found))


@rates.command("reset")
@json_option
@name_argument
@pass_settings
def rates_reset(settings: Settings, name: str) -> None:
    """Take back NAME's operator rate: the declared one applies again."""
    with open_client(settings) as client, errors_as_exit_codes():
        found = client.set_rate_limit(name, None)
    emit(settings, _payload(found), _line(found))


COMMANDS = [rates]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
