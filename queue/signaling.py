"""The one way a signal reaches a run: checked, grouped by shard, delivered, scattered back.

`Client.signal_many`, a workflow's `ctx.signal_external` and the outbox relay
all pass through here, so a signal has the same rules (name, payload bound, key)
and the same delivery (shardq.deliver_signals: stored, recorded, the run woken)
whoever sends it. Nothing here needs a workflow registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardq.queue.encoding import to_json
from shardq.queue.errors import InvalidArgument
from shardq.queue.limits import Limits
from shardq.queue.models import SignalResult
from shardq.queue.names import check_signal_name, check_text
from shardq.queue.params import SignalDelivery
from shardq.queue.store import Store
from shardq.shards.fanout import fan_out
from shardq.shards.routing import bucket_of


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


def deliver(store: Store, tenant: str, signals: Sequence[SignalDelivery]) -> list[SignalResult]:
    """Deliver one tenant's signals: one commit per shard touched, results in input order.

    Signals to one run are handled in the order given. A shard that cannot be
    reached raises (ShardUnavailable) after the shards before it committed.
    """
    return fan_out(store.map, signals, lambda s: bucket_of(s.target),
                   lambda shard, members: store.deliver_signals(shard, tenant, members))
