"""Shard map configuration: what is accepted, and the one-line errors for what is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq.shards.config import ShardMap, through_pooler, without_password
from shardq.shards.errors import ConfigError
from shardq.shards.servers import database_url


def test_env_map_splits_buckets_and_reads_pool_sizes() -> None:
    shard_map = ShardMap.from_env({
        "SHARDQ_SHARDS": "postgresql://a@h1/db, postgresql://a@h2/db",
        "SHARDQ_POOL_MIN": "2",
        "SHARDQ_POOL_MAX": "7",
    })
    assert [s.name for s in shard_map.shards] == ["shard-0", "shard-1"]
    assert [(s.pool_min, s.pool_max) for s in shard_map.shards] == [(2, 7), (2, 7)]
    assert shard_map.shards[1].url == "postgresql://a@h2/db"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "no shards configured"),
        ("mysql://h/db", "is not a PostgreSQL URL"),
        ("postgresql://h/db,,postgresql://h/db2", "empty entry"),
        ("postgresql://h:notaport/db", "malformed URL"),
        ("postgresql://h", "names no database"),
        ("postgresql://u@h/db,postgresql://u@h:5432/db", "duplicate shard URL"),
        # Shards as schemas (shards/layout.py): the schema is written into statements.
        ("postgresql://h/db?schema=a,postgresql://h/db?schema=a", "duplicate shard URL"),
        ("postgresql://h/db?schema=", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=Shard1", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=s1;drop%20table%20x", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=s-1", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=pg_temp", "not pg_"),
        ("postgresql://h/db?schema=information_schema", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=" + "s" * 64, "at most 63"),
        ("postgresql://h/db?schema=s%00", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=1s", "is not a lower-case identifier"),
        ("postgresql://h/db?schema=a&schema=b", "names schema= 2 times"),
    ],
)
def test_bad_env_maps_are_refused(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShardMap.from_env({"SHARDQ_SHARDS": value})


def test_password_never_appears_in_errors() -> None:
    with pytest.raises(ConfigError) as info:
        ShardMap.from_env({"SHARDQ_SHARDS": "postgresql://u:sekret@h/db,postgresql://u:sekret@h/db"})
    assert "sekret" not in str(info.value)
    assert "***" in str(info.value)


def test_toml_map_with_ranges_and_pool_overrides(tmp_path: Path) -> None:
    path = tmp_path / "shards.toml"
    path.write_text(
        """
[pool]
max_size = 4

[[shards]]
name = "eu"
url = "postgresql://a@h1/db"
buckets = [0, 999]

[[shards]]
name = "us"
url = "postgresql://a@h2/db"
buckets = [1000, 4095]
max_size = 9
"""
    )
    shard_map = ShardMap.from_toml(path)
    assert [(s.name, s.first_bucket, s.last_bucket, s.pool_max) for s in shard_map.shards] == [
        ("eu", 0, 999, 4), ("us", 1000, 4095, 9)
    ]
    assert shard_map.for_bucket(999).name == "eu"
    assert shard_map.for_bucket(1000).name == "us"


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([[0, 999], [1001, 4095]], "bucket gap at 1000"),
        ([[0, 1000], [1000, 4095]], "bucket overlap at 1001"),
        ([[0, 999], [1000, 4000]], "buckets 4001..4095 belong to no shard"),
        ([[0, 999], [1000, 5000]], "within 0..4095"),
    ],
)
def test_toml_bucket_ranges_must_cover_exactly(
    tmp_path: Path, ranges: list[list[int]], message: str
) -> None:
    body = "".join(
        f'[[shards]]\nurl = "postgresql://h{i}/db"\nbuckets = {r}\n\n' for i, r in enumerate(ranges)
    )
    path = tmp_path / "shards.toml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=message):
        ShardMap.from_toml(path)


def test_fingerprint_ignores_urls_but_not_layout() -> None:
    a = ShardMap.from_urls(["postgresql://h1/db", "postgresql://h2/db"])
    b = ShardMap.from_urls(["postgresql://other1/db", "postgresql://other2/db"])
    c = ShardMap.from_urls(["postgresql://h1/db", "postgresql://h2/db", "postgresql://h3/db"])
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint != c.fingerprint


def test_database_url_keeps_server_and_credentials() -> None:
    tcp = database_url("host=db1 port=6543 user=app password=p@ss dbname=postgres", "shard 1")
    assert tcp == "postgresql://app:p%40ss@db1:6543/shard%201"
    sock = database_url("postgresql://postgres@/postgres?host=/tmp/pg%20x&port=5999", "s0")
    assert sock == "postgresql://postgres@/s0?host=/tmp/pg%20x&port=5999"
    assert ShardMap.from_urls([tcp]).shards[0].url == tcp


@pytest.mark.parametrize(("url", "stored"), [
    ("postgresql://app:pw@db1:5433/shardq", "postgresql://app@db1:5433/shardq"),
    # An encoded '@' or ':' in the password, and hosts of a multi-host URL.
    ("postgresql://app:p%40w%3Ax@db1,db2/shardq?sslmode=require",
     "postgresql://app@db1,db2/shardq?sslmode=require"),
    # libpq takes a password from the query string too.
    ("postgresql://app@/shardq?host=/run/pg&password=pw&port=5433&sslpassword=k",
     "postgresql://app@/shardq?host=/run/pg&port=5433"),
    ("postgresql://app@db1/shardq?pass%77ord=pw", "postgresql://app@db1/shardq"),
    ("postgresql://db1/shardq", "postgresql://db1/shardq"),
    ("postgres://app@db1/shardq?application_name=x", "postgres://app@db1/shardq?application_name=x"),
])
def test_a_url_is_stored_without_its_password(url: str, stored: str) -> None:
    assert without_password(url) == stored


@pytest.mark.parametrize(("url", "pooled"), [
    ("postgresql://app:pw@db1:5432/shard0", "postgresql://app:pw@pgb:6432/shard0"),
    ("postgresql://app@db1/shard0?sslmode=require", "postgresql://app@pgb:6432/shard0?sslmode=require"),
    ("postgresql:///shard0?host=/run/postgresql&port=5433&user=app",
     "postgresql://pgb:6432/shard0?user=app"),
    ("postgresql://db1/shard0", "postgresql://pgb:6432/shard0"),
])
def test_a_pool_reaches_its_shard_through_the_pooler(url: str, pooled: str) -> None:
    assert through_pooler(url, "postgresql://pgb:6432") == pooled


def test_the_pooler_is_this_process_s_setting_from_env_or_file(tmp_path: Path) -> None:
    urls = "postgresql://a@h1/db,postgresql://a@h2/db"
    assert ShardMap.from_env({"SHARDQ_SHARDS": urls}).pooler is None
    found = ShardMap.from_env({"SHARDQ_SHARDS": urls, "SHARDQ_POOLER": "postgresql://p:6432"})
    assert found.pooler == "postgresql://p:6432"
    assert found == ShardMap.from_env({"SHARDQ_SHARDS": urls})  # not part of the map
    path = tmp_path / "shards.toml"
    path.write_text('[pool]\npooler = "postgresql://p:6432"\n[[shards]]\n'
                    'url = "postgresql://a@h1/db"\n')
    assert ShardMap.from_toml(path).pooler == "postgresql://p:6432"


@pytest.mark.parametrize(("pooler", "message"), [
    ("pgb:6432", "must be a postgresql://host:port URL"),
    ("postgresql://pgb:6432/shard0", "the pooler's address alone"),
    ("postgresql://app@pgb:6432", "the pooler's address alone"),
    ("postgresql://app:sekret@pgb:6432", "the pooler's address alone"),
    ("postgresql://pgb:notaport", "the pooler's address alone"),
    ("postgresql://pgb:6432?sslmode=require", "the pooler's address alone"),
    ("postgresql://", "the pooler's address alone"),
    ("mysql://pgb:6432", "the pooler's address alone"),
])
def test_a_bad_pooler_is_refused_in_one_line(pooler: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        ShardMap.from_env({"SHARDQ_SHARDS": "postgresql://a@h1/db", "SHARDQ_POOLER": pooler})
    assert "sekret" not in str(info.value) and "\n" not in str(info.value)
