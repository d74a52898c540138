"""A client refuses shards migrated with another shard map."""

from __future__ import annotations

import pytest

from shardq.shards.config import ShardMap


def test_client_refuses_a_map_the_shards_were_not_migrated_with(shard_map: ShardMap) -> None:
    from shardq.client.client import Client
    from shardq.shards.errors import MapMismatch

    from ..app import registry

    swapped = ShardMap.from_urls([s.url for s in reversed(shard_map.shards)])
    with pytest.raises(MapMismatch, match="recorded as shard-1, this map calls it shard-0"):
        Client.connect(swapped, registry)
