"""`shardq shards`: the shard map's commands.

`shards` alone, or `shards status`: the map version, each shard's ranges,
reachability, schema version and runs, and any move in progress. `shards add`
and `shards remove` write a new map version with one shard more or less (owning
no buckets). The move commands (`move`, `rebalance`) are bin/cli/moves.py's,
registered into this group.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli import moves
from shardq.bin.cli.common import Settings, emit, errors_as_exit_codes, json_option, pass_settings

if TYPE_CHECKING:
    from shardq.shards.config import ShardMap
    from shardq.shards.migrations import ShardStatus

MoveReader = Callable[["ShardMap"], list[dict[str, Any]]]
MOVE_STATUS: list[MoveReader] = []
"""Where `shards status` reads the moves in progress: the move journal's reader
(moves/, registered by bin/cli/moves.register) appends a function here that takes
the current map and returns one JSON object per move in progress, with at least
`text`, the line to print. Until one is registered, status shows no moves."""


def moves_in_progress(shard_map: ShardMap) -> list[dict[str, Any]]:
    return [move for reader in MOVE_STATUS for move in reader(shard_map)]


@click.group("shards", invoke_without_command=True)
@json_option
@click.pass_context
def shards_group(ctx: click.Context) -> None:
    """The shard map: status (the default), add, remove, and moving bucket ranges."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(status_command)


@shards_group.command("status")
@json_option
@pass_settings
def status_command(settings: Settings) -> None:
    """Show the map version, each shard's ranges, reachability, schema version and runs,
    and any move in progress."""
    from shardq.shards.fanout import each_shard
    from shardq.shards.migrations import count_runs, load_schema, read_map

    with errors_as_exit_codes():
        seeds = settings.shard_map()
        schema = load_schema()
        view = read_map(seeds, schema=schema)
        current = view.map
        runs = each_shard([s.shard for s in view.statuses if s.reachable], count_runs).answers
        in_progress = moves_in_progress(current)
    rows = [_row(st, runs.get(st.shard), current) for st in view.statuses]
    lines = [f"shard map version {current.version}, home {current.home}, "
             f"schema version needed {schema.version}"]
    for r in rows:
        state = "ok" if r["ok"] else r["problem"]
        ranges = ", ".join(f"{a}-{b}" for a, b in r["ranges"]) or "no buckets"
        left = "" if r["in_map"] else " (not in the map)"
        lines.append(f"  {r['name']:<10} {ranges:<11} {r['url']}  schema "
                     f"{r['schema_version']}  map {r['map_version']}  runs {r['runs']}  "
                     f"{state}{left}")
    lines += [f"  move: {m.get('text', m)}" for m in in_progress] or ["  no move in progress"]
    emit(settings, {
        "version": current.version, "home": current.home,
        "deployment": str(current.deployment) if current.deployment else None,
        "fingerprint": seeds.fingerprint, "required_schema": schema.version,
        "shards": rows, "moves": in_progress,
    }, "\n".join(lines))
    codes = [
        3 if not st.reachable else 4 if "map mismatch" in st.problem else 5
        for st in view.statuses if st.problem
    ]
    if codes:
        sys.exit(min(codes))  # unreachable outranks a mismatch, which outranks an old schema


def _row(status: ShardStatus, runs: int | None, current: ShardMap) -> dict[str, Any]:
    from shardq.shards.config import redact

    shard = status.shard
    return {
        "name": shard.name,
        "url": redact(shard.url),
        "ranges": [list(r) for r in shard.ranges],
        # One range, as before map versions; null for none or several.
        "buckets": list(shard.ranges[0]) if len(shard.ranges) == 1 else None,
        "in_map": current.get(shard.name) is not None,
        "reachable": status.reachable,
        "server_version": status.server_version,
        "schema_version": status.schema_version,
        "map_version": status.map_version,
        "runs": runs,
        "ok": status.problem is None,
        "problem": status.problem,
    }


@shards_group.command("add")
@click.argument("name")
@click.argument("url")
@json_option
@pass_settings
def add_command(settings: Settings, name: str, url: str) -> None:
    """Add the database at URL as shard NAME, owning no buckets yet.

    Migrates it, then writes a new map version (the same ranges, one more shard)
    to every shard. The URL must carry no password: it is stored in every shard;
    use a passfile or PGPASSWORD.
    """
    from shardq.shards.migrations import add_shard

    with errors_as_exit_codes():
        grown = add_shard(settings.shard_map(), name, url)
    _emit_change(settings, grown, f"added shard {name}", name)


@shards_group.command("remove")
@click.argument("name")
@json_option
@pass_settings
def remove_command(settings: Settings, name: str) -> None:
    """Remove shard NAME from the map (refused while it owns buckets, or is home)."""
    from shardq.shards.migrations import remove_shard

    with errors_as_exit_codes():
        shrunk = remove_shard(settings.shard_map(), name)
    _emit_change(settings, shrunk, f"removed shard {name}", name)


def _emit_change(settings: Settings, new: ShardMap, what: str, name: str) -> None:
    from shardq.shards.config import redact

    shards = [{"name": s.name, "url": redact(s.url), "ranges": [list(r) for r in s.ranges]}
              for s in new.shards]
    emit(settings, {"version": new.version, "shard": name, "home": new.home, "shards": shards},
         f"{what}: shard map version {new.version}, shards "
         f"{', '.join(s.name for s in new.shards)}")


moves.register(shards_group)

COMMANDS = [shards_group]
"""What this module adds to the `shardq` group (bin/cli/main.py)."""
