"""Shards as schemas (shards/layout.py): what a shard URL's schema= does to the URL libpq
sees, and to the statements a connection lent for that shard runs."""

from __future__ import annotations

import pytest
from psycopg import sql

from shardq.shards.config import ShardMap
from shardq.shards.layout import DEFAULT_SCHEMA, render, split_schema
from shardq.shards.sqlfile import load_queries


@pytest.mark.parametrize(("url", "conninfo", "schema"), [
    ("postgresql://h/db", "postgresql://h/db", DEFAULT_SCHEMA),
    ("postgresql://h/db?schema=s07", "postgresql://h/db", "s07"),
    ("postgresql://u@h:5433/db?sslmode=disable&schema=eu_1&connect_timeout=3",
     "postgresql://u@h:5433/db?sslmode=disable&connect_timeout=3", "eu_1"),
    # A Unix socket's URL keeps its // (libpq refuses postgresql:/db).
    ("postgresql:///db?host=/run/postgresql&schema=s1",
     "postgresql:///db?host=/run/postgresql", "s1"),
    ("postgresql://h/db?application_name=a%26b&schema=s1",
     "postgresql://h/db?application_name=a%26b", "s1"),
])
def test_a_shard_url_splits_into_what_libpq_sees_and_a_schema(
    url: str, conninfo: str, schema: str,
) -> None:
    assert split_schema(url) == (conninfo, schema)
    shard = ShardMap.from_urls([url]).shards[0]
    assert (shard.conninfo, shard.schema, shard.url) == (conninfo, schema, url)


def test_shards_of_one_database_in_other_schemas_are_distinct_shards() -> None:
    shard_map = ShardMap.from_urls([f"postgresql://h/db?schema=s{i}" for i in range(4)])
    assert {s.conninfo for s in shard_map.shards} == {"postgresql://h/db"}
    assert [s.schema for s in shard_map.shards] == ["s0", "s1", "s2", "s3"]


def test_statements_name_the_shards_schema_and_nothing_else() -> None:
    query = ("SELECT pg_notify(shardq.wake_channel(), 'shardq:run:x'), "
             "current_setting('shardq.slots_counted', true), pg_notify('shardq_map', '1') "
             "FROM shardq.executions e JOIN myshardq.other o ON true")
    assert render(query, DEFAULT_SCHEMA, None) is query
    assert render(query, "s07", None) == (
        "SELECT pg_notify(s07.wake_channel(), 'shardq:run:x'), "
        "current_setting('s07.slots_counted', true), pg_notify('shardq_map', '1') "
        "FROM s07.executions e JOIN myshardq.other o ON true")


def test_every_shipped_statement_renders_to_name_no_default_schema() -> None:
    """A statement that named the schema another way (`'shardq'::regnamespace`, `SCHEMA
    shardq`) would reach the default schema from a shard in another one."""
    for package in ("store", "outbox", "moves", "shards"):
        for name, query in load_queries(f"shardq.{package}", "queries.sql").items():
            rendered = str(render(query, "s07", None))
            assert "'shardq'" not in rendered and "SCHEMA shardq" not in rendered, name
            assert "shardq." not in rendered, name


def test_composed_statements_render_too() -> None:
    query = sql.SQL("SELECT {} FROM shardq.executions").format(sql.Identifier("id"))
    assert render(query, "s07", None) == 'SELECT "id" FROM s07.executions'
