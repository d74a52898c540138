"""Check shards before use: reachable, migrated to this code's schema, and agreeing
with the process's shard map (check_shard says when a map agrees).

Every process checks the shards it uses: verify_shards at its start, verify_shard
when its pools first reach one. Nothing here writes to a shard, so a client or a
worker that checks never loads the migrator (shards/migrations.py), which uses
these comparisons too.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from shardq.shards.config import Shard, ShardMap
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import MapMismatch, SchemaBehind, ShardUnavailable
from shardq.shards.schema_files import Schema, load_schema
from shardq.shards.sqlfile import load_queries

SQL = load_queries("shardq.shards", "queries.sql")


@dataclass(frozen=True)
class ShardStatus:
    """What `check_shard` found on one shard; `problem` is None when it is ready.

    `map_version` and `layout`: the newest map version the shard holds (None on a
    shard migrated before map versions), `deployment` the one it belongs to.
    """

    shard: Shard
    reachable: bool
    server_version: str | None
    schema_version: int | None
    problem: str | None
    map_version: int | None = None
    layout: dict[str, Any] | None = None
    deployment: uuid.UUID | None = None


def applied_functions(conn: DictConnection) -> set[tuple[str, str]]:
    """(name, checksum) of every function body the connected shard recorded applying."""
    return {(r["name"], r["checksum"]) for r in conn.execute(SQL["applied_functions"])}


def compare_identity(shard_map: ShardMap, shard: Shard, row: dict[str, Any]) -> None:
    """Raise MapMismatch, saying what differs, unless the identity `row` a shard recorded
    at its first migration is `shard` of `shard_map`."""
    if row["fingerprint"] == shard_map.fingerprint and row["shard_name"] == shard.name:
        return
    recorded = json.loads(row["layout"])
    theirs = {s["name"]: s["buckets"] for s in recorded["shards"]}
    mine = {s.name: [s.first_bucket, s.last_bucket] for s in shard_map.shards}
    if row["shard_name"] != shard.name:
        difference = f"it was recorded as {row['shard_name']}, this map calls it {shard.name}"
    elif len(theirs) != len(mine):
        difference = f"it was migrated with a {len(theirs)}-shard map, this one has {len(mine)}"
    else:
        changed = [
            f"{name} {theirs.get(name)} -> {buckets}"
            for name, buckets in mine.items() if theirs.get(name) != buckets
        ]
        difference = "bucket ranges differ: " + "; ".join(changed)
    if row["fingerprint"] != shard_map.fingerprint:
        difference += f" (recorded map {row['fingerprint']}, this map {shard_map.fingerprint})"
    raise MapMismatch(f"{shard.label}: shard map mismatch: {difference}")


def check_shard(shard_map: ShardMap, shard: Shard, *, schema: Schema | None = None) -> ShardStatus:
    """Reachability, server and schema version, and map agreement of one shard.

    The map agrees when the shard's version 1 is the one this process's
    configuration describes (the recorded fingerprint, as before map versions),
    it belongs to the deployment of the map (once the process knows it), and its
    copy of this process's version, if it has it, has the same ranges. A shard
    holding a newer version agrees: the process follows it (`map_version`).
    """
    schema = load_schema() if schema is None else schema
    map_state: dict[str, Any] | None = None
    mine: dict[str, Any] | None = None
    try:
        with connect(shard, autocommit=True) as conn:
            status = conn.execute(SQL["shard_status"]).fetchone()
            assert status is not None
            server = str(status["server_version"])
            if not status["has_bookkeeping"]:
                return ShardStatus(shard, True, server, 0, "not migrated: run `shardq migrate`")
            version = conn.execute(SQL["schema_version"]).fetchone()
            assert version is not None
            schema_version = int(version["version"])
            identity = conn.execute(SQL["read_identity"]).fetchone()
            functions = applied_functions(conn) if status["has_function_bookkeeping"] else set()
            present = conn.execute(SQL["has_map_versions"]).fetchone()
            if present is not None and present["present"]:
                map_state = conn.execute(SQL["read_map_state"]).fetchone()
                if shard_map.version > 1:
                    mine = conn.execute(SQL["read_map_version"],
                                        {"version": shard_map.version}).fetchone()
    except ShardUnavailable as exc:
        return ShardStatus(shard, False, None, None, str(exc).removeprefix(shard.label + ": "))
    problem = None
    if identity is not None:
        try:
            compare_identity(shard_map.seeds, shard, identity)
        except MapMismatch as exc:
            problem = str(exc).removeprefix(shard.label + ": ")
    newest: int | None = None
    layout: dict[str, Any] | None = None
    deployment: uuid.UUID | None = None
    if map_state is not None:
        deployment = map_state["deployment"]
        if map_state["version"] is not None:
            newest, layout = int(map_state["version"]), json.loads(map_state["layout"])
        if problem is None:
            problem = _compare_versions(shard_map, deployment, mine)
    if problem is None and schema_version < schema.version:
        problem = f"schema behind: version {schema_version}, this code needs {schema.version}"
    stale = [f.label for f in schema.functions if (f.name, f.checksum) not in functions]
    if problem is None and stale:
        problem = f"schema behind: {', '.join(stale)} not applied (run `shardq migrate`)"
    return ShardStatus(shard, True, server, schema_version, problem, newest, layout, deployment)


def _compare_versions(
    shard_map: ShardMap, deployment: uuid.UUID | None, mine: dict[str, Any] | None
) -> str | None:
    """Why a shard's map versions disagree with `shard_map`, or None when they agree."""
    if (shard_map.deployment is not None and deployment is not None
            and deployment != shard_map.deployment):
        return (f"shard map mismatch: it belongs to deployment {deployment}, this process's "
                f"shards to {shard_map.deployment}")
    if mine is None:
        return None  # the process's version is not on this shard yet (written best effort)
    theirs = json.loads(mine["layout"])
    ours = shard_map.layout()
    if (theirs.get("ranges"), theirs.get("home")) != (ours["ranges"], ours["home"]):
        return (f"shard map mismatch: its map version {shard_map.version} has other ranges "
                "than the one this process holds")
    return None


def verify_shard(shard_map: ShardMap, shard: Shard) -> int | None:
    """Raise unless `shard` is reachable, agrees with `shard_map` and has this code's
    schema; return the newest map version it holds (None before map versions).

    ShardUnavailable when it cannot be reached; MapMismatch or SchemaBehind when
    it can, and disagrees (the check every pool makes on first reaching a shard).
    """
    status = check_shard(shard_map, shard)
    if not status.reachable:
        raise ShardUnavailable(f"{shard.label}: {status.problem}")
    raise_problem(status)
    return status.map_version


def raise_problem(status: ShardStatus) -> None:
    """Raise the problem a reachable shard has: MapMismatch, or SchemaBehind."""
    if status.reachable and status.problem:
        error = MapMismatch if "map mismatch" in status.problem else SchemaBehind
        raise error(f"{status.shard.label}: {status.problem}")


def verify_shards(shard_map: ShardMap, shards: list[Shard] | None = None) -> list[ShardStatus]:
    """Check shards before a process uses them; raise on a map mismatch or an old schema.

    Unreachable shards are returned, not raised: a daemon serves the shards it can
    reach and picks the others up when they come back. The statuses carry the
    newest map version each shard holds: hand them to ShardPools (`verified`) and
    it starts from the newest among them.
    """
    schema = load_schema()
    statuses = [check_shard(shard_map, s, schema=schema) for s in shards or shard_map.shards]
    for status in statuses:
        raise_problem(status)
    check_one_deployment(statuses)
    return statuses


def check_one_deployment(statuses: list[ShardStatus]) -> None:
    """Seeds of two deployments (same names and ranges, another `migrate`) are refused."""
    first: ShardStatus | None = None
    for status in statuses:
        if status.deployment is None:
            continue
        if first is None:
            first = status
        elif status.deployment != first.deployment:
            raise MapMismatch(
                f"{status.shard.label}: shard map mismatch: it belongs to deployment "
                f"{status.deployment}, {first.shard.label} to {first.deployment}")
