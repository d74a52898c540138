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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from shardq.shards.config import Shard, ShardMap, check_url, redact, without_password
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import (
    ConfigError,
    MapMismatch,
    MigrationError,
    MoveRunning,
    SchemaBehind,
    ShardqError,
    ShardUnavailable,
)
from shardq.shards.new_shard import check_new_database, drop_new_schema
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
            functions = _applied_functions(conn) if status["has_function_bookkeeping"] else set()
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
            _compare_identity(shard_map.seeds, shard, identity)
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
    _raise_problem(status)
    return status.map_version


def _raise_problem(status: ShardStatus) -> None:
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
        _raise_problem(status)
    _check_one_deployment(statuses)
    return statuses


def _check_one_deployment(statuses: list[ShardStatus]) -> None:
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


# -- following and changing the map ------------------------------------------------

# "shardqmv": the mover's lock on the home shard. Only its holder writes a new map
# version, so two changes at once can never mint two different version-N documents.
MOVER_LOCK_KEY = int.from_bytes(b"shardqmv", "big") & 0x7FFF_FFFF_FFFF_FFFF
MAX_SHARD_NAME = 63
"""Characters of a shard name: PostgreSQL's identifier length, so it fits wherever a
name is used (application_name, a pool's name, log fields)."""


def read_newer_map(conn: DictConnection, after: int) -> tuple[int, dict[str, Any], Any] | None:
    """(version, layout, deployment) of the newest map version newer than `after` that
    the connected shard holds, or None."""
    row = conn.execute(SQL["read_newer_map"], {"after": after}).fetchone()
    if row is None:
        return None
    return int(row["version"]), json.loads(row["layout"]), row["deployment"]


@dataclass(frozen=True)
class MapView:
    """The current map as the reachable seeds know it, and each of its shards' status
    (the seeds first, then the shards later versions added)."""

    map: ShardMap
    statuses: list[ShardStatus]

    def status(self, name: str) -> ShardStatus | None:
        return next((s for s in self.statuses if s.shard.name == name), None)


def read_map(seeds: ShardMap, *, schema: Schema | None = None) -> MapView:
    """Check every seed, take the newest version among them, and check the shards it
    adds. Problems are in the statuses, not raised (`shardq shards status` shows them)."""
    schema = load_schema() if schema is None else schema
    statuses = [check_shard(seeds, s, schema=schema) for s in seeds.shards]
    try:
        _check_one_deployment(statuses)
    except MapMismatch:
        current = seeds  # shown as the problem of the seed that differs
    else:
        from shardq.shards.follow import newest_map  # noqa: PLC0415 - follow is below pools

        current = newest_map(seeds, [s for s in statuses if s.reachable and not s.problem])
    by_name = {s.shard.name: s for s in statuses}
    ordered = []
    for shard in current.shards:
        known = by_name.pop(shard.name, None)
        ordered.append(known if known is not None and known.shard == shard
                       else check_shard(current, shard, schema=schema))
    return MapView(current, [*ordered, *by_name.values()])


def count_runs(shard: Shard) -> int | None:
    """How many runs `shard` holds; None when it cannot be read."""
    try:
        with connect(shard, autocommit=True) as conn:
            row = conn.execute(SQL["count_runs"]).fetchone()
    except (ShardUnavailable, psycopg.Error):
        return None
    return int(row["runs"]) if row is not None else None


def _ownership(shard: Shard) -> dict[str, Any] | None:
    with connect(shard, autocommit=True) as conn:
        return conn.execute(SQL["read_ownership"]).fetchone()


def check_shard_name(name: str) -> str:
    """A new shard's name: 1..63 printable characters, no spaces, valid UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"shard name {name!r} is not valid UTF-8") from None
    if not name:
        raise ConfigError("shard name is empty")
    if len(name) > MAX_SHARD_NAME:
        raise ConfigError(f"shard name is {len(name)} characters long; at most "
                          f"{MAX_SHARD_NAME} are allowed")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise ConfigError(f"shard name {name!r} has spaces or control characters")
    return name


def check_new_url(name: str, url: str) -> str:
    """A new shard's URL: PostgreSQL, names a database, carries no password."""
    check_url(url, name)
    params = conninfo_to_dict(url)
    if params.get("password") or params.get("sslpassword"):
        raise ConfigError(
            f"{name}: {redact(url)} carries a password: shard URLs are stored in every shard "
            "(shardq.shard_maps), so give the password through a passfile (~/.pgpass, "
            "PGPASSFILE) or PGPASSWORD instead")
    return url


@contextmanager
def _mover_lock(current: ShardMap) -> Iterator[None]:
    """The mover's lock on the home shard, held while a new version is written."""
    home = current.get(current.home)
    assert home is not None
    with connect(home, autocommit=True) as conn:
        row = conn.execute(SQL["try_mover_lock"], {"key": MOVER_LOCK_KEY}).fetchone()
        if row is None or not row["locked"]:
            raise MoveRunning(
                f"{home.label}: another map change or move holds the mover lock; try again "
                "when it is done (`shardq shards status`)")
        try:
            yield
        finally:
            if not conn.closed:
                conn.execute(SQL["release_mover_lock"], {"key": MOVER_LOCK_KEY})


def _require_all(view: MapView) -> None:
    """A new version is written to every shard: each must be reachable and agree."""
    for status in view.statuses:
        if not status.reachable:
            raise ShardUnavailable(f"{status.shard.label}: {status.problem}")
        _raise_problem(status)


def add_shard(seeds: ShardMap, name: str, url: str, *, allow_nonempty: bool = False
              ) -> ShardMap:
    """`shardq shards add`: migrate the database at `url` as shard `name`, owning no
    buckets, and write map version N+1 (the current ranges, one more shard) to every
    shard, the new one included. Returns version N+1.

    Refused (nothing written): a bad name or URL, a name or database the map has
    already (under any spelling of its host), a database that holds another
    deployment's shardq schema or a shardq schema no deployment recorded, a database
    holding anything else unless `allow_nonempty`, a server that cannot be reached or
    is older than 15. A migration that fails on a database that had no shardq schema
    drops what it created.
    """
    check_shard_name(name)
    check_new_url(name, url)
    _require_all(read_map(seeds))
    with _mover_lock(read_map(seeds).map):
        view = read_map(seeds)  # under the lock: no other change slips in between
        _require_all(view)
        current = view.map
        completed = _complete_newest(view)
        existing = current.get(name)
        if existing is not None and completed and (
                without_password(existing.url) == without_password(url)):
            return current  # this add had stopped part-way: its version is everywhere now
        if existing is not None:
            raise ConfigError(f"shard {name} exists already (map version {current.version})")
        new = Shard(len(current.shards), name, url, (), current.pool_min, current.pool_max)
        layout = current.layout()
        layout["shards"].append({"name": name, "url": without_password(url)})
        grown = ShardMap.from_layout(layout, current.version + 1, seeds=seeds,
                                     deployment=current.deployment)  # duplicate URLs refused
        fresh = check_new_database(current, new, allow_nonempty=allow_nonempty)
        try:
            migrate(seeds, shards=[new])
        except ShardqError as exc:
            if not fresh:
                raise
            drop_new_schema(new)
            if isinstance(exc, MigrationError):
                raise MigrationError(f"{exc}; {new.label} was left as it was found (no "
                                     "shardq schema)") from exc
            raise
        _write_version(grown, [*current.shards, new])
    log.info("shard added", extra={"shard": name, "map_version": grown.version})
    return grown


def remove_shard(seeds: ShardMap, name: str) -> ShardMap:
    """`shardq shards remove`: write map version N+1 without shard `name` to every shard.

    Refused while it owns buckets (in the map, or by its own ownership row), while it
    holds rows a move has not cleaned up, when it is the home shard, or unknown.
    """
    with _mover_lock(read_map(seeds).map):
        view = read_map(seeds)
        current = view.map
        completed = _complete_newest(view)
        shard = current.get(name)
        if shard is None and completed:
            return current  # this remove had stopped part-way: its version is everywhere now
        if shard is None:
            raise ConfigError(f"unknown shard {name!r}: map version {current.version} has "
                              f"{', '.join(s.name for s in current.shards)}")
        if name == current.home:
            raise ConfigError(f"shard {name} is the home shard (it holds the move journal); "
                              "it cannot be removed")
        if shard.ranges:
            owned = ", ".join(f"{a}-{b}" for a, b in shard.ranges)
            raise ConfigError(f"shard {name} owns buckets {owned}: move them to other shards "
                              "first (`shardq shards move`)")
        _require_all(view)
        ownership = _ownership(shard)
        if ownership is not None and (ownership["owned"] or ownership["unclean"]):
            raise ConfigError(f"shard {name} still owns {ownership['owned']} bucket(s) or holds "
                              "rows a move has not cleaned up; finish the move first")
        layout = current.layout()
        layout["shards"] = [s for s in layout["shards"] if s["name"] != name]
        shrunk = ShardMap.from_layout(layout, current.version + 1, seeds=seeds,
                                      deployment=current.deployment)
        # The removed shard learns it too: a process still asking it finds the version.
        _write_version(shrunk, list(current.shards))
    log.info("shard removed", extra={"shard": name, "map_version": shrunk.version})
    return shrunk


def _complete_newest(view: MapView) -> bool:
    """Write the newest version to the reachable shards that lack it; True if any did.

    A map change writes its version shard by shard: one that stopped part-way (killed,
    a shard lost in between) leaves some shards a version behind, and the next change,
    or the same command run again, finishes it first."""
    newest = view.map.version
    document = next((s.layout for s in view.statuses
                     if s.map_version == newest and s.layout is not None), None)
    lagging = [s.shard for s in view.statuses
               if s.reachable and s.map_version is not None and s.map_version < newest]
    if document is None or not lagging:
        return False
    layout = json.dumps(document)
    for shard in lagging:
        with connect(shard, autocommit=True) as conn, conn.transaction():
            conn.execute(SQL["record_map_version_once"], {"version": newest, "layout": layout})
            conn.execute(SQL["take_version"], {"version": newest})
    log.warning("finished writing a map version a change left part-way", extra={
        "map_version": newest, "shards": ",".join(s.name for s in lagging)})
    return True


def _write_version(new: ShardMap, shards: list[Shard]) -> None:
    """Record `new` on each shard, with its ownership row's version, one transaction each."""
    layout = json.dumps(new.layout())
    for shard in shards:
        with connect(shard, autocommit=True) as conn, conn.transaction():
            conn.execute(SQL["record_map_version_once"], {"version": new.version,
                                                          "layout": layout})
            conn.execute(SQL["take_version"], {"version": new.version})
