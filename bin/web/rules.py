"""What a caller sends, read by one set of rules whichever front end it came through.

`shardq workflow signal` and `POST /workflows/{id}/signal/{name}` (and the
other commands and routes that take a key or a JSON value) read idempotency
keys and JSON payloads here, and deliver a signal through `send_signal`, so
the command line and the HTTP API cannot drift apart; a test
(tests/acceptance/test_signal_parity.py) drives both with one table.

- A key that is present must be usable: empty or blank is refused, never read
  as "no key" (that would turn exactly-once into at-least-once), and so are
  bytes that are not UTF-8.
- A payload is strict JSON: no NaN or Infinity, no number out of a float's
  range, UTF-8 only; an empty payload is "no payload" (None).
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from shardq.queue.client import Client
from shardq.queue.errors import InvalidArgument
from shardq.queue.models import SignalRequest, SignalResult


class RuleBroken(InvalidArgument):
    """What the caller sent breaks a rule of this module (a usage error)."""


def idempotency_key(value: str | bytes | None, source: str) -> str | None:
    """The key `source` carries; None when absent; RuleBroken when present but unusable."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise RuleBroken(f"{source} is not valid UTF-8") from None
    if not value.strip():
        raise RuleBroken(f"{source} is empty: leave it out for no key")
    return value


def json_value(raw: str | bytes, what: str) -> Any:
    """Strict JSON, None for an empty or blank text; RuleBroken saying what is wrong."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RuleBroken(f"{what} is not UTF-8 (byte {exc.start}: {exc.reason})") from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise RuleBroken(f"{what} is nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError too
        raise RuleBroken(f"{what} is not valid JSON: {exc}") from None


def send_signal(
    client: Client, execution_id: uuid.UUID, name: str, payload: Any, key: str | None,
    tenant: str,
) -> SignalResult:
    """Deliver one signal; the result carries a refusal in `error` rather than raising it
    (each front end words it its own way: an exit code, a status)."""
    (result,) = client.signal_many([SignalRequest(execution_id, name, payload, key)],
                                   tenant=tenant)
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite(number: str) -> float:
    parsed = float(number)
    if not math.isfinite(parsed):
        raise ValueError(f"the number {number} is out of range")
    return parsed
