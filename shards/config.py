"""The shard map: which PostgreSQL database owns which bucket range.

Configuration comes from `SHARDQ_SHARDS` (comma-separated PostgreSQL URLs, split
into equal contiguous bucket ranges in the order given) or from a TOML file:

    [pool]                # optional defaults for every shard
    min_size = 1
    max_size = 10

    [[shards]]
    name = "eu-1"                         # optional, defaults to shard-<index>
    url = "postgresql://app@db1/shardq"
    buckets = [0, 2047]                   # optional inclusive range; all or none
    max_size = 20                         # optional per-shard pool override

Every process must hold the same map: `fingerprint` is recorded in each shard at
migration time and checked by every process that starts against it.
"""

from __future__ import annotations

import bisect
import difflib
import hashlib
import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

from shardq.shards.errors import ConfigError
from shardq.shards.routing import BUCKETS, bucket_of

ENV_SHARDS = "SHARDQ_SHARDS"
ENV_POOL_MIN = "SHARDQ_POOL_MIN"
ENV_POOL_MAX = "SHARDQ_POOL_MAX"
DEFAULT_POOL_MIN = 1
DEFAULT_POOL_MAX = 10


def redact(url: str) -> str:
    """The URL with its password replaced, fit for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


_PASSWORD_PARAMETERS = ("password", "sslpassword")


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
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@dataclass(frozen=True)
class Shard:
    """One shard: a database, the inclusive bucket range it owns, and its pool sizes."""

    index: int
    name: str
    url: str
    first_bucket: int
    last_bucket: int
    pool_min: int = DEFAULT_POOL_MIN
    pool_max: int = DEFAULT_POOL_MAX

    @property
    def label(self) -> str:
        """How messages name this shard: `shard-0 (postgresql://app:***@db1/shardq)`."""
        return f"{self.name} ({redact(self.url)})"

    def identity(self) -> dict[str, Any]:
        """What the fingerprint covers: everything but connection details and pool sizes."""
        return {"name": self.name, "buckets": [self.first_bucket, self.last_bucket]}


@dataclass(frozen=True)
class ShardMap:
    """An ordered, validated list of shards covering every bucket exactly once."""

    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        _check_cover(self.shards)
        _check_unique(self.shards)

    @property
    def fingerprint(self) -> str:
        """Stable digest of the map's layout (names and bucket ranges, not URLs)."""
        return hashlib.sha256(self.describe().encode()).hexdigest()[:16]

    def describe(self) -> str:
        """Canonical JSON of the layout, recorded beside the fingerprint in every shard."""
        layout = {"buckets": BUCKETS, "shards": [s.identity() for s in self.shards]}
        return json.dumps(layout, sort_keys=True, separators=(",", ":"))

    def for_bucket(self, bucket: int) -> Shard:
        """The shard owning `bucket`."""
        if not 0 <= bucket < BUCKETS:
            raise ValueError(f"bucket {bucket} is outside 0..{BUCKETS - 1}")
        starts = [s.first_bucket for s in self.shards]
        return self.shards[bisect.bisect_right(starts, bucket) - 1]

    def for_execution(self, execution_id: str | Any) -> Shard:
        """The shard holding an execution, read straight from its id."""
        return self.for_bucket(bucket_of(execution_id))

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
            shards.append(Shard(i, name, _check_url(url, name), first, last, lo, hi))
        return cls(tuple(shards))

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
        return cls.from_urls(
            urls,
            pool_min=_int_env(env, ENV_POOL_MIN),
            pool_max=_int_env(env, ENV_POOL_MAX),
        )

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
        _pool_sizes(pool.get("min_size"), pool.get("max_size"), where=f"{source}: [pool]")
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
            shards.append(Shard(i, name, default.url, first, last, lo, hi))
        return cls(tuple(sorted(shards, key=lambda s: s.first_bucket)))


def load_shard_map(shards_file: Path | None = None) -> ShardMap:
    """The process's shard map: the TOML file when given, else the environment."""
    return ShardMap.from_toml(shards_file) if shards_file else ShardMap.from_env()


# -- validation ------------------------------------------------------------

_DOCUMENT_KEYS = ("pool", "shards")
_POOL_KEYS = ("min_size", "max_size")
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


def _check_url(url: str, name: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"{name}: {redact(url)!r} is not a PostgreSQL URL (expected postgresql://...)"
        )
    try:
        params = conninfo_to_dict(url)
    except Exception as exc:  # psycopg raises ProgrammingError with libpq's text
        raise ConfigError(f"{name}: malformed URL {redact(url)!r}: {exc}") from None
    port = str(params.get("port") or "5432")
    if not all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        raise ConfigError(f"{name}: malformed URL {redact(url)!r}: port {port!r} is not a number")
    if not params.get("dbname"):
        raise ConfigError(f"{name}: URL {redact(url)!r} names no database")
    return url


def _endpoint(url: str) -> tuple[str, str, str]:
    params = conninfo_to_dict(url)
    host = str(params.get("host") or "localhost")
    return host, str(params.get("port") or "5432"), str(params["dbname"])


def _check_unique(shards: Sequence[Shard]) -> None:
    seen: dict[tuple[str, str, str], Shard] = {}
    names: dict[str, Shard] = {}
    for shard in shards:
        key = _endpoint(shard.url)
        if key in seen:
            raise ConfigError(
                f"duplicate shard URL: {shard.label} is the same database as {seen[key].label}"
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
    for field, value in (("min_size", lo), ("max_size", hi)):
        # bool is an int to Python, never a pool size to a reader.
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{where}: {field} must be an integer, got {value!r}")
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
