"""The rules every signal meets before it is sent: its name, its payload's size, its key.

`Client.signal_many` and a workflow's `ctx.signal_external` check here, so a signal
has the same rules whoever sends it; the delivery itself is shardq.deliver_signals
(stored, recorded, the run woken), whoever calls it: the client through fan_out, a
commit for a run of its own shard, the outbox relay per target shard.
"""

from __future__ import annotations

from typing import Any

from shardq.queue.encoding import to_json
from shardq.queue.errors import InvalidArgument
from shardq.queue.limits import Limits
from shardq.queue.names import check_signal_name, check_text


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
