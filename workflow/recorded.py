"""Values a replayed call returns, rebuilt from what its history event recorded.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from shardq.core.errors import (
    ExternalSignalFailed,
)
from shardq.core.models import (
    ExternalSignal,
    Signal,
)

_LONG_AGO = datetime.min.replace(tzinfo=UTC)


def external_result(recorded: Mapping[str, Any]) -> ExternalSignal:
    """What a signal_external call returns from its recorded outcome (a refusal in `error`)."""
    target, name, key = uuid.UUID(recorded["target"]), recorded["name"], recorded.get(
        "idempotency_key")
    if "reason_code" in recorded:
        detail = recorded.get("detail") or f"execution {recorded['target']} not found"
        return ExternalSignal(target, name, None, delivered=False, idempotency_key=key,
                              error=ExternalSignalFailed(recorded["reason_code"], detail))
    if recorded.get("queued"):
        return ExternalSignal(target, name, None, delivered=False, idempotency_key=key,
                              queued=True)
    return ExternalSignal(target, name, int(recorded["signal_id"]), bool(recorded["delivered"]),
                          key)


def signal_of(name: str, recorded: Mapping[str, Any]) -> Signal:
    """A received signal from what its consumption event records."""
    at = recorded.get("received_at")
    return Signal(name, recorded["payload"], int(recorded["signal_id"]),
                  recorded.get("idempotency_key"),
                  datetime.fromisoformat(at) if at else _LONG_AGO)


def json_round_trip(value: Any) -> Any:
    """`value` as JSON gives it back; scalars that JSON keeps as they are skip the trip."""
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int:
        return value
    if kind is float and math.isfinite(value):
        return value
    return json.loads(json.dumps(value, allow_nan=False))
