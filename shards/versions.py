"""Changing the shard map, and reading it as `shardq shards status` shows it.

`shardq shards add` and `remove` write map version N+1 to every shard, under the
mover's lock on the home shard; a change that stopped part-way is finished by the
next one. `read_map` is the current map as the reachable seeds know it, with each
shard's status (shards/check.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from shardq.shards.check import ShardStatus, check_one_deployment, check_shard, raise_problem
from shardq.shards.config import Shard, ShardMap, check_url, redact, without_password
from shardq.shards.connections import connect
from shardq.shards.errors import (
    ConfigError,
    MapMismatch,
    MigrationError,
    MoveRunning,
    ShardqError,
    ShardUnavailable,
)
from shardq.shards.follow import newest_map
from shardq.shards.layout import split_schema
from shardq.shards.migrations import migrate
from shardq.shards.new_shard import check_new_database, copy_settings, drop_new_schema
from shardq.shards.schema_files import Schema, load_schema
from shardq.shards.sqlfile import load_queries

log = logging.getLogger(__name__)

SQL = load_queries("shardq.shards", "queries.sql")

# "shardqmv": the mover's lock on the home shard. Only its holder writes a new map
# version, so two changes at once can never mint two different version-N documents.
MOVER_LOCK_KEY = int.from_bytes(b"shardqmv", "big") & 0x7FFF_FFFF_FFFF_FFFF
MAX_SHARD_NAME = 63
"""Characters of a shard name: PostgreSQL's identifier length, so it fits wherever a
name is used (application_name, a pool's name, log fields)."""


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
        check_one_deployment(statuses)
    except MapMismatch:
        current = seeds  # shown as the problem of the seed that differs
    else:
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
    params = conninfo_to_dict(split_schema(url)[0])
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
        raise_problem(status)


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
        home = current.get(current.home)
        assert home is not None  # ShardMap checks its home is one of its shards
        copy_settings(home, new)
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
