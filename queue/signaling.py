"""The one way a signal reaches a run: checked, grouped by shard, delivered, scattered back.

`Client.signal_many`, a workflow's `ctx.signal_external` and the outbox relay
all pass through here, so a signal has the same rules (name, payload bound, key)
and the same delivery (shardq.deliver_signals: stored, recorded, the run woken)
whoever sends it. Nothing here needs a workflow registry.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from shardq.queue.encoding import to_json
from shardq.queue.errors import InvalidArgument
from shardq.queue.limits import Limits
from shardq.queue.models import SignalResult
from shardq.queue.names import check_signal_name, check_text
from shardq.queue.store import Store
from shardq.shards.config import Shard, ShardMap

T = TypeVar("T")


@dataclass(frozen=True)
class CheckedSignal:
    """A signal whose name, payload and key passed the checks; ready to deliver."""

    target: uuid.UUID
    name: str
    payload_json: str
    idempotency_key: str | None
    origin: str | None = None
    """The outbox row a relayed signal is delivered under (see Store.deliver_signals)."""


def check_signal(
    name: str, payload: Any, key: str | None, limits: Limits
) -> tuple[str, str, str | None]:
    """(name, payload JSON, key) of a signal, checked as every entry point checks them."""
    check_signal_name(name)
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise InvalidArgument("idempotency_key must be a non-empty string when given")
    if key is not None:
        limits.check_key(check_text(key, "idempotency_key"))
    what = f"payload of signal {name!r}"
    return name, limits.check_payload(to_json(payload, what), what), key


def by_shard(
    shard_map: ShardMap, items: Sequence[T], route: Callable[[T], Shard]
) -> dict[Shard, list[tuple[int, T]]]:
    """`items` grouped by the shard `route` names, each with its index in `items`."""
    groups: dict[Shard, list[tuple[int, T]]] = defaultdict(list)
    for index, item in enumerate(items):
        groups[route(item)].append((index, item))
    return groups


def deliver(store: Store, tenant: str, signals: Sequence[CheckedSignal]) -> list[SignalResult]:
    """Deliver one tenant's signals: one commit per shard touched, results in input order.

    Signals to one run are handled in the order given. A shard that cannot be
    reached raises (ShardUnavailable) after the shards before it committed.
    """
    results: list[SignalResult | None] = [None] * len(signals)
    groups = by_shard(store.map, signals, lambda s: store.map.for_execution(s.target))
    for shard, members in groups.items():
        relayed = any(s.origin is not None for _, s in members)
        delivered = store.deliver_signals(
            shard, tenant=tenant,
            signals=[(s.target, s.name, s.payload_json, s.idempotency_key) for _, s in members],
            origins=[s.origin for _, s in members] if relayed else None,
        )
        for (index, _), result in zip(members, delivered, strict=True):
            results[index] = result
    return [r for r in results if r is not None]
