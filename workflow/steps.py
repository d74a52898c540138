"""What a step attempt is run in, and how a failure is recorded.

A step with a `timeout` runs on a thread of its own, which the turn stops
waiting for at the deadline; its late result goes nowhere.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from shardq.core.errors import NotSerializable, StepFailed
from shardq.core.instruments import STEP_ATTEMPTS, STEP_SECONDS
from shardq.core.models import Event, NewEvent, State, TaskAction
from shardq.workflow.control import Park
from shardq.workflow.journal import Journal
from shardq.workflow.recorded import json_round_trip
from shardq.workflow.retry import RetryPolicy

T = TypeVar("T")
MAX_ERROR_TEXT = 8000


class StepTimeout(Exception):
    """A step attempt ran longer than its `timeout`."""


def error_payload(exc: BaseException) -> dict[str, Any]:
    """How a run's or a step's failure is recorded: type, message, the traceback's end."""
    text = "".join(traceback.format_exception(exc))
    return {
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": text[-MAX_ERROR_TEXT:],
    }


def run_attempt(
    fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> T:
    if timeout is None:
        return fn(*args, **kwargs)
    # The attempt runs on a thread of its own (`shardq-step`) that touches nothing
    # but `box`; past the timeout the turn stops waiting for it and never reads
    # `box` again, so its late result or error goes nowhere.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed back to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="shardq-step", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise StepTimeout(f"attempt did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


STEP_COMPLETED, _STEP_RETRIED, _STEP_FAILED = (
    STEP_ATTEMPTS.labels(o) for o in ("completed", "retried", "failed"))


def fail_attempt(  # noqa: PLR0917 - the attempt's coordinates, in the event's order
    journal: Journal, position: int, name: str, attempt: int, exc: Exception,
    policy: RetryPolicy,
) -> NoReturn:
    """Record a failed attempt of step `name`: parked for a durable backoff while `policy`
    retries it, else StepFailed, recorded as final so that replay raises it again."""
    error = error_payload(exc)
    if policy.should_retry(exc, attempt):
        delay = policy.backoff(attempt)
        journal.events.append(NewEvent(
            position, Event.STEP_FAILED, name,
            {"attempt": attempt, "error": error, "retry_in": delay}, wake_in=delay,
        ))
        _STEP_RETRIED.inc()
        raise Park(state=State.PENDING, task=TaskAction.SCHEDULE, delay=delay) from exc
    journal.events.append(NewEvent(
        position, Event.STEP_FAILED, name, {"attempt": attempt, "error": error, "final": True}
    ))
    _STEP_FAILED.inc()
    raise StepFailed(name, error["type"], error["message"], attempt) from exc


def attempt_step(  # noqa: PLR0917 - the attempt's coordinates, then what it runs
    journal: Journal, position: int, name: str, attempt: int, run: Callable[[], Any],
    policy: RetryPolicy,
) -> Any:
    """Run one attempt of step `name` and record its result (the JSON it round-trips to,
    which is returned) or its failure (fail_attempt)."""
    try:
        started = time.perf_counter()
        try:
            result = run()
        finally:
            STEP_SECONDS.observe(time.perf_counter() - started)
    except Exception as exc:
        fail_attempt(journal, position, name, attempt, exc, policy)
    try:
        encoded = json_round_trip(result)
    except (TypeError, ValueError) as exc:
        problem = NotSerializable(
            f"step {name!r} returned {type(result).__name__}, which is not "
            f"JSON-serialisable: {exc}"
        )
        fail_attempt(journal, position, name, attempt, problem, RetryPolicy(max_attempts=1))
    journal.events.append(NewEvent(position, Event.STEP_COMPLETED, name, {"result": encoded}))
    STEP_COMPLETED.inc()
    return encoded
