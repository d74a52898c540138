"""Errors of the workflow engine. Nothing above the store sees a psycopg error."""

from __future__ import annotations

from typing import Any

from shardq.shards.errors import ShardqError, ShardUnavailable

__all__ = [
    "ChildFailed",
    "DecisionRefused",
    "ExecutionNotFound",
    "ExternalSignalFailed",
    "InvalidArgument",
    "LeaseLost",
    "LimitExceeded",
    "NonDeterminismError",
    "NotSerializable",
    "PayloadInvalid",
    "QueryFailed",
    "ScheduleNotFound",
    "ShardUnavailable",
    "SignalRefused",
    "SignalTimedOut",
    "StepFailed",
    "StoreConflict",
    "StoreFailed",
    "StoreRejected",
    "UnknownHandler",
    "UnknownWorkflow",
    "UpdateFailed",
    "UpdateRefused",
    "UpdateRejected",
    "UpdateTimedOut",
    "WorkflowError",
    "WorkflowTimedOut",
]


class WorkflowError(ShardqError):
    """Base class of the engine's errors."""


class WorkflowTimedOut(WorkflowError):
    """Raised by a workflow to end its run `timed_out` (not `failed`), with this as its cause.

    The declarative builder raises it when a gate or an interrupt times out.
    """


class LimitExceeded(WorkflowError):
    """A run went past a bound of its definition (history length, wait duration): it fails
    with this error rather than growing without end."""


class UnknownWorkflow(WorkflowError):
    """No workflow of that name (and version) is registered."""


class UnknownHandler(WorkflowError):
    """The workflow publishes no query or update of that name."""

    def __init__(self, kind: str, name: str, workflow: str) -> None:
        super().__init__(f"workflow {workflow} has no {kind} named {name!r}")
        self.kind = kind


class QueryFailed(WorkflowError):
    """A query could not be answered: its handler raised, or the run's history did not
    replay (a non-determinism error). Nothing was changed."""


class UpdateRejected(WorkflowError):
    """The update's validator refused it; nothing was stored."""


class UpdateFailed(WorkflowError):
    """The run handled the update and its handler raised; the failure is recorded in the
    run's history (a keyed retry gets the same failure)."""

    def __init__(self, update_id: int, error: dict[str, object]) -> None:
        super().__init__(f"update {update_id} failed: {error.get('type')}: {error.get('message')}")
        self.update_id = update_id
        self.error = error


class UpdateRefused(WorkflowError):
    """The run cannot handle the update: it has finished (`reason_code` `run_finished`)
    or finished before it reached a wait that would handle it (`not_handled`)."""

    def __init__(self, message: str, reason_code: str) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class UpdateTimedOut(WorkflowError):
    """The update is stored but the run did not handle it within the caller's wait.

    It will be handled at the run's next wait: call again with the same
    idempotency key (`update_id` names it) to get the response."""

    def __init__(self, update_id: int, waited: float) -> None:
        super().__init__(f"update {update_id} not handled within {waited:g} s; it is stored "
                         "and will be handled at the run's next wait")
        self.update_id = update_id


class InvalidArgument(WorkflowError):
    """A call was made with a value the engine refuses (bad name, sleep <= 0, ...)."""


class NotSerializable(InvalidArgument):
    """An input, step result, output or payload is not JSON-serialisable."""


class PayloadInvalid(InvalidArgument):
    """A payload does not match its JSON Schema; nothing was stored.

    `violations` lists each problem as {"message", "field_path"}, the path an
    RFC 6901 JSON Pointer to the offending field ("" for the payload itself; a
    missing required field is pointed at where it belongs: `/reason`).
    """

    def __init__(
        self, what: str, violations: list[dict[str, str]],
        summary: str = "payload validation failed",
    ) -> None:
        shown = "; ".join(f"{v['field_path'] or '/'}: {v['message']}" for v in violations[:5])
        more = f" (and {len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(f"{what} does not match its schema: {shown}{more}")
        self.violations = violations
        self.summary = summary
        """One line naming what failed: `signal payload validation failed`, `input ...`."""


class DecisionRefused(WorkflowError):
    """A decision the interrupt cannot take; nothing of it was applied.

    `reason_code`: `decided` (another decision stands: `standing` holds it),
    `not_open` (the run waits for no such interrupt now), `timed_out`,
    `action_refused` (not one of the interrupt's actions), `decision_id_reused`
    (the id was used for another interrupt). Every refusal is in the run's history.
    """

    def __init__(
        self, reason_code: str, message: str, standing: dict[str, object] | None = None
    ) -> None:
        super().__init__(f"{reason_code}: {message}")
        self.reason_code = reason_code
        self.standing = standing


class ExecutionNotFound(WorkflowError):
    """No such execution for this tenant (another tenant's execution looks the same)."""


class ScheduleNotFound(WorkflowError):
    """No schedule of that name for this tenant."""


class ConcurrencyKeyNotFound(WorkflowError):
    """No start has declared this concurrency key, so there is no limit to change."""

    def __init__(self, key: str) -> None:
        super().__init__(f"concurrency key {key!r} is not known: no start has declared it")
        self.key = key


class RateLimiterNotFound(WorkflowError):
    """No worker has declared this rate limiter on the home shard, so there is no rate to
    change."""

    def __init__(self, name: str) -> None:
        super().__init__(f"rate limiter {name!r} is not known: no worker has declared it")
        self.name = name


class SignalRefused(WorkflowError):
    """The target run cannot take signals any more (it has finished) or has too many pending.

    `reason_code` tells which: `target_finished`, `gate_closed` (the run's gate of
    that name took its one signal) or `target_refused` (a bound).
    """

    def __init__(self, message: str, reason_code: str = "target_refused") -> None:
        super().__init__(message)
        self.reason_code = reason_code


class SignalTimedOut(WorkflowError):
    """`ctx.wait_for_signal` reached its deadline before a signal of that name arrived.

    Raised into the workflow at the call (and again on replay), so a timeout is
    never mistaken for a signal that came without a payload.
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"no signal {name!r} arrived before the wait's deadline")
        self.signal_name = name


class ExternalSignalFailed(WorkflowError):
    """`ctx.signal_external` could not deliver; `reason_code` says why.

    `target_not_found` (no such run for this tenant), `target_finished`,
    `gate_closed`, `target_refused` (its bounds): the codes a client's signal
    is refused with. Raised at the call, and again on replay.
    """

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(f"{reason_code}: {message}")
        self.reason_code = reason_code


class LeaseLost(WorkflowError):
    """This worker's lease on an execution expired and another worker took it over."""


class StoreRejected(WorkflowError):
    """The database refused to store a value (e.g. a NUL character inside JSON)."""


class StoreConflict(WorkflowError):
    """A transaction lost a deadlock or serialization race; retrying it is safe."""


class StoreFailed(WorkflowError):
    """The database raised an error the store gives no other meaning (a constraint or a
    statement it did not expect, a lock it could not take): the statement failed, the
    shard did not. `sqlstate` keeps the server's code for logs and retry decisions."""

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class NonDeterminismError(WorkflowError):
    """The workflow code made a different call than the one recorded at that position.

    `position`, `recorded` and `called` say where and how, when one call is to
    blame (`shardq replay` reports them): `recorded` the history's call there
    (e.g. "step 'charge'", or None where history ends), `called` the code's (None
    where the code returned).
    """

    def __init__(self, message: str, *, position: int | None = None,
                 recorded: str | None = None, called: str | None = None) -> None:
        super().__init__(message)
        self.position, self.recorded, self.called = position, recorded, called


class StepFailed(WorkflowError):
    """A step failed for good (retries exhausted or a non-retryable error).

    Raised into the workflow code at the step's call, where the workflow may
    catch it; on replay the same error is raised again without running the step.
    """

    def __init__(self, step: str, error_type: str, message: str, attempts: int) -> None:
        super().__init__(
            f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}"
        )
        self.step = step
        self.error_type = error_type
        self.error_message = message
        self.attempts = attempts


class ChildFailed(WorkflowError):
    """A child run ended otherwise than completed (failed, cancelled, timed out, or its
    workflow id was taken by another run): raised into the parent at `wait_child`,
    or by `ChildOutcome.result()`, where the parent may catch it."""

    def __init__(self, workflow: str, workflow_id: str, state: str,
                 error: dict[str, Any] | None) -> None:
        reason = (f": {error.get('type', 'Error')}: {error.get('message', '')}"
                  if error else "")
        super().__init__(f"child {workflow} {workflow_id!r} ended {state}{reason}")
        self.workflow = workflow
        self.workflow_id = workflow_id
        self.state = state
        self.error_type = error.get("type") if error else None
        self.error_message = error.get("message") if error else None
