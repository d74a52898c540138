"""The shard map as versioned ranges: layout documents both ways, what a layout may not
say, routing by ranges, and the retry policy for requests a move refused."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from shardq.shards.config import ShardMap
from shardq.shards.errors import ConfigError, Fenced, NotOwner, ShardUnavailable
from shardq.shards.fanout import fan_out
from shardq.shards.follow import Rerouting, rerouted
from shardq.shards.routing import BUCKETS, new_execution_id

SEEDS = ShardMap.from_urls(["postgresql://app:pw@db1:5432/q", "postgresql://app:pw@db2/q"],
                           pool_min=2, pool_max=7)


def layout(ranges: list[Any], *, shards: list[dict[str, str]] | None = None,
           home: str = "shard-0") -> dict[str, Any]:
    return {"buckets": BUCKETS, "home": home, "ranges": ranges, "shards": shards or [
        {"name": "shard-0", "url": "postgresql://app@db1:5432/q"},
        {"name": "shard-1", "url": "postgresql://app@db2/q"},
        {"name": "shard-2", "url": "postgresql://app@db1:5432/other"},
    ]}


SPLIT = layout([[0, 99, "shard-0"], [100, 199, "shard-1"], [200, 2047, "shard-0"],
                [2048, 4095, "shard-1"]])


def test_a_configured_map_is_version_1_and_its_layout_is_what_migrate_records() -> None:
    assert SEEDS.version == 1 and SEEDS.home == "shard-0" and SEEDS.seeds is SEEDS
    assert SEEDS.layout() == {
        "buckets": BUCKETS, "home": "shard-0",
        "shards": [{"name": "shard-0", "url": "postgresql://app@db1:5432/q"},
                   {"name": "shard-1", "url": "postgresql://app@db2/q"}],
        "ranges": [[0, 2047, "shard-0"], [2048, 4095, "shard-1"]],
    }
    again = ShardMap.from_layout(SEEDS.layout(), 1, seeds=SEEDS)
    assert again == SEEDS
    # Version 1 read back has the configuration's fingerprint (shard_identity keeps it).
    assert again.fingerprint == SEEDS.fingerprint


def test_layout_round_trips_with_several_ranges_and_a_shard_with_none() -> None:
    version = ShardMap.from_layout(SPLIT, 7, seeds=SEEDS)
    assert version.version == 7 and version.seeds is SEEDS
    assert version.layout() == json.loads(json.dumps(SPLIT)) | {"ranges": SPLIT["ranges"]}
    assert ShardMap.from_layout(version.layout(), 7, seeds=SEEDS) == version
    zero, one, two = version.shards
    assert zero.ranges == ((0, 99), (200, 2047)) and zero.bucket_count == 1948
    assert one.ranges == ((100, 199), (2048, 4095))
    assert two.ranges == () and two.bucket_count == 0
    assert (two.first_bucket, two.last_bucket) == (-1, -1) and not two.owns(0)
    assert (zero.first_bucket, zero.last_bucket) == (0, 2047)
    assert zero.owns(99) and not zero.owns(100) and zero.owns(200)


def test_routing_follows_the_ranges() -> None:
    version = ShardMap.from_layout(SPLIT, 2, seeds=SEEDS)
    expected = {0: "shard-0", 99: "shard-0", 100: "shard-1", 199: "shard-1", 200: "shard-0",
                2047: "shard-0", 2048: "shard-1", 4095: "shard-1"}
    assert {b: version.for_bucket(b).name for b in expected} == expected
    assert version.for_execution(new_execution_id(150)).name == "shard-1"
    for bucket in range(BUCKETS):
        assert version.for_bucket(bucket).owns(bucket)
    with pytest.raises(ValueError, match="outside"):
        version.for_bucket(BUCKETS)


def test_shards_learned_from_a_map_take_the_seeds_credentials_and_pool_sizes() -> None:
    version = ShardMap.from_layout(SPLIT, 2, seeds=SEEDS)
    # A seed keeps its configured URL; a new database on a seed's host and port takes
    # that seed's user and password; the configuration's default pool sizes.
    assert version.shards[0].url == "postgresql://app:pw@db1:5432/q"
    assert version.shards[2].url == "postgresql://app:pw@db1:5432/other"
    assert [(s.pool_min, s.pool_max) for s in version.shards] == [(2, 7)] * 3
    elsewhere = copy.deepcopy(SPLIT)
    elsewhere["shards"][2]["url"] = "postgresql://db3/other"
    assert ShardMap.from_layout(elsewhere, 2, seeds=SEEDS).shards[2].url == (
        "postgresql://db3/other")
    # Stored again without the password it borrowed.
    assert "pw" not in json.dumps(ShardMap.from_layout(SPLIT, 2, seeds=SEEDS).layout())


def _bad(change: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(SPLIT)
    bad.update(change)
    return bad


@pytest.mark.parametrize(("document", "message"), [
    ("not a map", "the layout is not an object"),
    (_bad({"buckets": 1024}), "buckets must be 4096"),
    (_bad({"extra": 1}), "unknown key 'extra'"),
    (_bad({"ranges": [[0, 2047, "shard-0"], [2049, 4095, "shard-1"]]}), "bucket gap at 2048"),
    (_bad({"ranges": [[0, 2048, "shard-0"], [2048, 4095, "shard-1"]]}),
     "bucket overlap at 2049"),
    (_bad({"ranges": [[0, 2047, "shard-0"], [1000, 1100, "shard-2"], [2048, 4095, "shard-1"]]}),
     "bucket overlap at 2048"),
    (_bad({"ranges": [[0, 2047, "shard-0"], [2048, 4000, "shard-1"]]}),
     "buckets 4001..4095 belong to no shard"),
    (_bad({"ranges": [[0, 2047, "shard-0"], [2048, 4096, "shard-1"]]}), "within 0..4095"),
    (_bad({"ranges": [[-1, 2047, "shard-0"], [2048, 4095, "shard-1"]]}), "within 0..4095"),
    (_bad({"ranges": [[0, 2047, "shard-0"], [4095, 2048, "shard-1"]]}), "is empty"),
    (_bad({"ranges": [[0, 2047, "shard-0"], [2048, 4095, "nobody"]]}), "names no shard"),
    (_bad({"ranges": [[0, True, "shard-0"], [2, 4095, "shard-1"]]}), "is not [first, last"),
    (_bad({"ranges": [[0, 4095]]}), "is not [first, last"),
    (_bad({"ranges": []}), "buckets 0..4095 belong to no shard"),
    (_bad({"ranges": "0-4095"}), "ranges must be a list"),
    (_bad({"shards": []}), "non-empty list of shards"),
    (_bad({"shards": [{"name": "shard-0"}]}), "shard entry 0 must be"),
    (_bad({"home": "shard-9"}), "home 'shard-9' is not one of its shards"),
    (_bad({"shards": [{"name": "shard-0", "url": "postgresql://db1/q"},
                      {"name": "shard-1", "url": "postgresql://db1:5432/q"}]}),
     "duplicate shard URL"),
    (_bad({"shards": [{"name": "shard-0", "url": "postgresql://db1/q"},
                      {"name": "shard-1", "url": "mysql://db2/q"}]}), "not a PostgreSQL URL"),
])
def test_a_layout_that_does_not_cover_every_bucket_once_is_refused(
    document: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"{message}".replace("[", r"\[")):
        ShardMap.from_layout(document, 3, seeds=SEEDS)


# -- the retry policy --------------------------------------------------------------


class FakeRouter:
    """A router whose versions are given up front; refresh moves to the newest."""

    def __init__(self, *versions: ShardMap) -> None:
        self.versions = list(versions)
        self.map = self.versions.pop(0)
        self.refreshes: list[tuple[int, object]] = []

    def refresh(self, at_least: int = 0, via: object = None) -> ShardMap:
        self.refreshes.append((at_least, via))
        if self.versions:
            self.map = self.versions.pop(0)
        return self.map


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 3))
        self.now += seconds


V2 = ShardMap.from_layout(SPLIT, 2, seeds=SEEDS)


def _fenced(version: int = 1, target: str | None = "shard-1") -> Fenced:
    return Fenced("frozen", shard="shard-0", bucket=150, map_version=version, move=4,
                  target=target)


def test_not_owner_refreshes_from_the_refusing_shard_and_retries_at_once() -> None:
    router, clock = FakeRouter(SEEDS, V2), Clock()
    retry = Rerouting(router, budget_s=10, sleep=clock.sleep, clock=lambda: clock.now)
    routed: list[str] = []

    def call(shard_map: ShardMap) -> str:
        shard = shard_map.for_bucket(150).name
        routed.append(shard)
        if shard == "shard-0":
            raise NotOwner("moved", shard="shard-0", bucket=150, map_version=2)
        return "done"

    assert rerouted(router, call, rerouting=retry) == "done"
    assert routed == ["shard-0", "shard-1"]
    assert router.refreshes == [(2, "shard-0")] and clock.slept == []


def test_fenced_backs_off_doubling_to_200_ms_then_gives_up_naming_the_move() -> None:
    router, clock = FakeRouter(SEEDS), Clock()
    retry = Rerouting(router, budget_s=1.0, sleep=clock.sleep, clock=lambda: clock.now)

    def call(shard_map: ShardMap) -> str:
        raise _fenced()

    with pytest.raises(ShardUnavailable, match=r"^shard-0: bucket 150 is frozen by move 4 to "
                       r"shard-1 after 1\.\d s of retries \(SHARDQ_MOVE_RETRY_S=1\)"):
        rerouted(router, call, rerouting=retry)
    assert clock.slept[:5] == [0.02, 0.04, 0.08, 0.16, 0.2]
    assert set(clock.slept[5:-1]) == {0.2}
    # From the second refusal on, the move's target is asked for a newer version.
    assert ("shard-1" in {via for _, via in router.refreshes})


def test_fenced_naming_a_newer_version_refreshes_first() -> None:
    router, clock = FakeRouter(SEEDS, V2), Clock()
    retry = Rerouting(router, budget_s=10, sleep=clock.sleep, clock=lambda: clock.now)
    calls = iter([_fenced(version=2)])

    def call(shard_map: ShardMap) -> int:
        refusal = next(calls, None)
        if refusal is not None:
            raise refusal
        return shard_map.version

    assert rerouted(router, call, rerouting=retry) == 2
    assert router.refreshes[0] == (2, "shard-0") and clock.slept == [0.02]


def test_fan_out_retries_only_the_refused_shards_items() -> None:
    router = FakeRouter(SEEDS, V2)
    items = [0, 150, 3000, 160, 10]
    calls: list[tuple[str, list[int]]] = []

    def call(shard: Any, members: list[int]) -> list[str]:
        calls.append((shard.name, members))
        if router.map.version == 1 and shard.name == "shard-0":
            raise NotOwner("moved", shard="shard-0", bucket=150, map_version=2)
        return [f"{shard.name}:{m}" for m in members]

    assert fan_out(router, items, lambda b: b, call) == [
        "shard-0:0", "shard-1:150", "shard-1:3000", "shard-1:160", "shard-0:10"]
    assert calls == [("shard-0", [0, 150, 160, 10]), ("shard-1", [3000]),
                     ("shard-0", [0, 10]), ("shard-1", [150, 160])]


def test_fan_out_by_a_plain_map_raises_the_refusal() -> None:
    def call(shard: Any, members: list[int]) -> list[int]:
        raise NotOwner("moved", shard=shard.name, bucket=members[0], map_version=2)

    with pytest.raises(NotOwner):
        fan_out(SEEDS, [1], lambda b: b, call)
