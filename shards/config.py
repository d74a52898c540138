"""The shard map: which PostgreSQL database owns which bucket range.

Configuration comes from `SHARDQ_SHARDS` (comma-separated PostgreSQL URLs, split
into equal contiguous bucket ranges in the order given) or from a TOML file:

    [pool]                # optional defaults for every shard
    min_size = 1
    max_size = 10
    pooler = "postgresql://pgbouncer:6432"   # optional: pools connect through it

    [[shards]]
    name = "eu-1"                         # optional, defaults to shard-<index>
    url = "postgresql://app@db1/shardq"
    buckets = [0, 2047]                   # optional inclusive range; all or none
    max_size = 20                         # optional per-shard pool override

`pooler` (or `SHARDQ_POOLER`) names a PgBouncer in transaction mode that fronts every
shard's database by its own name: this process's pools connect through it (see
`through_pooler`), while its LISTEN, migrations and the mover's session lock still
reach each server directly (docs/configuration.md, "Behind PgBouncer"). Like the pool
sizes, it is this process's setting, not the map's.

This configuration is the seed list and map version 1: `shardq migrate` records it
in every shard (`shardq.shard_maps`, with its `fingerprint` in `shard_identity`),
and a process whose configuration describes another version 1 is refused. Later
versions (`shardq shards add|remove|move`) are documents in `shard_maps` of the
same shape as `ShardMap.layout()`: a process starts from the newest version its
reachable seeds hold and follows newer ones (shards/pools.py, shards/follow.py).
A version may give a shard several bucket ranges, or none.
"""

from __future__ import annotations

import bisect
import difflib
import hashlib
import json
import os
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

from shardq.shards.errors import ConfigError
from shardq.shards.layout import split_schema, unsplit
from shardq.shards.routing import BUCKETS, bucket_of

ENV_SHARDS = "SHARDQ_SHARDS"
ENV_POOL_MIN = "SHARDQ_POOL_MIN"
ENV_POOL_MAX = "SHARDQ_POOL_MAX"
ENV_POOLER = "SHARDQ_POOLER"
DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 10


_PASSWORD_PARAMETERS = ("password", "sslpassword")


def redact(url: str) -> str:
    """The URL with its password replaced, fit for logs and error messages."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    # libpq takes a password from the query string too.
    query = "&".join(
        f"{p.split('=', 1)[0]}=***" if unquote(p.split("=", 1)[0]) in _PASSWORD_PARAMETERS else p
        for p in parts.query.split("&")) if parts.query else parts.query
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return unsplit(parts._replace(netloc=netloc, query=query))


def through_pooler(url: str, pooler: str) -> str:
    """Shard URL `url` reached through transaction pooler `pooler` (a postgresql://host:port
    URL): its host and port swapped for the pooler's, its database, user, password and
    other settings kept, so the pooler must know the database by the same name."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    address = urlsplit(pooler).netloc.rpartition("@")[2]
    query = "&".join(p for p in parts.query.split("&") if p and unquote(
        p.split("=", 1)[0]) not in ("host", "hostaddr", "port"))
    return unsplit(parts._replace(netloc=f"{userinfo}@{address}" if userinfo else address,
                                   query=query))


def check_pooler(value: object, where: str) -> str:
    """A pooler's address as configuration gives it: postgresql://host[:port], no more."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a postgresql://host:port URL, got {value!r:.80}")
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (parts.scheme not in ("postgresql", "postgres") or not parts.hostname or port == -1
            or parts.path not in ("", "/") or parts.query or parts.username is not None):
        raise ConfigError(f"{where} must be a postgresql://host:port URL (the pooler's "
                          f"address alone: each shard's URL gives its database and user), "
                          f"got {redact(value)!r:.120}")
    return value


def without_password(url: str) -> str:
    """The URL with no password left in it, fit to be stored where every shard copies it.

    libpq takes a password from the user part and from the query string alike.
    """
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hosts = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}@{hosts}"
    query = parts.query
    if query:
        kept = [p for p in query.split("&")
                if unquote(p.split("=", 1)[0]) not in _PASSWORD_PARAMETERS]
        query = "&".join(kept)
    return unsplit(parts._replace(netloc=netloc, query=query))


Range = tuple[int, int]
"""An inclusive bucket range, (first, last)."""


@dataclass(frozen=True)
class Shard:
    """One shard: a database, the inclusive bucket ranges it owns (none for a shard just
    added), and its pool sizes."""

    index: int
    name: str
    url: str
    ranges: tuple[Range, ...]
    pool_min: int = DEFAULT_POOL_MIN
    pool_max: int = DEFAULT_POOL_MAX

    @property
    def label(self) -> str:
        """How messages name this shard: `shard-0 (postgresql://app:***@db1/shardq)`."""
        return f"{self.name} ({redact(self.url)})"

    @property
    def conninfo(self) -> str:
        """The URL libpq connects to: `url` less its `schema=` (shards/layout.py)."""
        return split_schema(self.url)[0]

    @property
    def schema(self) -> str:
        """The schema holding the shard's tables: `shardq` unless its URL names one."""
        return split_schema(self.url)[1]

    @property
    def first_bucket(self) -> int:
        """The lowest bucket the shard owns, -1 when it owns none (matches no bucket)."""
        return self.ranges[0][0] if self.ranges else -1

    @property
    def last_bucket(self) -> int:
        """The highest bucket the shard owns, -1 when it owns none. With several ranges,
        the buckets between first_bucket and last_bucket are not all its own: ask `owns`."""
        return self.ranges[-1][1] if self.ranges else -1

    @property
    def bucket_count(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)

    def owns(self, bucket: int) -> bool:
        """True when `bucket` is in one of the shard's ranges."""
        return any(first <= bucket <= last for first, last in self.ranges)

    def identity(self) -> dict[str, Any]:
        """What the fingerprint covers: everything but connection details and pool sizes."""
        if len(self.ranges) == 1:
            return {"name": self.name, "buckets": [self.first_bucket, self.last_bucket]}
        return {"name": self.name, "ranges": [list(r) for r in self.ranges]}


@dataclass(frozen=True)
class ShardMap:
    """One version of the map: its shards, and bucket ranges covering every bucket once.

    `version` is 1 for a map read from configuration (the seeds); a map read from
    a shard's `shard_maps` carries that row's version, the `deployment` of the
    shard it came from, and the configuration it was followed from (`seeds`).
    `home` is the shard holding the move journal (version 1's first shard).
    """

    shards: tuple[Shard, ...]
    version: int = 1
    home: str = ""
    deployment: uuid.UUID | None = None
    origin: ShardMap | None = field(default=None, compare=False, repr=False)
    pool_min: int = field(default=DEFAULT_POOL_MIN, compare=False)
    pool_max: int = field(default=DEFAULT_POOL_MAX, compare=False)
    pooler: str | None = field(default=None, compare=False)
    """A transaction pooler (PgBouncer) this process's pools connect through, if any."""
    _starts: tuple[int, ...] = field(default=(), init=False, compare=False, repr=False)
    _owners: tuple[Shard, ...] = field(default=(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        ranges = sorted(((r, s) for s in self.shards for r in s.ranges),
                        key=lambda pair: pair[0])
        _check_ranges([(first, last, s.name) for (first, last), s in ranges])
        _check_unique(self.shards)
        object.__setattr__(self, "_starts", tuple(r[0] for r, _ in ranges))
        object.__setattr__(self, "_owners", tuple(s for _, s in ranges))
        if not self.home:
            object.__setattr__(self, "home", self._owners[0].name)
        elif self.home not in {s.name for s in self.shards}:
            raise ConfigError(f"map version {self.version}: home shard {self.home!r} is not "
                              "one of its shards")

    @property
    def home_shard(self) -> Shard:
        """The home shard itself (always one of the map's shards: checked at creation)."""
        found = self.get(self.home)
        assert found is not None
        return found

    @property
    def seeds(self) -> ShardMap:
        """The configuration this map was followed from (itself for a configured map)."""
        return self.origin if self.origin is not None else self

    @property
    def fingerprint(self) -> str:
        """Stable digest of the map's layout (names and bucket ranges, not URLs)."""
        return hashlib.sha256(self.describe().encode()).hexdigest()[:16]

    def describe(self) -> str:
        """Canonical JSON of the layout, recorded beside the fingerprint in every shard."""
        layout = {"buckets": BUCKETS, "shards": [s.identity() for s in self.shards]}
        return json.dumps(layout, sort_keys=True, separators=(",", ":"))

    def layout(self) -> dict[str, Any]:
        """The map as a `shard_maps.layout` document: URLs without passwords, ranges in
        bucket order."""
        return {
            "buckets": BUCKETS,
            "home": self.home,
            "shards": [{"name": s.name, "url": without_password(s.url)} for s in self.shards],
            "ranges": sorted([first, last, owner.name] for owner in self.shards
                             for first, last in owner.ranges),
        }

    def for_bucket(self, bucket: int) -> Shard:
        """The shard owning `bucket`."""
        if not 0 <= bucket < BUCKETS:
            raise ValueError(f"bucket {bucket} is outside 0..{BUCKETS - 1}")
        return self._owners[bisect.bisect_right(self._starts, bucket) - 1]

    def for_execution(self, execution_id: str | Any) -> Shard:
        """The shard holding an execution, read straight from its id."""
        return self.for_bucket(bucket_of(execution_id))

    def get(self, name: str) -> Shard | None:
        """The shard called `name`, or None."""
        return next((s for s in self.shards if s.name == name), None)

    def named(self, names: Sequence[str]) -> list[Shard]:
        """The shards with the given names, in map order; unknown names are an error."""
        known = {s.name: s for s in self.shards}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(
                f"unknown shard {', '.join(unknown)}: the map has {', '.join(known)}"
            )
        return [s for s in self.shards if s.name in set(names)]

# -- constructors --------------------------------------------------------

    @classmethod
    def from_urls(
        cls, urls: Sequence[str], *, pool_min: int | None = None, pool_max: int | None = None
    ) -> ShardMap:
        """Equal contiguous bucket ranges over `urls`, in order."""
        if not urls:
            raise ConfigError("the shard map is empty: give at least one PostgreSQL URL")
        if len(urls) > BUCKETS:
            raise ConfigError(f"{len(urls)} shards is more than the {BUCKETS} buckets")
        lo, hi = _pool_sizes(pool_min, pool_max, where="pool")
        shards = []
        for i, url in enumerate(urls):
            first, last = i * BUCKETS // len(urls), (i + 1) * BUCKETS // len(urls) - 1
            name = f"shard-{i}"
            shards.append(Shard(i, name, check_url(url, name), ((first, last),), lo, hi))
        return cls(tuple(shards), pool_min=lo, pool_max=hi)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ShardMap:
        """The map from SHARDQ_SHARDS and the pool sizes from SHARDQ_POOL_MIN/MAX."""
        env = os.environ if environ is None else environ
        raw = env.get(ENV_SHARDS, "").strip()
        if not raw:
            raise ConfigError(f"no shards configured: set {ENV_SHARDS} or pass --shards-file")
        urls = [u.strip() for u in raw.split(",")]
        if any(not u for u in urls):
            raise ConfigError(f"{ENV_SHARDS} has an empty entry: {raw!r}")
        found = cls.from_urls(
            urls,
            pool_min=_int_env(env, ENV_POOL_MIN),
            pool_max=_int_env(env, ENV_POOL_MAX),
        )
        pooler = env.get(ENV_POOLER, "").strip()
        return replace(found, pooler=check_pooler(pooler, ENV_POOLER)) if pooler else found

    @classmethod
    def from_toml(cls, path: Path) -> ShardMap:
        """The map described by a TOML file (see the module docstring)."""
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read shards file {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            # TOML is UTF-8 by definition; a Latin-1 or UTF-16 file is a mistake to name.
            raise ConfigError(
                f"shards file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"shards file {path} is not valid TOML: {exc}") from None
        except RecursionError:
            raise ConfigError(f"shards file {path} is nested too deeply") from None
        return cls.from_document(doc, source=str(path))

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], *, source: str = "shards file") -> ShardMap:
        _check_keys(doc, _DOCUMENT_KEYS, source)
        pool = doc.get("pool", {})
        if not isinstance(pool, Mapping):
            raise ConfigError(f"{source}: [pool] must be a table")
        _check_keys(pool, _POOL_KEYS, f"{source}: [pool]")
        default_min, default_max = _pool_sizes(pool.get("min_size"), pool.get("max_size"),
                                               where=f"{source}: [pool]")
        entries = doc.get("shards")
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{source}: needs at least one [[shards]] entry")
        for i, entry in enumerate(entries):
            if isinstance(entry, Mapping):
                _check_keys(entry, _SHARD_KEYS, f"{source}: shard entry {i}")
        ranged = [isinstance(e, Mapping) and "buckets" in e for e in entries]
        if any(ranged) and not all(ranged):
            raise ConfigError(f"{source}: give `buckets` for every shard or for none")
        equal = cls.from_urls([_entry_url(e, i, source) for i, e in enumerate(entries)])
        shards = []
        for i, (entry, default) in enumerate(zip(entries, equal.shards, strict=True)):
            name = entry.get("name", default.name)
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{source}: shard entry {i}: name must be a non-empty string")
            where = f"{source}: shard {name}"
            first, last = default.first_bucket, default.last_bucket
            if all(ranged):
                first, last = _bucket_range(entry["buckets"], where)
            lo, hi = _pool_sizes(
                entry.get("min_size", pool.get("min_size")),
                entry.get("max_size", pool.get("max_size")),
                where=where,
            )
            shards.append(Shard(i, name, default.url, ((first, last),), lo, hi))
        _check_cover(sorted(shards, key=lambda s: s.first_bucket))
        pooler = pool.get("pooler")
        return cls(tuple(sorted(shards, key=lambda s: s.first_bucket)),
                   pool_min=default_min, pool_max=default_max,
                   pooler=None if pooler is None else check_pooler(
                       pooler, f"{source}: [pool] pooler"))

    @classmethod
    def from_layout(
        cls, layout: object, version: int, *, seeds: ShardMap | None = None,
        deployment: uuid.UUID | None = None,
    ) -> ShardMap:
        """Map `version` from its `shard_maps.layout` document (see `layout()`).

        A shard the seed configuration names, at the same database, keeps its
        configured URL and pool sizes. Any other shard connects with the map's URL
        (stored without password), taking user and password from a seed on the same
        host and port when the map's URL has none (libpq's passfile or PGPASSWORD
        otherwise), with the configuration's default pool sizes.
        """
        where = f"map version {version}"
        if not isinstance(layout, Mapping):
            raise ConfigError(f"{where}: the layout is not an object")
        _check_keys(layout, _LAYOUT_KEYS, where)
        if layout.get("buckets") != BUCKETS:
            raise ConfigError(f"{where}: buckets must be {BUCKETS}, got {layout.get('buckets')!r}")
        owned = _layout_ranges(layout, where)
        entries: list[Mapping[str, str]] = layout["shards"]
        home = layout.get("home")
        if not isinstance(home, str) or home not in owned:
            raise ConfigError(f"{where}: home {home!r} is not one of its shards")
        seed_map = seeds.seeds if seeds is not None else None
        shards = []
        for i, entry in enumerate(entries):
            name, url = entry["name"], check_url(entry["url"], f"{where}: {entry['name']}")
            lo = seed_map.pool_min if seed_map else DEFAULT_POOL_MIN
            hi = seed_map.pool_max if seed_map else DEFAULT_POOL_MAX
            configured = seed_map.get(name) if seed_map else None
            if configured is not None and _endpoint(configured.url) == _endpoint(url):
                url, lo, hi = configured.url, configured.pool_min, configured.pool_max
            elif seed_map is not None:
                url = _with_seed_credentials(url, seed_map)
            shards.append(Shard(i, name, url, tuple(sorted(owned[name])), lo, hi))
        return cls(tuple(shards), version=version, home=home, deployment=deployment,
                   origin=seed_map, pool_min=seed_map.pool_min if seed_map else DEFAULT_POOL_MIN,
                   pool_max=seed_map.pool_max if seed_map else DEFAULT_POOL_MAX,
                   pooler=seed_map.pooler if seed_map else None)


def load_shard_map(shards_file: Path | None = None) -> ShardMap:
    """The process's shard map: the TOML file when given, else the environment."""
    return ShardMap.from_toml(shards_file) if shards_file else ShardMap.from_env()


# -- validation ------------------------------------------------------------

_DOCUMENT_KEYS = ("pool", "shards")
_LAYOUT_KEYS = ("buckets", "home", "shards", "ranges")
_POOL_KEYS = ("min_size", "max_size", "pooler")
_SHARD_KEYS = ("name", "url", "buckets", "min_size", "max_size")


def _check_keys(table: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    """Refuse keys the map does not know: a typo (`bucket =`) silently ignored would
    give a map other than the one the operator wrote."""
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(known)}"
            )


def check_url(url: str, name: str) -> str:
    """`url` when it is a PostgreSQL URL naming a database; ConfigError naming `name` else."""
    scheme = urlsplit(url).scheme
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"{name}: {redact(url)!r} is not a PostgreSQL URL (expected postgresql://...)"
        )
    try:
        params = conninfo_to_dict(split_schema(url)[0])
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    except Exception as exc:  # psycopg raises ProgrammingError with libpq's text
        raise ConfigError(f"{name}: malformed URL {redact(url)!r}: {exc}") from None
    port = str(params.get("port") or "5432")
    if not all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        raise ConfigError(f"{name}: malformed URL {redact(url)!r}: port {port!r} is not a number")
    if not params.get("dbname"):
        raise ConfigError(f"{name}: URL {redact(url)!r} names no database")
    return url


def _endpoint(url: str) -> tuple[str, str, str, str]:
    """Where a shard URL's tables are: host, port, database and schema."""
    conninfo, schema = split_schema(url)
    params = conninfo_to_dict(conninfo)
    host = str(params.get("host") or "localhost")
    return host, str(params.get("port") or "5432"), str(params["dbname"]), schema


def _check_unique(shards: Sequence[Shard]) -> None:
    seen: dict[tuple[str, str, str, str], Shard] = {}
    names: dict[str, Shard] = {}
    for shard in shards:
        key = _endpoint(shard.url)
        if key in seen:
            raise ConfigError(
                f"duplicate shard URL: {shard.label} is the same database and schema as "
                f"{seen[key].label}"
            )
        if shard.name in names:
            raise ConfigError(f"duplicate shard name {shard.name!r}")
        seen[key], names[shard.name] = shard, shard


def _check_cover(shards: Sequence[Shard]) -> None:
    expected = 0
    for shard in shards:
        if shard.first_bucket != expected:
            kind = "gap" if shard.first_bucket > expected else "overlap"
            raise ConfigError(
                f"bucket {kind} at {expected}: shard {shard.name} starts at {shard.first_bucket}"
            )
        if shard.last_bucket < shard.first_bucket:
            raise ConfigError(f"shard {shard.name} has an empty bucket range")
        expected = shard.last_bucket + 1
    if expected != BUCKETS:
        raise ConfigError(f"buckets {expected}..{BUCKETS - 1} belong to no shard")


def _layout_ranges(layout: Mapping[str, Any], where: str) -> dict[str, list[Range]]:
    """Each shard's ranges in a layout document, every entry checked (coverage is
    checked by ShardMap itself)."""
    entries, ranges = layout.get("shards"), layout.get("ranges")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: needs a non-empty list of shards")
    if not isinstance(ranges, list):
        raise ConfigError(f"{where}: ranges must be a list of [first, last, name]")
    owned: dict[str, list[Range]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or set(entry) != {"name", "url"} or not all(
            isinstance(entry[k], str) and entry[k] for k in ("name", "url")
        ):
            raise ConfigError(f"{where}: shard entry {i} must be {{name, url}} strings")
        owned.setdefault(entry["name"], [])
    for item in ranges:
        if (not isinstance(item, list) or len(item) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool)
                           and 0 <= v < BUCKETS for v in item[:2])
                or not isinstance(item[2], str)):
            raise ConfigError(f"{where}: range {item!r} is not [first, last, name] "
                              f"within 0..{BUCKETS - 1}")
        if item[2] not in owned:
            raise ConfigError(f"{where}: range {item!r} names no shard of the map")
        if item[1] < item[0]:
            raise ConfigError(f"{where}: range {item!r} is empty (last before first)")
        owned[item[2]].append((item[0], item[1]))
    return owned


def _check_ranges(ranges: Sequence[tuple[int, int, str]]) -> None:
    """Sorted (first, last, owner) ranges must cover 0..BUCKETS-1 exactly once."""
    expected = 0
    for first, last, name in ranges:
        if first != expected:
            kind = "gap" if first > expected else "overlap"
            raise ConfigError(f"bucket {kind} at {expected}: shard {name} has a range "
                              f"starting at {first}")
        if last < first:
            raise ConfigError(f"shard {name} has an empty bucket range")
        expected = last + 1
    if expected != BUCKETS:
        raise ConfigError(f"buckets {expected}..{BUCKETS - 1} belong to no shard")


def _with_seed_credentials(url: str, seeds: ShardMap) -> str:
    """`url` with the user and password of a seed on the same host and port, when it
    names neither itself."""
    host, port, _, _ = _endpoint(url)
    given = conninfo_to_dict(split_schema(url)[0])
    if given.get("password"):
        return url
    for seed in seeds.shards:
        seed_host, seed_port, _, _ = _endpoint(seed.url)
        if (seed_host, seed_port) != (host, port):
            continue
        params = conninfo_to_dict(seed.conninfo)
        user, password = params.get("user"), params.get("password")
        if not password or (given.get("user") and given["user"] != user):
            continue
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        auth = f"{quote(str(user), safe='')}:{quote(str(password), safe='')}@"
        return urlunsplit(parts._replace(netloc=auth + hosts))
    return url


def _entry_url(entry: object, index: int, source: str) -> str:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("url"), str):
        raise ConfigError(f"{source}: shard entry {index} needs a url string")
    return str(entry["url"])


def _bucket_range(value: object, where: str) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and 0 <= v < BUCKETS for v in value)
    ):
        raise ConfigError(f"{where}: buckets must be [first, last] within 0..{BUCKETS - 1}")
    return value[0], value[1]


def _pool_sizes(lo: object, hi: object, *, where: str) -> tuple[int, int]:
    for key, value in (("min_size", lo), ("max_size", hi)):
        # bool is an int to Python, never a pool size to a reader.
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    lo = DEFAULT_POOL_MIN if lo is None else lo
    hi = max(DEFAULT_POOL_MAX, lo) if hi is None and isinstance(lo, int) else hi
    if not isinstance(lo, int) or not isinstance(hi, int) or lo < 0 or hi < 1 or lo > hi:
        raise ConfigError(f"{where}: pool sizes must satisfy 0 <= min_size <= max_size, max >= 1")
    return lo, hi


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
