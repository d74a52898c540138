"""Where a move reads the deployment: the newest map its seeds hold, a direct
connection to any shard that map names, and the mover's lock on the home shard.

Only one mover (or map change) runs per deployment: it holds a session advisory
lock on home for its whole run, and the move journal lives there too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg

from shardq.moves.plan import Layout, check_layout, shard_names
from shardq.moves.store import MoveStore
from shardq.shards.config import Shard, ShardMap, without_password
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import ConfigError, MoveRunning, SchemaBehind, ShardUnavailable


class Deployment:
    """The newest map the seeds hold, a way to reach each shard it names, and the store
    every statement of a move goes through."""

    def __init__(self, seeds: ShardMap, version: int, layout: Layout,
                 store: MoveStore | None = None) -> None:
        self.seeds = seeds
        self.version = version
        self.layout = layout
        self.store = store or MoveStore()

    @classmethod
    def load(cls, seeds: ShardMap, store: MoveStore | None = None) -> Deployment:
        store = store or MoveStore()
        best: tuple[int, Layout] | None = None
        errors = []
        for seed in seeds.shards:
            try:
                with connect(seed, autocommit=True) as conn:
                    found = store.newest_map(conn)
            except ShardUnavailable as exc:
                errors.append(str(exc))
                continue
            except psycopg.errors.UndefinedTable:
                raise SchemaBehind(f"{seed.label}: no map versions: run `shardq migrate`") from None
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None:
            raise ShardUnavailable("no seed shard answered with a map: " + "; ".join(errors)
                                   if errors else "no seed shard holds a map version")
        check_layout(best[1])
        return cls(seeds, *best, store=store)

    @property
    def home(self) -> str:
        return str(self.layout["home"])

    @property
    def names(self) -> list[str]:
        return shard_names(self.layout)

    def shard(self, name: str) -> Shard:
        """The shard `name` of the map, with the seeds' credentials for its host."""
        entry = next((s for s in self.layout["shards"] if s["name"] == name), None)
        if entry is None:
            raise ConfigError(f"unknown shard {name!r}: the map has {', '.join(self.names)}")
        url = str(entry["url"])
        index = self.names.index(name)
        for seed in self.seeds.shards:
            if seed.name == name and without_password(seed.url) == url:
                return seed
        # Only the name and URL of a Shard serve a direct connection; a seed's
        # other fields stand in, whatever shape the configured map has.
        return dataclasses.replace(self.seeds.shards[0], index=index, name=name,
                                   url=_with_credentials(url, self.seeds))

    def connect(self, name: str, *, autocommit: bool = True) -> DictConnection:
        return connect(self.shard(name), autocommit=autocommit)

    def refresh(self, conns: dict[str, DictConnection]) -> None:
        """Take the newest version any of these shards holds."""
        for conn in conns.values():
            found = self.store.newest_map(conn)
            if found is not None and found[0] > self.version:
                self.version, self.layout = found


def _with_credentials(url: str, seeds: ShardMap) -> str:
    parts = urlsplit(url)
    if parts.password is not None:
        return url
    for seed in seeds.shards:
        s = urlsplit(seed.url)
        if (s.hostname, s.port) == (parts.hostname, parts.port) and s.password is not None:
            user = parts.username or s.username or ""
            host = parts.netloc.rpartition("@")[2]
            return urlunsplit(parts._replace(netloc=f"{user}:{s.password}@{host}"))
    return url


@contextmanager
def mover_lock(dep: Deployment) -> Iterator[DictConnection]:
    """A connection to home holding the mover's lock; MoveRunning when another has it."""
    conn = dep.connect(dep.home)
    try:
        dep.store.set_application_name(conn, "shardq-mover")
        if not dep.store.try_mover_lock(conn):
            holder = dep.store.mover_lock_holder(conn)
            running = dep.store.unfinished_move(conn)
            what = (f"move {running.id} (buckets {running.first_bucket}-"
                    f"{running.last_bucket} from {running.source} to {running.target}, "
                    f"{running.phase})" if running else "a mover")
            who = (f" by pid {holder.pid} on {holder.host} since "
                   f"{holder.backend_start:%Y-%m-%d %H:%M:%S}" if holder else "")
            raise MoveRunning(f"another move is running: {what}{who}")
        yield conn
    finally:
        conn.close()
