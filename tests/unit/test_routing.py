"""Routing: stable buckets across processes, even spread, ids that route themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from shardq.shards.config import ShardMap
from shardq.shards.routing import (
    BUCKETS,
    InvalidExecutionId,
    bucket_for,
    bucket_of,
    new_execution_id,
)

from ..support import ROOT

URLS = [f"postgresql://u@db{i}.example/shardq" for i in range(4)]
KEYS = [("acme", "checkout", f"order-{i}") for i in range(2000)]

_CHILD = """
import json, sys
from shardq.shards.config import ShardMap
from shardq.shards.routing import bucket_for
keys = json.loads(sys.stdin.read())
m = ShardMap.from_urls(%r)
print(json.dumps([[bucket_for(*k), m.for_bucket(bucket_for(*k)).name] for k in keys]))
"""


def _route_in_child(hash_seed: str) -> list[list[object]]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD % (URLS,)],
        input=json.dumps(KEYS), capture_output=True, text=True, check=True, env=env, cwd=ROOT,
    )
    return list(json.loads(out.stdout))


def test_same_key_routes_to_same_shard_in_every_process() -> None:
    shard_map = ShardMap.from_urls(URLS)
    here = [[bucket_for(*k), shard_map.for_bucket(bucket_for(*k)).name] for k in KEYS]
    assert _route_in_child("1") == here
    assert _route_in_child("4242") == here


def test_known_key_has_a_pinned_bucket() -> None:
    # Pinned so a change to the hash (which would re-route every live execution
    # on upgrade) fails loudly here instead of in production.
    assert bucket_for("acme", "checkout", "order-42") == 2595


def test_key_parts_are_not_ambiguous() -> None:
    assert bucket_for("a", "bc", "d") != bucket_for("ab", "c", "d")


def test_buckets_spread_evenly_over_shards() -> None:
    shard_map = ShardMap.from_urls(URLS)
    n = 100_000
    per_shard = Counter(
        shard_map.for_bucket(bucket_for("t", "wf", f"key-{i}")).name for i in range(n)
    )
    assert set(per_shard) == {s.name for s in shard_map.shards}
    for count in per_shard.values():
        assert abs(count - n / 4) < n / 4 * 0.03, per_shard
    buckets = Counter(bucket_for("t", "wf", f"key-{i}") for i in range(n))
    assert len(buckets) == BUCKETS


def test_equal_ranges_cover_every_bucket_once() -> None:
    shard_map = ShardMap.from_urls(URLS[:3])
    assert [(s.first_bucket, s.last_bucket) for s in shard_map.shards] == [
        (0, 1364), (1365, 2729), (2730, 4095)
    ]
    owners = Counter(shard_map.for_bucket(b).name for b in range(BUCKETS))
    assert sum(owners.values()) == BUCKETS


def test_execution_id_carries_its_bucket() -> None:
    shard_map = ShardMap.from_urls(URLS)
    for bucket in (0, 1, 1023, 1024, 2048, BUCKETS - 1):
        execution_id = new_execution_id(bucket)
        assert bucket_of(execution_id) == bucket
        assert bucket_of(str(execution_id)) == bucket
        assert shard_map.for_execution(str(execution_id)) == shard_map.for_bucket(bucket)
        assert execution_id.version == 8


def test_execution_ids_are_time_ordered_and_unique() -> None:
    ids = [new_execution_id(7, now_ms=1_700_000_000_000 + i) for i in range(1000)]
    assert ids == sorted(ids)
    assert len({new_execution_id(7) for _ in range(10_000)}) == 10_000


# A version-4 UUID, fixed: xdist workers must collect the same parameters.
@pytest.mark.parametrize("bad", ["", "order-42", "f32bbc42-04c8-4541-a061-b4dc456dd7e5",
                                 "0" * 32 + "0"])
def test_foreign_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidExecutionId):
        bucket_of(bad)


def test_bucket_outside_space_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        new_execution_id(BUCKETS)
