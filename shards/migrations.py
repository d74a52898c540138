"""Apply the numbered files of `schema/` to every shard, and check shards before use.

Per shard: take a session advisory lock (two migrators racing serialize here, so
each file is applied once), create the bookkeeping tables, check or record the
shard's place in the map, then apply each missing file in its own transaction
together with its bookkeeping row: a file that fails half-way leaves nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import psycopg

from shardq.shards.config import Shard, ShardMap
from shardq.shards.errors import MapMismatch, MigrationError, SchemaBehind, ShardUnavailable
from shardq.shards.pools import DictConnection, connect
from shardq.shards.sqlfile import load_queries

log = logging.getLogger(__name__)

SQL = load_queries("shardq.shards", "queries.sql")
# Any constant works; this one spells "shardqmg" so it is recognisable in pg_locks.
MIGRATION_LOCK_KEY = int.from_bytes(b"shardqmg", "big") & 0x7FFF_FFFF_FFFF_FFFF
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass
class ShardMigration:
    """What `migrate` did to one shard."""

    shard: Shard
    applied: list[int] = field(default_factory=list)
    version: int = 0


@dataclass(frozen=True)
class ShardStatus:
    """What `check_shard` found on one shard; `problem` is None when it is ready."""

    shard: Shard
    reachable: bool
    server_version: str | None
    schema_version: int | None
    problem: str | None


def load_migrations(directory: Path | Traversable | None = None) -> list[Migration]:
    """The numbered migration files, in order; a malformed name or a gap is an error."""
    folder = directory if directory is not None else resources.files("shardq.schema")
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE.match(entry.name)
        if not match:
            raise MigrationError(f"{entry.name}: migration files are named NNNN_lower_words.sql")
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(f"migration {expected:04d} is missing before {migration.name}")
    return found


def latest_version(migrations: list[Migration] | None = None) -> int:
    migrations = load_migrations() if migrations is None else migrations
    return migrations[-1].version if migrations else 0


def migrate(
    shard_map: ShardMap,
    *,
    shards: list[Shard] | None = None,
    migrations: list[Migration] | None = None,
) -> list[ShardMigration]:
    """Bring every shard (or `shards`) to the newest schema. Re-running is a no-op."""
    migrations = load_migrations() if migrations is None else migrations
    return [_migrate_shard(shard_map, s, migrations) for s in shards or shard_map.shards]


def _migrate_shard(
    shard_map: ShardMap, shard: Shard, migrations: list[Migration]
) -> ShardMigration:
    result = ShardMigration(shard)
    with connect(shard, autocommit=True) as conn:
        conn.execute(SQL["take_migration_lock"], {"key": MIGRATION_LOCK_KEY})
        try:
            conn.execute(SQL["create_bookkeeping"])
            _check_or_record_identity(conn, shard_map, shard)
            done = {row["version"]: row for row in conn.execute(SQL["applied_migrations"])}
            for migration in migrations:
                recorded = done.get(migration.version)
                if recorded is None:
                    _apply(conn, shard, migration)
                    result.applied.append(migration.version)
                elif recorded["checksum"] != migration.checksum:
                    raise MigrationError(
                        f"{shard.label}: migration {migration.version:04d}_{migration.name} "
                        "was edited after it was applied; add a new migration instead"
                    )
            result.version = max([*done, *result.applied], default=0)
        finally:
            if not conn.closed:
                conn.execute(SQL["release_migration_lock"], {"key": MIGRATION_LOCK_KEY})
    return result


def _apply(conn: DictConnection, shard: Shard, migration: Migration) -> None:
    label = f"{migration.version:04d}_{migration.name}.sql"
    try:
        with conn.transaction():
            # No parameters: psycopg sends the file through the simple query
            # protocol, which runs several statements in one call.
            conn.execute(migration.sql.encode())
            conn.execute(
                SQL["record_migration"],
                {"version": migration.version, "name": migration.name,
                 "checksum": migration.checksum},
            )
    except psycopg.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MigrationError(f"{shard.label}: {label} failed, nothing of it applied: "
                             f"{first_line}") from exc
    log.info("applied migration", extra={"shard": shard.name, "migration": label})


def _check_or_record_identity(conn: DictConnection, shard_map: ShardMap, shard: Shard) -> None:
    row = conn.execute(SQL["read_identity"]).fetchone()
    if row is None:
        conn.execute(
            SQL["record_identity"],
            {"shard_name": shard.name, "fingerprint": shard_map.fingerprint,
             "layout": shard_map.describe()},
        )
        return
    _compare_identity(shard_map, shard, row)


def _compare_identity(shard_map: ShardMap, shard: Shard, row: dict[str, Any]) -> None:
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


def check_shard(shard_map: ShardMap, shard: Shard, *, required: int | None = None) -> ShardStatus:
    """Reachability, server and schema version, and map agreement of one shard."""
    required = latest_version() if required is None else required
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
    except ShardUnavailable as exc:
        return ShardStatus(shard, False, None, None, str(exc).removeprefix(shard.label + ": "))
    problem = None
    if identity is not None:
        try:
            _compare_identity(shard_map, shard, identity)
        except MapMismatch as exc:
            problem = str(exc).removeprefix(shard.label + ": ")
    if problem is None and schema_version < required:
        problem = f"schema behind: version {schema_version}, this code needs {required}"
    return ShardStatus(shard, True, server, schema_version, problem)


def verify_shards(shard_map: ShardMap, shards: list[Shard] | None = None) -> list[ShardStatus]:
    """Check shards before a process uses them; raise on a map mismatch or an old schema.

    Unreachable shards are returned, not raised: a daemon serves the shards it can
    reach and picks the others up when they come back.
    """
    statuses = [check_shard(shard_map, s) for s in shards or shard_map.shards]
    for status in statuses:
        if status.reachable and status.problem:
            error = MapMismatch if "map mismatch" in status.problem else SchemaBehind
            raise error(f"{status.shard.label}: {status.problem}")
    return statuses
