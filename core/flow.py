"""The values of flow control (docs/flow-control.md) that cross the store seam: rate
limiters, tenants' weights, concurrency keys. Re-exported by core/models.py, where
callers find them with every other value."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class RateLimit:
    """A rate limiter's numbers (docs/flow-control.md): `rate` steps start per `per`
    seconds, evenly spaced, `burst` of them at once after a quiet spell."""

    rate: int
    per: float = 1.0
    burst: int = 1


@dataclass(frozen=True)
class RateLimiter:
    """A rate limiter as the home shard holds it."""

    name: str
    declared: RateLimit
    """As the workflow code declares it."""
    override: RateLimit | None
    """An operator's (`shardq rates set`), which wins until reset."""
    waiting: int
    """Steps parked for a slot of it."""
    backlog_s: float
    """How long a step asking for a slot now would wait."""

    @property
    def limit(self) -> RateLimit:
        """The numbers that apply."""
        return self.override or self.declared


@dataclass(frozen=True)
class RateWait:
    """A run parked for the slot a rate limiter gave one of its steps."""

    limiter: str
    until: datetime


@dataclass(frozen=True)
class TenantWeights:
    """Tenants' weights in fair claims (docs/flow-control.md), as every shard holds them."""

    weights: dict[str, int]
    """Each weighted tenant's weight, where every shard agrees (any other weighs 1)."""
    differing: dict[str, dict[str, int]]
    """Tenants whose weight differs between shards (a `set` that reached only some):
    tenant -> shard -> weight, a shard without the tenant weighing 1."""


@dataclass(frozen=True)
class ConcurrencyLimit:
    """A concurrency key as its shard holds it (docs/flow-control.md)."""

    key: str
    declared: int
    """The limit its latest start declared."""
    override: int | None
    """An operator's limit (`shardq limits set`), which wins over the declared one."""
    running: int
    """Runs holding a slot: due, running, retrying or in a timer."""
    waiting: int
    """Runs due but waiting for a slot."""

    @property
    def limit(self) -> int:
        return self.declared if self.override is None else self.override
