"""Whether a database may become a new shard (`shardq shards add`), checked before
anything is written to it, and undoing a migration of it that failed.

A shard's tables are migrated, vacuumed and deleted from as shardq's own, so a new
shard is an empty database (or one that holds only shardq's schema of this
deployment, from an add that stopped part-way), unless the operator says otherwise.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any

import psycopg

from shardq.shards.config import Shard, ShardMap
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import ConfigError, MapMismatch, ShardqError
from shardq.shards.sqlfile import load_queries

log = logging.getLogger(__name__)

SQL = load_queries("shardq.shards", "queries.sql")
MIN_SERVER_VERSION = 150000


def check_new_database(current: ShardMap, new: Shard, *, allow_nonempty: bool) -> bool:
    """Raise unless `new` may become a shard of `current`; True when it has no shardq
    schema yet (a failed migration may then drop the one it made)."""
    server = _server_of(new)
    siblings = set()  # schemas of shards in the same database (shards/layout.py)
    for shard in current.shards:
        where = _server_of(shard)
        if where == server:
            raise ConfigError(f"{new.label} is the database and schema of shard "
                              f"{shard.label} under another spelling")
        if where[:2] == server[:2]:
            siblings.add(shard.schema)
    with connect(new, autocommit=True) as conn:
        version = conn.execute(SQL["server_version_num"]).fetchone()
        assert version is not None
        if int(version["num"]) < MIN_SERVER_VERSION:
            raise ConfigError(f"{new.label}: PostgreSQL {version['text']} is too old; shardq "
                              "needs 15 or newer")
        contents = list(conn.execute(SQL["database_contents"]))
        ours = recorded = None
        if any(c["schema"] == new.schema for c in contents):
            # Half a schema, or one shardq did not make, fails to read: refused below.
            with suppress(psycopg.Error):
                ours, recorded = _recorded(conn)
    if ours is not None and ours["deployment"] != current.deployment:
        raise MapMismatch(f"{new.label}: the database holds the shardq schema of deployment "
                          f"{ours['deployment']}, not this one's ({current.deployment})")
    if recorded is not None and (recorded["shard_name"] != new.name or
                                 recorded["fingerprint"] != current.seeds.fingerprint):
        raise MapMismatch(f"{new.label}: the database holds another deployment's shardq "
                          f"schema (recorded as {recorded['shard_name']})")
    _check_contents(new, [c for c in contents if c["schema"] not in siblings],
                    ours=ours is not None or recorded is not None, allow_nonempty=allow_nonempty)
    return not any(c["schema"] == new.schema for c in contents)


def _recorded(conn: DictConnection) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The deployment's map state and version-1 identity a shardq schema records."""
    with conn.transaction():
        present = conn.execute(SQL["has_map_versions"]).fetchone()
        ours = (conn.execute(SQL["read_map_state"]).fetchone()
                if present is not None and present["present"] else None)
        identity = conn.execute(SQL["shard_status"]).fetchone()
        recorded = (conn.execute(SQL["read_identity"]).fetchone()
                    if identity is not None and identity["has_bookkeeping"] else None)
    return ours, recorded


def _check_contents(new: Shard, contents: list[dict[str, Any]], *, ours: bool,
                    allow_nonempty: bool) -> None:
    """Refuse a database holding what shardq did not put there: a shard's tables are
    migrated, renamed, vacuumed and deleted from as shardq's, and a schema of the
    shard's name it did not make would be migrated over half-way. The schemas of
    other shards in the same database are not in `contents`."""
    def what(c: dict[str, Any]) -> str:
        counted = [f"{c[k]} {k[:-1]}(s)" for k in ("relations", "functions", "types") if c[k]]
        tables = f", tables {c['some_tables']}" if c["some_tables"] else ""
        return f"schema {c['schema']} ({', '.join(counted) or 'empty'}{tables})"

    for c in contents:
        if c["schema"] == new.schema and not ours:
            raise ConfigError(f"{new.label}: the database holds a {what(c)} that no shardq "
                              "deployment recorded: drop it, or give another database")
    held = [c for c in contents if c["schema"] != new.schema and (
        c["schema"] != "public" or c["relations"] or c["functions"] or c["types"])]
    if held and not allow_nonempty:
        raise ConfigError(f"{new.label}: the database is not empty ({'; '.join(map(what, held))}):"
                          " give an empty database, or --allow-nonempty to add shardq's "
                          "schema beside what it holds")


def copy_settings(source: Shard, target: Shard) -> None:
    """Give the new shard `target` the operator's settings `source` holds, which every
    shard holds alike: tenants' weights (schema/0021) and workflows' current builds
    (schema/0026)."""
    with connect(source, autocommit=True) as conn:
        weights = conn.execute(SQL["read_tenant_weights"]).fetchall()
        builds = conn.execute(SQL["read_workflow_builds"]).fetchall()
    if weights or builds:
        with connect(target) as conn, conn.transaction():
            conn.execute(SQL["copy_tenant_weights"], {
                "tenants": [r["tenant"] for r in weights],
                "weights": [r["weight"] for r in weights]})
            conn.execute(SQL["copy_workflow_builds"], {
                "workflows": [r["workflow_name"] for r in builds],
                "builds": [r["build_id"] for r in builds],
                "pinned": [r["pinned"] for r in builds]})


def drop_new_schema(shard: Shard) -> None:
    try:
        with connect(shard, autocommit=True) as conn:
            conn.execute(SQL["drop_new_shard_schema"])
    except (ShardqError, psycopg.Error) as exc:
        log.warning("could not drop the shardq schema a failed migration left",
                    extra={"shard": shard.name, "error": str(exc)})


def _server_of(shard: Shard) -> tuple[str, str, str]:
    """Where the shard's tables are: its server, database and schema."""
    with connect(shard, autocommit=True) as conn:
        row = conn.execute(SQL["server_identity"]).fetchone()
    assert row is not None
    return str(row["server"]), str(row["dbname"]), shard.schema
