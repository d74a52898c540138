"""What the parts of `Store` kept in modules of their own (flow.py, schedules.py,
builds.py) call of the Store they are mixed into: its connections and its map."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardq.shards.config import Shard, ShardMap
    from shardq.shards.connections import DictConnection


class StorePart:
    """A part of `Store`; Store provides these."""

    def connection(self, shard: Shard) -> AbstractContextManager[DictConnection]:
        raise NotImplementedError

    def transaction(self, shard: Shard, *,
                    timeout_s: float | None = None) -> AbstractContextManager[DictConnection]:
        raise NotImplementedError

    @property
    def map(self) -> ShardMap:
        raise NotImplementedError
