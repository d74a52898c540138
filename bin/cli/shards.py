"""`shardq shards`: the shard map's commands.

`shards` alone, or `shards status`: the map version, each shard's ranges,
reachability, schema version and runs (of the buckets it owns), and what moves
left to do: the unfinished move, buckets frozen now, copies not yet cleaned up,
and the command to run (moves/status.py). `shards add`
and `shards remove` write a new map version with one shard more or less (owning
no buckets). The move commands (`move`, `rebalance`) are bin/cli/moves.py's,
registered into this group.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from shardq.bin.cli import moves
from shardq.bin.cli.common import Settings, emit, errors_as_exit_codes, json_option, pass_settings

if TYPE_CHECKING:
    from shardq.shards.check import ShardStatus
    from shardq.shards.config import ShardMap


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
    """Show the map version, each shard's ranges, reachability, schema version and runs
    (of the buckets it owns), and what moves left to do, with the command to run."""
    from shardq.moves.status import move_status
    from shardq.shards.fanout import each_shard
    from shardq.shards.schema_files import load_schema
    from shardq.shards.versions import count_runs, read_map

    with errors_as_exit_codes():
        seeds = settings.shard_map()
        schema = load_schema()
        view = read_map(seeds, schema=schema)
        current = view.map
        reachable = [s.shard for s in view.statuses if s.reachable]
        runs = each_shard(reachable, count_runs).answers
        moves = move_status(current, {s.name for s in reachable})
    rows = [_row(st, runs.get(st.shard), current) for st in view.statuses]
    lines = [f"shard map version {current.version}, home {current.home}, "
             f"schema version needed {schema.version}"]
    for r in rows:
        ranges = ", ".join(f"{a}-{b}" for a, b in r["ranges"]) or "no buckets"
        left = "" if r["in_map"] else " (not in the map)"
        if not r["reachable"]:
            # Nothing was read from it: no columns of values it did not give.
            lines.append(f"  {r['name']:<10} {ranges:<11} {r['url']}  {r['problem']}{left}")
            continue
        state = "ok" if r["ok"] else r["problem"]
        counted = "unknown" if r["runs"] is None else r["runs"]
        lines.append(f"  {r['name']:<10} {ranges:<11} {r['url']}  schema "
                     f"{r['schema_version']}  map {_or_none(r['map_version'])}  runs {counted}  "
                     f"{state}{left}")
    lines += ["  " + line.replace("\n", "\n  ") for line in moves["lines"]]
    emit(settings, {
        "version": current.version, "home": current.home,
        "deployment": str(current.deployment) if current.deployment else None,
        "fingerprint": seeds.fingerprint, "required_schema": schema.version,
        "shards": rows, "moves": moves["moves"], "moves_problem": moves["problem"],
        "frozen": moves["frozen"], "cleanups": moves["cleanups"],
    }, "\n".join(lines))
    codes = [
        3 if not st.reachable else 4 if "map mismatch" in st.problem else 5
        for st in view.statuses if st.problem
    ]
    if codes:
        sys.exit(min(codes))  # unreachable outranks a mismatch, which outranks an old schema


def _or_none(value: object) -> object:
    return "none" if value is None else value


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
@click.option("--allow-nonempty", is_flag=True,
              help="Add a database that holds other schemas or tables (shardq's own schema "
                   "goes beside them); without it only an empty database is taken.")
@json_option
@pass_settings
def add_command(settings: Settings, name: str, url: str, allow_nonempty: bool) -> None:
    """Add the empty database at URL as shard NAME, owning no buckets yet.

    Migrates it, then writes a new map version (the same ranges, one more shard)
    to every shard. The URL must carry no password: it is stored in every shard;
    use a passfile or PGPASSWORD. Refused, leaving the database as it was: a
    database holding anything but an empty public schema (unless --allow-nonempty),
    or a shardq schema this deployment did not make.
    """
    from shardq.shards.versions import add_shard

    with errors_as_exit_codes():
        grown = add_shard(settings.shard_map(), name, url, allow_nonempty=allow_nonempty)
    _emit_change(settings, grown, f"added shard {name}", name)


@shards_group.command("remove")
@click.argument("name")
@json_option
@pass_settings
def remove_command(settings: Settings, name: str) -> None:
    """Remove shard NAME from the map (refused while it owns buckets, or is home)."""
    from shardq.shards.versions import remove_shard

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
