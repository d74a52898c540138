"""Retry policy of a step: how many attempts, how long between them, what never retries."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from shardq.core.errors import InvalidArgument


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter. `max_attempts=1` runs once and believes a failure.

    The wait before a retry is a durable timer: the run is released and claimed
    again when it is due, so a worker restart does not lose or shorten it.
    """

    max_attempts: int = 3
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.1
    """Fraction of the backoff added or removed at random (0.1 = ±10%)."""
    non_retryable: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff <= 0 or self.max_backoff < self.initial_backoff:
            raise InvalidArgument("backoff must satisfy 0 < initial_backoff <= max_backoff")
        if self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise InvalidArgument("multiplier must be >= 1 and jitter within [0, 1)")

    @classmethod
    def of(cls, value: RetryPolicy | int | None) -> RetryPolicy:
        """Accept a policy, a bare attempt count, or None for the default."""
        if value is None:
            return DEFAULT_RETRY
        if isinstance(value, RetryPolicy):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(max_attempts=value)
        raise InvalidArgument(f"retry must be a RetryPolicy or an attempt count, got {value!r}")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether a failure of attempt number `attempt` (1-based) earns another attempt."""
        return attempt < self.max_attempts and not isinstance(error, self.non_retryable)

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        spread = base * self.jitter
        return max(0.001, base + (rng or random).uniform(-spread, spread))


DEFAULT_RETRY = RetryPolicy()
