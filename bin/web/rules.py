"""What a caller sends, read by one set of rules whichever front end it came through.

`shardq workflow signal` and `POST /workflows/{id}/signal/{name}` (and the
other commands and routes that take a key or a JSON value) read idempotency
keys and JSON payloads by the input rules (shardq.core.rules: `idempotency_key`,
`json_value`, RuleBroken, re-exported here), and deliver a signal through
`send_signal` (`send_signal_async` in the server), so the command
line and the HTTP API cannot drift apart; a test
(tests/acceptance/test_signal_parity.py) drives both with one table.

- A key that is present must be usable: empty or blank is refused, never read
  as "no key" (that would turn exactly-once into at-least-once), and so are
  bytes that are not UTF-8.
- A payload is strict JSON: no NaN or Infinity, no number out of a float's
  range, no key twice in one object, UTF-8 only; an empty payload is "no
  payload" (None).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from shardq.core.models import SignalRequest, SignalResult
from shardq.core.rules import RuleBroken, idempotency_key, json_value

if TYPE_CHECKING:  # the CLI reads its options by these rules: no asyncio stack to import
    from shardq.client.client import Client
    from shardq.client.coalesce import SignalCoalescer

__all__ = ["RuleBroken", "idempotency_key", "json_value", "send_signal", "send_signal_async"]


def send_signal(
    client: Client, execution_id: uuid.UUID, name: str, payload: Any, key: str | None,
    tenant: str,
) -> SignalResult:
    """Deliver one signal; the result carries a refusal in `error` rather than raising it
    (each front end words it its own way: an exit code, a status)."""
    (result,) = client.signal_many([SignalRequest(execution_id, name, payload, key)],
                                   tenant=tenant)
    return result


async def send_signal_async(
    signals: SignalCoalescer, execution_id: uuid.UUID, name: str, payload: Any,
    key: str | None, tenant: str,
) -> SignalResult:
    """send_signal for `shardq serve`: its AsyncClient's, sharing a commit under load."""
    return await signals.signal(SignalRequest(execution_id, name, payload, key), tenant=tenant)
