"""Map version 1 and each shard's ownership, as `shardq migrate` records them
(docs/design/growing.md, build step 1), and `shardq.bucket()`."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.types.json import Jsonb

from shardq.shards.config import ShardMap
from shardq.shards.errors import MapMismatch, ShardUnavailable
from shardq.shards.migrations import migrate
from shardq.shards.routing import BUCKETS, bucket_of, new_execution_id
from shardq.shards.schema_files import load_schema

from ..schema_picture import describe
from ..support import ROOT, rows, schema_before, wait_until

Fresh = Callable[[int], list[str]]
SECRET = "s3cret-pw"


def _with_password(url: str, *, in_query: bool = False) -> str:
    """`url` carrying SECRET (the servers the suite runs on trust their clients,
    so any password connects)."""
    parts = urlsplit(url)
    if in_query:
        joiner = "&" if parts.query else ""
        return parts._replace(query=f"{parts.query}{joiner}password={SECRET}").geturl()
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0] if at else "postgres"
    return parts._replace(netloc=f"{user}:{SECRET}@{hosts}").geturl()


def _recorded(url: str) -> dict[str, Any]:
    """What one shard records of map versions and its ownership."""
    ((maps,),) = rows(url, "SELECT jsonb_agg(jsonb_build_object('version', version, "
                      "'layout', layout) ORDER BY version) FROM shardq.shard_maps")
    ((ownership,),) = rows(
        url, "SELECT jsonb_build_object('deployment', deployment, 'map_version', map_version, "
        "'owned', owned::text, 'writable', writable::text, 'unclean', unclean, "
        "'fence', ARRAY[fence_move::text, fence_target]) FROM shardq.ownership")
    return {"maps": maps, "ownership": ownership}


def test_bucket_in_sql_is_bucket_of(migrated_map: ShardMap) -> None:
    chance = random.Random(20261204)
    ids = [new_execution_id(chance.randrange(BUCKETS), now_ms=chance.getrandbits(48))
           for _ in range(10_000)]
    ids += [new_execution_id(edge, now_ms=ms) for edge in (0, BUCKETS - 1)
            for ms in (0, (1 << 48) - 1)]
    # The design's example: the bucket bits of ...-8abc-... are 0xabc.
    ids.append(uuid.UUID("01890000-0000-8abc-8000-000000000000"))
    url = migrated_map.shards[0].url
    found = rows(url, "SELECT shardq.bucket(i) FROM unnest(%s::uuid[]) WITH ORDINALITY "
                 "AS u(i, n) ORDER BY n", ids)
    assert [b for (b,) in found] == [bucket_of(i) for i in ids]
    assert [b for (b,) in found[-5:]] == [0, 0, 4095, 4095, 2748]
    # An index will be built on it (build step 6): that needs IMMUTABLE.
    assert rows(url, "SELECT provolatile, proparallel FROM pg_proc "
                "WHERE oid = 'shardq.bucket(uuid)'::regprocedure") == [("i", "s")]


def test_migrate_records_version_1_and_each_shards_buckets(fresh_databases: Fresh) -> None:
    plain = fresh_databases(3)
    urls = [_with_password(plain[0]), _with_password(plain[1], in_query=True), plain[2]]
    shard_map = ShardMap.from_urls(urls)
    migrate(shard_map)

    recorded = [_recorded(url) for url in plain]
    layout = {
        "buckets": BUCKETS,
        "home": "shard-0",
        "shards": [{"name": "shard-0", "url": plain[0]},
                   {"name": "shard-1", "url": plain[1]},
                   {"name": "shard-2", "url": plain[2]}],
        "ranges": [[0, 1364, "shard-0"], [1365, 2729, "shard-1"], [2730, 4095, "shard-2"]],
    }
    assert [r["maps"] for r in recorded] == [[{"version": 1, "layout": layout}]] * 3
    deployments = {r["ownership"]["deployment"] for r in recorded}
    assert len(deployments) == 1 and uuid.UUID(deployments.pop()).version == 4
    for r in recorded:
        assert SECRET not in str(r)
    with psycopg.connect(plain[0]) as conn:
        # shard_identity is the record of version 1 before map versions: no URLs either.
        stored = conn.execute("SELECT layout::text FROM shardq.shard_identity "
                              "UNION ALL SELECT layout::text FROM shardq.shard_maps").fetchall()
    assert stored and all(SECRET not in text for (text,) in stored)

    for shard, url, r in zip(shard_map.shards, plain, recorded, strict=True):
        first, last = shard.first_bucket, shard.last_bucket
        own = r["ownership"]
        assert (own["map_version"], own["unclean"], own["fence"]) == (1, False, [None, None])
        assert own["writable"] == own["owned"]
        bits = own["owned"]
        assert bits.count("1") == last - first + 1
        assert bits[first] == bits[last] == "1"
        assert first == 0 or bits[first - 1] == "0"
        assert last == BUCKETS - 1 or bits[last + 1] == "0"
        # The same bits as PostgreSQL's own bit functions read them.
        assert rows(url, "SELECT bit_count(owned), get_bit(owned, %s), get_bit(owned, %s) "
                    "FROM shardq.ownership", first, last) == [(last - first + 1, 1, 1)]

    # Every bucket is owned by exactly one shard.
    owners = [sum(r["ownership"]["owned"][b] == "1" for r in recorded) for b in range(BUCKETS)]
    assert set(owners) == {1}

    migrate(shard_map)
    assert [_recorded(url) for url in plain] == recorded


def test_a_shard_of_another_deployment_is_refused(fresh_databases: Fresh) -> None:
    a, b, c, d = fresh_databases(4)
    migrate(ShardMap.from_urls([a, b]))
    migrate(ShardMap.from_urls([c, d]))
    before = [_recorded(url) for url in (a, d)]
    # Same names and ranges, so the recorded layouts agree: only the deployment tells
    # that shard-1 is another deployment's.
    mixed = ShardMap.from_urls([a, d])
    with pytest.raises(MapMismatch, match=r"^shard-1 \(postgresql://.*\): shard map mismatch: "
                       r"it belongs to deployment [0-9a-f-]{36}, shard-0 \(.*\) to "
                       r"[0-9a-f-]{36}$"):
        migrate(mixed)
    # Refused before anything was written, even with shard-0 migrated alone.
    with pytest.raises(MapMismatch, match=r"^shard-1 "):
        migrate(mixed, shards=[mixed.shards[0]])
    assert [_recorded(url) for url in (a, d)] == before


def test_a_shard_migrated_alone_gives_its_deployment_to_the_others(
    fresh_databases: Fresh,
) -> None:
    urls = fresh_databases(2)
    shard_map = ShardMap.from_urls(urls)
    migrate(shard_map, shards=[shard_map.shards[1]])
    (alone,) = rows(urls[1], "SELECT deployment FROM shardq.ownership")
    migrate(shard_map)
    assert rows(urls[0], "SELECT deployment FROM shardq.ownership") == [alone]
    assert _recorded(urls[0])["maps"] == _recorded(urls[1])["maps"]


def test_a_deployment_from_before_map_versions_gets_version_1_from_its_record(
    fresh_databases: Fresh, tmp_path: Path
) -> None:
    plain = fresh_databases(2)
    before = schema_before(ROOT / "schema", tmp_path / "schema", 14, ["bucket", "fence"])
    urls = [_with_password(url) for url in plain]
    # Named and ranged by a file: version 1 must carry the recorded names, not shard-N.
    shard_map = ShardMap.from_document({"shards": [
        {"name": "eu", "url": urls[0], "buckets": [0, 99]},
        {"name": "us", "url": urls[1], "buckets": [100, 4095]},
    ]})
    migrate(shard_map, schema=load_schema(before))
    assert rows(plain[0], "SELECT to_regclass('shardq.ownership')") == [(None,)]

    results = migrate(shard_map)
    # finish_tasks and child_docs too: migrations 0020 and 0027 drop them (their
    # answers gained a column) and their files, applied here before the migrations,
    # create them again. Not claim_tasks: today's body, applied here already, has
    # arguments no migration's DROP names.
    assert [(r.applied[0], r.functions) for r in results] == [
        (14, ["bucket", "child_docs", "fence", "finish_tasks"])] * 2
    recorded = [_recorded(url) for url in plain]
    assert [r["maps"] for r in recorded] == [[{"version": 1, "layout": {
        "buckets": BUCKETS, "home": "eu",
        "shards": [{"name": "eu", "url": plain[0]}, {"name": "us", "url": plain[1]}],
        "ranges": [[0, 99, "eu"], [100, 4095, "us"]],
    }}]] * 2
    assert recorded[0]["ownership"]["deployment"] == recorded[1]["ownership"]["deployment"]
    assert [r["ownership"]["owned"].count("1") for r in recorded] == [100, 3996]
    assert describe(plain[0]) == (ROOT / "schema" / "current.sql").read_text()


# -- processes follow newer versions (growing, build step 4) -----------------------

MOVED = (100, 199)
"""Buckets version 2 hands from shard-0 to shard-1 (by hand here; by a move later)."""


def _version_2_by_hand(urls: list[str]) -> dict[str, Any]:
    """Version 2: MOVED goes from shard-0 to shard-1, in the ownership rows and in a
    shard_maps row on both shards (no run lives in those buckets)."""
    ((v1,),) = rows(urls[0], "SELECT layout FROM shardq.shard_maps WHERE version = 1")
    first, last = MOVED
    layout = {**v1, "ranges": [[0, first - 1, "shard-0"], [first, last, "shard-1"],
                               [last + 1, 2047, "shard-0"], [2048, 4095, "shard-1"]]}
    mask = "0" * first + "1" * (last - first + 1) + "0" * (BUCKETS - 1 - last)
    for url, change in ((urls[0], "owned & ~%(mask)s::bit(4096)"),
                        (urls[1], "owned | %(mask)s::bit(4096)")):
        with psycopg.connect(url) as conn:
            conn.execute("INSERT INTO shardq.shard_maps (version, layout) VALUES (2, %(l)s)",
                         {"l": Jsonb(layout)})
            conn.execute(f"UPDATE shardq.ownership SET map_version = 2, owned = {change}, "
                         f"writable = {change}", {"mask": mask})
    return layout


def _fencing_store() -> type:
    """A Store whose starts ask the shard's fence first, as every write path does once
    the fence is wired into them (store/store.py): a start routed by an older map is
    refused by the shard's own ownership row."""
    from shardq.shards.config import Shard
    from shardq.shards.errors import refusal
    from shardq.store.params import StartBatch
    from shardq.store.store import Store

    class FencingStore(Store):
        def start_executions(self, shard: Shard, batch: StartBatch) -> Any:
            with self.pools.connection(shard) as conn:
                try:
                    conn.execute("SELECT shardq.fence(%s::uuid[])",
                                 [[r.execution_id for r in batch.runs]])
                except psycopg.Error as exc:
                    moved = refusal(shard.name, exc.sqlstate, exc.diag.message_primary or "",
                                    exc.diag.message_detail)
                    if moved is None:
                        raise
                    raise moved from exc
            return super().start_executions(shard, batch)

    return FencingStore


def test_a_client_holding_version_1_follows_version_2_after_a_refusal(
    fresh_databases: Fresh,
) -> None:
    from shardq.client.client import Client
    from shardq.shards.pools import ShardPools
    from shardq.shards.routing import bucket_for

    from ..app import registry

    urls = fresh_databases(2)
    seeds = ShardMap.from_urls(urls)
    migrate(seeds)
    with ShardPools(seeds, follow_every_s=0) as pools:
        client = Client(_fencing_store()(pools), registry)
        assert client.map.version == 1
        _version_2_by_hand(urls)
        key = next(k for k in (f"moved-{i}" for i in range(100_000))
                   if MOVED[0] <= bucket_for("default", "checkout", k) <= MOVED[1])
        assert client.map.for_bucket(bucket_for("default", "checkout", key)).name == "shard-0"
        started = client.start("checkout", key, {"items": []})
        assert client.map.version == 2
        # Stored once, on the owner version 2 names; nothing on the shard that refused.
        assert rows(urls[1], "SELECT id FROM shardq.executions") == [(started.execution_id,)]
        assert rows(urls[0], "SELECT count(*) FROM shardq.executions") == [(0,)]
        assert client.get(started.execution_id).workflow_id == key


def test_a_process_started_from_version_1_seeds_routes_by_the_newest_version(
    fresh_databases: Fresh,
) -> None:
    from shardq.client.client import Client
    from shardq.shards.pools import ShardPools

    from ..app import registry

    urls = fresh_databases(2)
    seeds = ShardMap.from_urls(urls)
    migrate(seeds)
    layout = _version_2_by_hand(urls)
    with Client.connect(seeds, registry) as client:
        assert client.map.version == 2
        assert client.map.layout()["ranges"] == layout["ranges"]
        assert client.map.for_bucket(MOVED[0]).name == "shard-1"
        assert client.map.deployment is not None
    # A daemon's pools given no statuses read the newest version by their first poll.
    with ShardPools(seeds, follow_every_s=60) as pools:
        wait_until(lambda: pools.map.version == 2, what="the first poll")
        assert pools.map.for_bucket(MOVED[1]).name == "shard-1"
    # A seed whose version 1 differs from the configuration is still refused (exit 4).
    swapped = ShardMap.from_urls(list(reversed(urls)))
    with pytest.raises(MapMismatch, match="recorded as shard-1, this map calls it shard-0"):
        Client.connect(swapped, registry)


def test_pools_open_a_shard_a_version_adds_and_close_one_it_drops(
    fresh_databases: Fresh,
) -> None:
    from shardq.client.client import Client
    from shardq.shards.pools import ShardPools
    from shardq.shards.versions import add_shard, remove_shard
    from shardq.store.store import Store
    from shardq.workflow.registry import Registry

    urls = fresh_databases(3)
    seeds = ShardMap.from_urls(urls[:2])
    migrate(seeds)
    with ShardPools(seeds, follow_every_s=0) as pools:
        assert pools.map.version == 1
        # Tenants' weights are the same on every shard: a new one takes the home's.
        Client(Store(pools), Registry()).set_tenant_weight("acme", 4)
        add_shard(seeds, "shard-2", urls[2])
        assert rows(urls[2], "SELECT tenant, weight FROM shardq.tenant_weights") == [
            ("acme", 4)]
        # Read from a shard of the current map: the new shard's pool is made on first use.
        assert pools.refresh(at_least=2, via="shard-0").version == 2
        added = pools.map.named(["shard-2"])[0]
        assert added.ranges == () and added.url == urls[2]
        with pools.connection(added) as conn:
            assert conn.execute("SELECT current_database() AS db").fetchone() == {
                "db": urlsplit(urls[2]).path.lstrip("/")}
            remove_shard(seeds, "shard-2")
            pools.refresh()
            assert pools.map.version == 3 and pools.map.get("shard-2") is None
            # Still lent out: the pool stays until its last connection comes back.
            assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        with (pytest.raises(ShardUnavailable, match="not in the shard map any more"),
              pools.connection(added)):
            pass
