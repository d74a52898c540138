"""Apply `schema/` to every shard, and check shards before use.

`schema/` holds two kinds of files. Numbered migrations (`NNNN_words.sql`)
shape tables and indexes: each is applied once, in order, and never edited
after it shipped. Function files (`functions/NAME.sql`, one `CREATE OR
REPLACE` each) hold the current body of one SQL function: a function is
re-applied whenever its file changes, so a change to it is a diff of one file,
not a new copy in a new migration. Migrations come first, then functions.

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

import hashlib
import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import psycopg

from shardq.shards.config import Shard, ShardMap, without_password
from shardq.shards.errors import MapMismatch, MigrationError, SchemaBehind, ShardUnavailable
from shardq.shards.pools import DictConnection, connect
from shardq.shards.routing import BUCKETS
from shardq.shards.sqlfile import load_queries

log = logging.getLogger(__name__)

SQL = load_queries("shardq.shards", "queries.sql")
# Any constant works; this one spells "shardqmg" so it is recognisable in pg_locks.
MIGRATION_LOCK_KEY = int.from_bytes(b"shardqmg", "big") & 0x7FFF_FFFF_FFFF_FFFF
CURRENT_SCHEMA_FILE = "current.sql"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_FUNCTION_FILE = re.compile(r"^([a-z][a-z0-9_]*)\.sql$")
# A migration may name the checksums of texts it replaces (`-- replaces
# checksum: ...`): a shard that applied one of those has applied it.
_REPLACES = re.compile(r"^-- replaces checksum: ([0-9a-f]{64})$", re.MULTILINE)


@dataclass(frozen=True)
class _SchemaFile:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Migration(_SchemaFile):
    """A numbered migration (`NNNN_name.sql`): applied once, never edited after."""

    version: int

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"

    @property
    def bookkeeping(self) -> tuple[str, dict[str, Any]]:
        return SQL["record_migration"], {"version": self.version, "name": self.name,
                                         "checksum": self.checksum}

    def matches(self, recorded_checksum: str) -> bool:
        return recorded_checksum == self.checksum or recorded_checksum in _REPLACES.findall(
            self.sql
        )


@dataclass(frozen=True)
class Function(_SchemaFile):
    """The current body of one SQL function (`functions/NAME.sql`)."""

    @property
    def label(self) -> str:
        return f"functions/{self.name}.sql"

    @property
    def bookkeeping(self) -> tuple[str, dict[str, Any]]:
        return SQL["record_function"], {"name": self.name, "checksum": self.checksum}


@dataclass(frozen=True)
class Schema:
    migrations: list[Migration]
    functions: list[Function]

    @property
    def version(self) -> int:
        return self.migrations[-1].version if self.migrations else 0


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


@dataclass(frozen=True)
class ShardStatus:
    """What `check_shard` found on one shard; `problem` is None when it is ready."""

    shard: Shard
    reachable: bool
    server_version: str | None
    schema_version: int | None
    problem: str | None


def load_schema(directory: Path | Traversable | None = None) -> Schema:
    """The numbered migrations, in order, and the function files of a schema folder.

    A malformed file name or a gap in the numbering is an error.
    """
    folder = directory if directory is not None else resources.files("shardq.schema")
    migrations = []
    for entry in folder.iterdir():
        # current.sql is the generated picture of the whole schema, not a migration.
        if not entry.name.endswith(".sql") or entry.name == CURRENT_SCHEMA_FILE:
            continue
        match = _FILE.match(entry.name)
        if not match:
            raise MigrationError(f"{entry.name}: migration files are named NNNN_lower_words.sql")
        migrations.append(Migration(
            name=match[2], sql=entry.read_text(encoding="utf-8"), version=int(match[1])
        ))
    migrations.sort(key=lambda m: m.version)
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise MigrationError(f"migration {expected:04d} is missing before {migration.label}")
    functions = []
    function_folder = folder.joinpath("functions")
    if function_folder.is_dir():
        for entry in function_folder.iterdir():
            if not entry.name.endswith(".sql"):
                continue
            match = _FUNCTION_FILE.match(entry.name)
            if not match:
                raise MigrationError(f"functions/{entry.name}: function files are named "
                                     "lower_words.sql")
            functions.append(Function(name=match[1], sql=entry.read_text(encoding="utf-8")))
    functions.sort(key=lambda f: f.name)
    return Schema(migrations, functions)


def migrate(
    shard_map: ShardMap,
    *,
    shards: list[Shard] | None = None,
    schema: Schema | None = None,
) -> list[ShardMigration]:
    """Bring every shard (or `shards`) to the newest schema. Re-running is a no-op."""
    schema = load_schema() if schema is None else schema
    # Version 1 is read from the shards that have it before any is written, so a
    # shard migrated alone earlier (`--shard`) gives its deployment to the others
    # instead of being refused by one minted here.
    first = _recorded_first_version(shard_map)
    results = []
    for shard in shards or shard_map.shards:
        result, first = _migrate_shard(shard_map, shard, schema, first)
        results.append(result)
    return results


def _recorded_first_version(shard_map: ShardMap) -> _FirstVersion | None:
    """Version 1 as the reachable shards of the map record it; None when none does.

    Raises MapMismatch naming a shard whose deployment differs from the first
    shard's that has one. Unreachable shards are passed over: migrating one
    reports it, and a migration of the others must not wait for it.
    """
    first = None
    for shard in shard_map.shards:
        try:
            with connect(shard, autocommit=True) as conn:
                found = _read_first_version(conn, shard)
        except ShardUnavailable:
            continue
        first = _agree(first, found, shard)
    return first


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
            applied = _applied_functions(conn)
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


def _applied_functions(conn: DictConnection) -> set[tuple[str, str]]:
    return {(r["name"], r["checksum"]) for r in conn.execute(SQL["applied_functions"])}


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


def check_shard(shard_map: ShardMap, shard: Shard, *, schema: Schema | None = None) -> ShardStatus:
    """Reachability, server and schema version, and map agreement of one shard."""
    schema = load_schema() if schema is None else schema
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
            functions = _applied_functions(conn) if status["has_function_bookkeeping"] else set()
    except ShardUnavailable as exc:
        return ShardStatus(shard, False, None, None, str(exc).removeprefix(shard.label + ": "))
    problem = None
    if identity is not None:
        try:
            _compare_identity(shard_map, shard, identity)
        except MapMismatch as exc:
            problem = str(exc).removeprefix(shard.label + ": ")
    if problem is None and schema_version < schema.version:
        problem = f"schema behind: version {schema_version}, this code needs {schema.version}"
    stale = [f.label for f in schema.functions if (f.name, f.checksum) not in functions]
    if problem is None and stale:
        problem = f"schema behind: {', '.join(stale)} not applied (run `shardq migrate`)"
    return ShardStatus(shard, True, server, schema_version, problem)


def verify_shard(shard_map: ShardMap, shard: Shard) -> None:
    """Raise unless `shard` is reachable, holds `shard_map` and this code's schema.

    ShardUnavailable when it cannot be reached; MapMismatch or SchemaBehind when
    it can, and disagrees (the check every pool makes on first reaching a shard).
    """
    status = check_shard(shard_map, shard)
    if not status.reachable:
        raise ShardUnavailable(f"{shard.label}: {status.problem}")
    _raise_problem(status)


def _raise_problem(status: ShardStatus) -> None:
    if status.reachable and status.problem:
        error = MapMismatch if "map mismatch" in status.problem else SchemaBehind
        raise error(f"{status.shard.label}: {status.problem}")


def verify_shards(shard_map: ShardMap, shards: list[Shard] | None = None) -> list[ShardStatus]:
    """Check shards before a process uses them; raise on a map mismatch or an old schema.

    Unreachable shards are returned, not raised: a daemon serves the shards it can
    reach and picks the others up when they come back.
    """
    schema = load_schema()
    statuses = [check_shard(shard_map, s, schema=schema) for s in shards or shard_map.shards]
    for status in statuses:
        _raise_problem(status)
    return statuses
