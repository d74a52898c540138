"""Apply `schema/` to every shard: the numbered migrations it lacks, then the function
files whose current body it lacks (shards/schema_files.py says what each kind holds).

Per shard: take a session advisory lock (two migrators racing serialize here, so
each file is applied once), create the bookkeeping tables, check or record the
shard's place in the map, then apply each missing file in its own transaction
together with its bookkeeping row: a file that fails half-way leaves nothing.
Once the migrations are applied, a shard that has no map version yet records
version 1 and its ownership of buckets (`_record_first_version`).

Every body a function ever had on a shard is recorded, so a migrator of an
older release finds its bodies already applied and never puts an old body back
over a newer one. That is also why a body must stay compatible with the callers
of the release before it (rolling deploys run both): a change of signature, of
the batch document, or of the answer gets a new function name
(`commit_turns_v2`), and a migration drops the old one once no process calls it
(docs/storage.md, "SQL functions and rolling deploys"). The migrator creates and
replaces functions and never drops one: a function whose file is deleted stays
until a migration drops it.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

from shardq.shards.check import applied_functions, compare_identity
from shardq.shards.config import Shard, ShardMap, without_password
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import MapMismatch, MigrationError, ShardUnavailable
from shardq.shards.routing import BUCKETS
from shardq.shards.schema_files import Function, Migration, Schema, load_schema
from shardq.shards.sqlfile import load_queries

log = logging.getLogger(__name__)

SQL = load_queries("shardq.shards", "queries.sql")

# Any constant works; this one spells "shardqmg" so it is recognisable in pg_locks.
MIGRATION_LOCK_KEY = int.from_bytes(b"shardqmg", "big") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class ShardMigration:
    """What `migrate` did to one shard."""

    shard: Shard
    applied: list[int] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    version: int = 0


@dataclass(frozen=True)
class _FirstVersion:
    """Version 1 of the deployment's map: found on `found_on` (a shard's label), or
    minted by this migrator when no shard had it yet (`found_on` empty)."""

    deployment: uuid.UUID
    layout: dict[str, Any]
    found_on: str = ""


def migrate(
    shard_map: ShardMap,
    *,
    shards: list[Shard] | None = None,
    schema: Schema | None = None,
) -> list[ShardMigration]:
    """Bring every shard (or `shards`) to the newest schema. Re-running is a no-op.

    Every shard: the configured ones (the seeds), and those a newer map version
    added (`shardq shards add`), learned from the newest version the seeds hold.
    """
    schema = load_schema() if schema is None else schema
    # Version 1 is read from the shards that have it before any is written, so a
    # shard migrated alone earlier (`--shard`) gives its deployment to the others
    # instead of being refused by one minted here.
    first, learned = _recorded_first_version(shard_map)
    results = []
    for shard in shards or [*shard_map.shards, *learned]:
        result, first = _migrate_shard(shard_map, shard, schema, first)
        results.append(result)
    return results


def _recorded_first_version(shard_map: ShardMap) -> tuple[_FirstVersion | None, list[Shard]]:
    """Version 1 as the reachable shards of the map record it (None when none does),
    and the shards a newer version holds that the map does not name.

    Raises MapMismatch naming a shard whose deployment differs from the first
    shard's that has one. Unreachable shards are passed over: migrating one
    reports it, and a migration of the others must not wait for it.
    """
    first = None
    newest: tuple[int, str] = (0, "")
    for shard in shard_map.shards:
        try:
            with connect(shard, autocommit=True) as conn:
                found = _read_first_version(conn, shard)
                state = conn.execute(SQL["read_map_state"]).fetchone() if found else None
        except ShardUnavailable:
            continue
        first = _agree(first, found, shard)
        if state is not None and state["version"] is not None:
            newest = max(newest, (int(state["version"]), str(state["layout"])))
    if newest[0] <= 1:
        return first, []
    current = ShardMap.from_layout(json.loads(newest[1]), newest[0], seeds=shard_map)
    return first, [s for s in current.shards if shard_map.get(s.name) is None]


def _read_first_version(conn: DictConnection, shard: Shard) -> _FirstVersion | None:
    present = conn.execute(SQL["has_map_versions"]).fetchone()
    if present is None or not present["present"]:
        return None
    row = conn.execute(SQL["read_first_version"]).fetchone()
    if row is None:
        return None
    return _FirstVersion(row["deployment"], json.loads(row["layout"]), shard.label)


def _agree(known: _FirstVersion | None, found: _FirstVersion | None, shard: Shard) -> (
    _FirstVersion | None
):
    if known is None or found is None:
        return known or found
    if found.deployment != known.deployment:
        raise MapMismatch(
            f"{shard.label}: shard map mismatch: it belongs to deployment {found.deployment}, "
            f"{known.found_on or 'the shards migrated before it'} to {known.deployment}"
        )
    return known


def _migrate_shard(
    shard_map: ShardMap, shard: Shard, schema: Schema, first: _FirstVersion | None
) -> tuple[ShardMigration, _FirstVersion | None]:
    result = ShardMigration(shard)
    with connect(shard, autocommit=True) as conn:
        conn.execute(SQL["take_migration_lock"], {"key": MIGRATION_LOCK_KEY})
        try:
            conn.execute(SQL["create_bookkeeping"])
            _check_or_record_identity(conn, shard_map, shard)
            done = {row["version"]: row for row in conn.execute(SQL["applied_migrations"])}
            for migration in schema.migrations:
                recorded = done.get(migration.version)
                if recorded is None:
                    _apply(conn, shard, migration)
                    result.applied.append(migration.version)
                elif not migration.matches(recorded["checksum"]):
                    raise MigrationError(
                        f"{shard.label}: migration {migration.label} was edited after it "
                        "was applied; add a new migration instead"
                    )
            result.version = max([*done, *result.applied], default=0)
            first = _record_first_version(conn, shard_map, shard, first)
            applied = applied_functions(conn)
            # A migration may drop a function whose answer changes; its file
            # then creates it anew even if that text was applied before.
            present = {r["name"] for r in conn.execute(SQL["existing_functions"])}
            for function in schema.functions:
                if (function.name, function.checksum) not in applied or (
                    function.name not in present
                ):
                    _apply(conn, shard, function)
                    result.functions.append(function.name)
        finally:
            if not conn.closed:
                conn.execute(SQL["release_migration_lock"], {"key": MIGRATION_LOCK_KEY})
    return result, first


def _apply(conn: DictConnection, shard: Shard, file: Migration | Function) -> None:
    """One schema file and its bookkeeping row, in one transaction."""
    record, params = file.bookkeeping
    try:
        with conn.transaction():
            if isinstance(file, Function):
                # Function files apply in name order, and one may call a
                # function of a file after it (deliver_signals calls
                # signal_refusal): bodies are checked when called, as pg_dump
                # restores them.
                conn.execute(SQL["defer_body_checks"])
            # No parameters: psycopg sends the file through the simple query
            # protocol, which runs several statements in one call.
            conn.execute(file.sql.encode())
            conn.execute(record, params)
    except psycopg.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrationError(f"{shard.label}: {file.label} failed, nothing of it applied: "
                             f"{first_line}") from exc
    log.info("applied schema file", extra={"shard": shard.name, "file": file.label})


def _record_first_version(
    conn: DictConnection, shard_map: ShardMap, shard: Shard, known: _FirstVersion | None
) -> _FirstVersion | None:
    """Record map version 1 and this shard's ownership, unless the shard has them.

    Called under the migration lock, after the identity check: the shard's
    recorded name and layout are the map's. Version 1 is the same document on
    every shard, the one `known` carries (read from another shard, or minted for
    the first shard that had none).
    """
    present = conn.execute(SQL["has_map_versions"]).fetchone()
    if present is None or not present["present"]:
        return known  # a schema folder from before migration 0014
    found = _read_first_version(conn, shard)
    if found is not None:
        return _agree(known, found, shard)
    identity = conn.execute(SQL["read_identity"]).fetchone()
    assert identity is not None  # recorded before the migrations ran
    first = known or _FirstVersion(uuid.uuid4(), _first_layout(identity, shard_map))
    with conn.transaction():
        conn.execute(SQL["record_map_version"], {"version": 1,
                                                 "layout": json.dumps(first.layout)})
        conn.execute(SQL["record_ownership"], {
            "deployment": first.deployment, "map_version": 1,
            "owned": _bits(first.layout, identity["shard_name"]),
        })
    log.info("recorded map version 1", extra={"shard": shard.name})
    return first if first.found_on else _FirstVersion(first.deployment, first.layout, shard.label)


def _first_layout(identity: dict[str, Any], shard_map: ShardMap) -> dict[str, Any]:
    """Version 1 from what the shard records of its map (names and ranges: a shard
    migrated before map versions has only that) and the URLs of `shard_map`."""
    recorded = sorted(json.loads(identity["layout"])["shards"], key=lambda s: s["buckets"][0])
    urls = {s.name: without_password(s.url) for s in shard_map.shards}
    return {
        "buckets": BUCKETS,
        "home": recorded[0]["name"],
        "shards": [{"name": s["name"], "url": urls[s["name"]]} for s in recorded],
        "ranges": [[*s["buckets"], s["name"]] for s in recorded],
    }


def _bits(layout: dict[str, Any], name: str) -> str:
    """The buckets `layout` gives shard `name`, as the text of a bit(4096), bucket 0 first."""
    owned = [False] * BUCKETS
    for first, last, owner in layout["ranges"]:
        if owner == name:
            owned[first:last + 1] = [True] * (last - first + 1)
    return "".join("1" if bit else "0" for bit in owned)


def _check_or_record_identity(conn: DictConnection, shard_map: ShardMap, shard: Shard) -> None:
    row = conn.execute(SQL["read_identity"]).fetchone()
    if row is None:
        conn.execute(
            SQL["record_identity"],
            {"shard_name": shard.name, "fingerprint": shard_map.fingerprint,
             "layout": shard_map.describe()},
        )
        return
    compare_identity(shard_map, shard, row)
