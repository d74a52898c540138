"""The store's flow-control operations (docs/flow-control.md): concurrency limits per
key, tenants' weights in fair claims, and rate limiters (on the home shard). A part
of `Store`, kept apart so that the store's core (runs, claims, commits, signals)
stays one readable module."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardq.store import statements
from shardq.store.parts import StorePart

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping

    from shardq.core.flow import ConcurrencyLimit, RateLimit, RateLimiter, RateWait
    from shardq.shards.config import Shard


class FlowControlStore(StorePart):
    """Store's flow-control methods (store/parts.py)."""

    def concurrency_limit(self, shard: Shard, key: str) -> ConcurrencyLimit | None:
        """A concurrency key as its shard holds it; None when no start declared it."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.concurrency_limit(key))

    def set_concurrency_limit(self, shard: Shard, key: str,
                              override: int | None) -> ConcurrencyLimit | None:
        """An operator's limit for `key` (None: back to the declared one)."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.set_concurrency_limit(key, override))

    def busiest_keys(self, shard: Shard, limit: int) -> list[ConcurrencyLimit]:
        """The shard's keys with the most runs waiting for a slot, most first."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.busiest_keys(self.map, shard, limit))

    def tenant_weights(self, shard: Shard) -> dict[str, int]:
        """The weights an operator gave tenants on `shard` (others weigh 1)."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.tenant_weights())

    def set_tenant_weight(self, shard: Shard, tenant: str, weight: int | None) -> None:
        """Give `tenant` a weight on `shard`, or 1 again (None)."""
        with self.connection(shard) as conn:
            statements.run(conn, statements.set_tenant_weight(tenant, weight))

    def take_rate_slot(self, shard: Shard, limiter: str, *, run: uuid.UUID, position: int,
                       attempt: int, park_after: float) -> float | None:
        """Seconds until a step's call may start under `limiter` (asked of the home
        shard); None when the shard holds no such limiter yet."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.take_rate_slot(
                limiter, run, position, attempt, park_after))

    def declare_rate_limiters(self, shard: Shard, limits: Mapping[str, RateLimit]) -> None:
        """Write the limiters workflow code declares to `shard` (the home shard)."""
        if limits:
            with self.connection(shard) as conn:
                statements.run(conn, statements.declare_rate_limiters(limits))

    def rate_limiters(self, shard: Shard, name: str | None = None) -> list[RateLimiter]:
        """The limiters `shard` (the home shard) holds, or the one called `name`."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.rate_limiters(name))

    def set_rate_limit(self, shard: Shard, name: str,
                       limit: RateLimit | None) -> RateLimiter | None:
        """An operator's numbers for limiter `name` (None: the declared ones again)."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.set_rate_limit(name, limit))

    def rate_wait_of(self, shard: Shard, execution_id: uuid.UUID) -> RateWait | None:
        """The slot of a rate limiter run `execution_id` is parked for (the home shard)."""
        with self.connection(shard) as conn:
            return statements.run(conn, statements.rate_wait_of(execution_id))
