"""`shardq serve`'s application, built in one process or in each of several.

With `--workers N` (N > 1) uvicorn runs N processes that share the listening
socket; each builds its own application here, with its own pools, from the
configuration the parent checked and left in the environment
(SHARDQ_SERVE_CONFIG). Requests are served on the event loop by an AsyncClient,
with no thread hop; one process is one core, so processes are the way to more
requests per second.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette

from shardq.bin.loading import load_registry, shard_map_of
from shardq.bin.web.tokens import load_tokens
from shardq.shards.config import ShardMap

if TYPE_CHECKING:
    from shardq.shards.check import ShardStatus

ENV_CONFIG = "SHARDQ_SERVE_CONFIG"


@dataclass(frozen=True)
class ServeConfig:
    app: str | None
    tokens_file: str
    shards: str | None
    """The `--shards` URLs, when given."""
    shards_file: str | None
    inbox_stale_after: float

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> ServeConfig:
        return cls(**json.loads(os.environ[ENV_CONFIG]))

    def shard_map(self) -> ShardMap:
        return shard_map_of(self.shards, Path(self.shards_file) if self.shards_file else None)


def checked(config: ServeConfig) -> tuple[Any, list[tuple[str, str]], ShardMap,
                                         list[ShardStatus]]:
    """(registry, tokens, shard map, each shard's status) of `config`, every shard
    verified; raises the errors the command reports in one line (ConfigError,
    MapMismatch, ...)."""
    from shardq.shards.check import verify_shards

    registry = load_registry(config.app)
    tokens = load_tokens(Path(config.tokens_file))
    shard_map = config.shard_map()
    return registry, tokens, shard_map, verify_shards(shard_map)


def build_app(config: ServeConfig) -> Starlette:
    """The application with its own pools, opened on the server's event loop when it
    starts and closed when it stops."""
    from shardq.bin.web.app import create_app
    from shardq.client.async_client import AsyncClient
    from shardq.shards.async_pools import AsyncShardPools
    from shardq.shards.follow import map_poll_interval
    from shardq.store.async_store import AsyncStore

    registry, tokens, shard_map, statuses = checked(config)
    # A shard that refuses connections fails a request at once (the inbox and
    # /interrupts then serve the other shards) instead of after a pool timeout.
    # A request answers within a bound: a statement stuck behind a lock or on an
    # overloaded shard is cancelled by the server (the caller gets a 503). The map
    # is polled for newer versions, as a daemon's is.
    pools = AsyncShardPools(shard_map, verified=statuses, application_name="shardq-api",
                            statement_timeout_s=15,
                            follow_every_s=map_poll_interval())
    client = AsyncClient(AsyncStore(pools), registry)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        pools.open()
        try:
            yield
        finally:
            await pools.close()

    return create_app(client, tokens, inbox_stale_after=config.inbox_stale_after,
                      lifespan=lifespan)


def app_from_environment() -> Starlette:
    """uvicorn's factory in each worker process (`--workers N`)."""
    return build_app(ServeConfig.from_env())
