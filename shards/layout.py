"""Shards as schemas: several shards in one database, each in a schema of its own.

A shard is a database by default, its tables in schema `shardq`. A shard URL may name
another schema (`postgresql://db1/app?schema=s07`): the shard then lives in that
schema, and every shard of one database shares the process's pool and LISTEN
connection for that database. A PostgreSQL connection is bound to one database, so
this is what keeps a process's connections from growing with the shard count: 64
shards on 2 servers cost 2 small pools, not 64 (docs/configuration.md, "Shards as
schemas").

Every statement, migration and function body names its tables `shardq.<name>`; a
connection lent for a shard in another schema renders each statement it runs with
that schema instead (`SchemaCursor`), so the SQL stays in one place, written once.
Within a function body the schema's name also makes its NOTIFY channels
(`shardq.wake` -> `s07_wake`) and custom settings (`s07.slots_counted`) its own: shards
sharing a database hear only their own wake-ups.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit, urlunsplit

from psycopg import AsyncCursor, Cursor
from psycopg.abc import Params, Query
from psycopg.sql import Composable

from shardq.shards.errors import ConfigError

DEFAULT_SCHEMA = "shardq"
SCHEMA_PARAMETER = "schema"
"""The query parameter of a shard URL that names its schema (libpq never sees it)."""

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# `shardq.` where SQL names the schema: a qualified table or function, or a custom
# setting. Not `shardq:` (idempotency keys) nor `shardq_` (the map's channel).
_SCHEMA_REF = re.compile(r"\bshardq\.")


def check_schema(name: str, where: str) -> str:
    """`name` when it may name a shard's schema; ConfigError naming `where` else.

    Lower-case identifiers only: the name is written into statements unquoted (it also
    prefixes custom settings, which take no quotes), and PostgreSQL's own prefixes are
    out."""
    if not _NAME.match(name) or name.startswith("pg_") or name == "information_schema":
        raise ConfigError(
            f"{where}: schema {name[:80]!r} is not a lower-case identifier (a-z, 0-9, _; "
            "at most 63; not pg_*)")
    return name


def unsplit(parts: SplitResult) -> str:
    """urlunsplit, keeping the `//` of a URL that names no host: urlunsplit turns
    `postgresql:///db?host=/run/postgresql` (a Unix socket) into `postgresql:/db?...`,
    which libpq refuses."""
    url = urlunsplit(parts)
    if parts.netloc or not parts.scheme:
        return url
    return f"{parts.scheme}://" + url.removeprefix(f"{parts.scheme}:")


@lru_cache(maxsize=1024)
def split_schema(url: str) -> tuple[str, str]:
    """(the URL libpq connects to, the shard's schema) of a shard URL."""
    parts = urlsplit(url)
    if not parts.query:
        return url, DEFAULT_SCHEMA
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    named = [value for key, value in pairs if key == SCHEMA_PARAMETER]
    if not named:
        return url, DEFAULT_SCHEMA
    if len(named) > 1:
        raise ConfigError(f"shard URL names {SCHEMA_PARAMETER}= {len(named)} times")
    schema = check_schema(named[0], "shard URL")
    kept = "&".join(p for p in parts.query.split("&")
                    if unquote(p.split("=", 1)[0]) != SCHEMA_PARAMETER)
    return unsplit(parts._replace(query=kept)), schema


def with_schema(url: str, schema: str) -> str:
    """The URL of a shard in `schema` of the database `url` names."""
    return f"{url}{'&' if urlsplit(url).query else '?'}{SCHEMA_PARAMETER}={schema}"


@lru_cache(maxsize=8192)
def _render_text(query: str, schema: str) -> str:
    return _SCHEMA_REF.sub(f"{schema}.", query)


def render(query: Query, schema: str, context: Any) -> Query:
    """`query` naming `schema` where it names `shardq.` (unchanged for the default)."""
    if schema == DEFAULT_SCHEMA:
        return query
    if isinstance(query, Composable):
        query = query.as_string(context)
    if isinstance(query, bytes | bytearray | memoryview):
        return _render_text(bytes(query).decode(), schema).encode()
    return _render_text(str(query), schema)


class SchemaCursor(Cursor[Any]):
    """A cursor that renders each statement for the schema its connection is lent to.

    psycopg turns every statement into its wire form in `_convert_query` (execute,
    executemany, stream and copy alike): the one place to render them all. It is not
    psycopg's public API (pinned < 4 in pyproject.toml): should a release stop calling
    it, a shard's statements would name `shardq.`, a schema its database lacks, and
    tests/acceptance/test_schema_layout.py fails."""

    def _convert_query(self, query: Query, params: Params | None = None) -> Any:
        schema = getattr(self._conn, "schema", DEFAULT_SCHEMA)
        return super()._convert_query(render(query, schema, self._conn), params)


class AsyncSchemaCursor(AsyncCursor[Any]):
    """SchemaCursor for asyncio connections."""

    def _convert_query(self, query: Query, params: Params | None = None) -> Any:
        schema = getattr(self._conn, "schema", DEFAULT_SCHEMA)
        return super()._convert_query(render(query, schema, self._conn), params)
