"""Bounds on what a caller may store, checked before anything is sent to a shard.

A run's input is read by every claim of the run, and a signal's payload by
every claim until it is consumed: without a bound a single caller could make
each turn drag megabytes through the claim path. The defaults follow what
webhook and queue services accept (256 KiB messages, 255-character
idempotency keys); an application with other needs passes its own `Limits`
to its `Client`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardq.queue.errors import InvalidArgument


@dataclass(frozen=True)
class Limits:
    max_input_bytes: int = 1 << 20
    """A run's input, as JSON text (1 MiB)."""
    max_payload_bytes: int = 256 << 10
    """A signal's payload, as JSON text (256 KiB)."""
    max_idempotency_key: int = 255
    """Characters of an idempotency key."""

    def __post_init__(self) -> None:
        for name in ("max_input_bytes", "max_payload_bytes", "max_idempotency_key"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")

    def check_input(self, encoded: str, what: str) -> str:
        return _within(encoded, self.max_input_bytes, what, "max_input_bytes")

    def check_payload(self, encoded: str, what: str) -> str:
        return _within(encoded, self.max_payload_bytes, what, "max_payload_bytes")

    def check_key(self, key: str) -> str:
        if len(key) > self.max_idempotency_key:
            raise InvalidArgument(
                f"idempotency_key is {len(key)} characters long; at most "
                f"{self.max_idempotency_key} (Limits.max_idempotency_key)"
            )
        return key


def _within(encoded: str, bound: int, what: str, setting: str) -> str:
    # json.dumps escapes everything beyond ASCII, so characters are bytes here.
    if len(encoded) > bound:
        raise InvalidArgument(
            f"{what} is {len(encoded):,} bytes of JSON; at most {bound:,} (Limits.{setting})"
        )
    return encoded
