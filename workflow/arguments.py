"""What the context's calls accept: interrupts, timeouts and conditions, checked before
anything is recorded (a bad argument fails the call, never the run's history).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardq.core.errors import (
    InvalidArgument,
)
from shardq.core.models import (
    INTERRUPT_ACTIONS,
    Signal,
)
from shardq.core.rules import (
    Limits,
    check_name,
    check_schema,
    check_signal_name,
    check_text,
    payload_json,
    validate,
)

MAX_PROMPT = 4000
"""Characters of an interrupt's prompt: what a reviewer reads, not a document store."""


def check_interrupt(
    name: str, prompt: str, actions: Sequence[str], schema: Mapping[str, Any] | None,
    timeout: float | None,
) -> tuple[str, ...]:
    """The accepted actions of a well-formed interrupt request; else InvalidArgument."""
    check_name(name, "interrupt")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT:
        raise InvalidArgument(f"interrupt {name!r}: the prompt must be 1..{MAX_PROMPT} "
                              "characters")
    check_text(prompt, f"interrupt {name!r} prompt")
    accepted = tuple(actions)
    if not accepted or len(set(accepted)) != len(accepted) or not set(accepted) <= set(
        INTERRUPT_ACTIONS
    ):
        raise InvalidArgument(f"interrupt {name!r}: actions must be distinct, from "
                              f"{', '.join(INTERRUPT_ACTIONS)}; got {list(accepted)}")
    if schema is not None:
        check_schema(dict(schema), f"interrupt {name!r}")
    check_timeout(timeout, f"interrupt {name!r}")
    return accepted


def check_interrupt_value(
    name: str, value: Any, schema: Mapping[str, Any] | None, limits: Limits
) -> Any:
    """The value under review, as JSON will store it; else InvalidArgument or PayloadInvalid."""
    what = f"value of interrupt {name!r}"
    stored = json.loads(payload_json(value, what, limits))
    validate(stored, dict(schema) if schema is not None else None, what)
    return stored


def check_timeout(timeout: float | None, what: str) -> None:
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float)
        or not math.isfinite(timeout) or timeout <= 0
    ):
        raise InvalidArgument(f"{what}: timeout must be > 0 seconds, got {timeout!r}")


def check_condition(
    name: str, on: Mapping[str, Callable[[Signal], object]], timeout: float | None
) -> None:
    check_name(name, "condition")
    check_timeout(timeout, f"wait_until {name!r}")
    if not on:
        raise InvalidArgument(f"wait_until {name!r}: `on` must name at least one signal")
    for signal_name, handler in on.items():
        check_signal_name(signal_name)
        if not callable(handler):
            raise InvalidArgument(f"wait_until {name!r}: the handler of {signal_name!r} "
                                  "is not callable")
