"""Client calls that read and change flow control (docs/flow-control.md): concurrency
limits per key, tenants' weights in fair claims, and rate limiters (on the home shard).
A part of `Client`, kept apart so the client's core (start, signal, read) stays one
readable module."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from shardq.client.requests import busiest, limit_change
from shardq.core.errors import ConcurrencyKeyNotFound, InvalidArgument, RateLimiterNotFound
from shardq.core.flow import ConcurrencyLimit, RateLimit, RateLimiter, TenantWeights
from shardq.core.rules import (
    check_name,
    check_page_size,
    check_rate_limit,
    check_tenant_weight,
)
from shardq.shards.errors import ShardUnavailable
from shardq.shards.fanout import Reached, each_shard
from shardq.shards.routing import bucket_for_key
from shardq.store.listing import MAX_PAGE

if TYPE_CHECKING:
    from shardq.shards.config import ShardMap
    from shardq.store.store import Store

R = TypeVar("R")


class FlowControlCalls:
    """Client's flow-control methods; Client provides `store`, `map` and `_routed`."""

    store: Store

    @property
    def map(self) -> ShardMap:
        raise NotImplementedError

    def _routed(self, call: Callable[[ShardMap], R]) -> R:
        raise NotImplementedError

    def concurrency_limit(self, key: str) -> ConcurrencyLimit | None:
        """Key `key`'s limits, runs holding a slot and waiting; None when never declared."""
        checked, _ = limit_change(key, None)
        return self._routed(lambda m: self.store.concurrency_limit(
            m.for_bucket(bucket_for_key(checked)), checked))

    def set_concurrency_limit(self, key: str, limit: int | None) -> ConcurrencyLimit:
        """An operator's limit for `key`, over the declared one until reset (None); a higher
        one starts waiting runs at once (docs/flow-control.md)."""
        checked, override = limit_change(key, limit)
        found = self._routed(lambda m: self.store.set_concurrency_limit(
            m.for_bucket(bucket_for_key(checked)), checked, override))
        if found is None:
            raise ConcurrencyKeyNotFound(checked)
        return found

    def busiest_concurrency_keys(self, limit: int = 20) -> list[ConcurrencyLimit]:
        """The keys with the most runs waiting for a slot, most first, over every shard."""
        size = check_page_size(limit, MAX_PAGE)
        return busiest([self.store.busiest_keys(s, size) for s in self.map.shards], size)

    def rate_limiter(self, name: str) -> RateLimiter | None:
        """Rate limiter `name` as the home shard holds it; None when no worker declared it."""
        found = self.store.rate_limiters(self.map.home_shard, check_name(name, "rate limiter"))
        return found[0] if found else None

    def rate_limiters(self) -> list[RateLimiter]:
        """Every rate limiter workers have declared, by name."""
        return self.store.rate_limiters(self.map.home_shard)

    def set_rate_limit(self, name: str, limit: RateLimit | None) -> RateLimiter:
        """An operator's numbers for rate limiter `name`, over the declared ones until reset
        (None). Slots already given keep their times; the next ones follow `limit`."""
        checked, chosen = rate_change(name, limit)
        found = self.store.set_rate_limit(self.map.home_shard, checked, chosen)
        if found is None:
            raise RateLimiterNotFound(checked)
        return found

    def set_tenant_weight(self, tenant: str, weight: int | None) -> None:
        """Give `tenant` a weight in fair claims (1..1000), on every shard; None: back to 1.
        Takes effect at each shard's next claim. A shard that cannot be reached raises
        ShardUnavailable after the others are written: set it again."""
        checked, chosen = weight_change(tenant, weight)
        reached = each_shard(self.map.shards, lambda s: self.store.set_tenant_weight(
            s, checked, chosen))
        raise_unwritten(reached, f"the weight of tenant {checked}")

    def tenant_weights(self) -> TenantWeights:
        """Tenants' weights as every shard holds them (ShardUnavailable when one cannot be
        read: a weight is only known when every shard's is)."""
        reached = each_shard(self.map.shards, self.store.tenant_weights)
        raise_unwritten(reached, "")
        return agreed_weights({s.name: w for s, w in reached.answers.items()})


def rate_change(name: object, limit: object) -> tuple[str, RateLimit | None]:
    """An operator's rate change, checked: the limiter and its numbers (None: back to the
    declared ones)."""
    checked = check_name(name, "rate limiter")
    if limit is None:
        return checked, None
    if not isinstance(limit, RateLimit):
        raise InvalidArgument(f"a rate limit must be a RateLimit(rate, per, burst), got "
                              f"{limit!r}")
    return checked, check_rate_limit(limit.rate, limit.per, limit.burst)


def weight_change(tenant: object, weight: object) -> tuple[str, int | None]:
    """An operator's weight change, checked: the tenant and its weight (None: back to 1)."""
    return check_name(tenant, "tenant"), None if weight is None else check_tenant_weight(weight)


def raise_unwritten(reached: Reached[R], what: str) -> None:
    """ShardUnavailable naming the shards `reached` could not reach (and, when `what`
    was written, where it was); nothing when every shard answered."""
    if not reached.unavailable:
        return
    missed = ", ".join(reached.unavailable_names)
    causes = "; ".join(reached.causes)
    if not what:
        raise ShardUnavailable(f"could not read {missed} ({causes})")
    done = ", ".join(s.name for s in reached.answers) or "no shard"
    # A shard that did not answer may still apply the write when it wakes: unconfirmed,
    # not "not written".
    raise ShardUnavailable(f"{what} was written on {done} and not confirmed by {missed} "
                           f"({causes}): set it again when every shard answers")


def agreed_weights(per_shard: Mapping[str, Mapping[str, int]]) -> TenantWeights:
    """The shards' weights, split into those every shard agrees on and those it does not
    (a shard without a tenant's row weighs it 1)."""
    tenants: Sequence[str] = sorted({t for weights in per_shard.values() for t in weights})
    agreed: dict[str, int] = {}
    differing: dict[str, dict[str, int]] = {}
    for tenant in tenants:
        seen = {shard: weights.get(tenant, 1) for shard, weights in per_shard.items()}
        if len(set(seen.values())) == 1:
            agreed[tenant] = next(iter(seen.values()))
        else:
            differing[tenant] = seen
    return TenantWeights(agreed, differing)
