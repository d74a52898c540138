"""What every route shares, kept on the application by `create_app` (bin/web/app.py).

Handlers are plain module-level functions; they find the client, the tokens
and the settings of the application serving them through `shared(request)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from starlette.requests import Request

from shardq.client.async_client import AsyncClient
from shardq.client.coalesce import SignalCoalescer
from shardq.shards.config import ShardMap


@dataclass(frozen=True)
class Shared:
    client: AsyncClient
    signals: SignalCoalescer
    """Single signals (POST .../signal/{name}) to one shard share a commit under load."""
    tokens: list[tuple[str, str]]
    """(tenant, hashed token) pairs: bin/web/tokens.py."""
    inbox_stale_after: float
    """Seconds after which the inbox marks an open interrupt stale."""
    document: dict[str, Any]
    """The OpenAPI document served, naming the registered workflows."""

    @property
    def map(self) -> ShardMap:
        return self.client.map


def shared(request: Request) -> Shared:
    """The state of the application serving `request`."""
    return cast(Shared, request.app.state.shared)
