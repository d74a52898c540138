"""The offline replay check: recorded histories replayed against the code as it is now.

Each run's workflow function runs again over its history, as a worker's next turn
would, with nothing able to happen: every recorded call returns what it
recorded, and the first call history has not recorded stops the replay (a step
is never run, a signal never sent, nothing written; the journal refuses every
event, shardq.workflow.rebuild). Replay is strict here: an argument history
recorded (a timer's seconds, a child's workflow) that the code now gives
otherwise counts, where a running worker would quietly keep the recorded one.

A run passes when its history replays to where it ends. It diverges when the code
makes another call than the one recorded at a position, returns or fails before
history ends, calls past the end of a completed run, or raises where its run did
not fail. The verdict names the first differing position, what history recorded
there and what the code did (docs/versioning.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shardq.core.errors import NonDeterminismError, UnknownWorkflow
from shardq.workflow.control import Cancelled, ContinueAsNew, Park, ReplayEnd
from shardq.workflow.exported import RecordedRun
from shardq.workflow.rebuild import read_only_context
from shardq.workflow.registry import Registry
from shardq.workflow.replay import Replay


@dataclass(frozen=True)
class Verdict:
    """One run's replay: `ok`, or where and how the code departs from its history."""

    run: RecordedRun
    ok: bool
    reason: str | None = None
    """One line: what differs (None when ok)."""
    position: int | None = None
    recorded: str | None = None
    """History's call at `position` (e.g. "step 'charge'"); None past its end."""
    called: str | None = None
    """The code's call at `position`; None where the code returned or raised."""


def check_run(registry: Registry, run: RecordedRun) -> Verdict:
    """Replay `run`'s history against `registry`'s code for its workflow and version."""
    try:
        definition = registry.get(run.workflow_name, run.workflow_version)
    except UnknownWorkflow as exc:
        return Verdict(run, False, f"{exc}: the code cannot resume this run")
    ctx, replay = read_only_context(definition, run, registry=registry, strict=True)
    verdict = _replayed(run, replay, lambda: definition.fn(ctx))
    # A divergence the code caught (NonDeterminismError is an Exception) still counts.
    fatal = replay.fatal
    if fatal is None:
        return verdict
    if isinstance(fatal, NonDeterminismError):
        return _diverged(run, fatal)
    return Verdict(run, False, str(fatal))


def _replayed(run: RecordedRun, replay: Replay, call: Callable[[], object]) -> Verdict:
    """The verdict by how the code stopped."""
    completed = replay.ended == "run.completed"
    try:
        call()
    except ReplayEnd as end:
        # Where history ends: a live run waits or is due here; only a completed
        # run's code must not call past its end.
        if completed and end.call is not None:
            return Verdict(run, False, f"the code calls {end.call} at position "
                           f"{end.position}, past the end of the run's history (it "
                           "completed there)", end.position, None, end.call)
        return Verdict(run, True)
    except (Park, Cancelled, ContinueAsNew) as stop:
        if completed and isinstance(stop, ContinueAsNew):
            return Verdict(run, False, "the code continues as new where the run completed",
                           replay.position)
        return Verdict(run, True)
    except Exception as exc:  # the code raised: what its run recorded decides
        return _raised(run, replay.ended, replay.position, exc)
    return _returned(run, replay)


def _returned(run: RecordedRun, replay: Replay) -> Verdict:
    try:
        replay.finish()
    except NonDeterminismError as exc:
        return _diverged(run, exc)
    if replay.ended is None:
        return Verdict(run, False, f"the code returns after {replay.position} call(s) where "
                       "the run's history goes on (it has not ended)", replay.position)
    return Verdict(run, True)


def _diverged(run: RecordedRun, exc: NonDeterminismError) -> Verdict:
    return Verdict(run, False, str(exc), exc.position, exc.recorded, exc.called)


def _raised(run: RecordedRun, ended: str | None, position: int, exc: Exception) -> Verdict:
    """The code raised `exc` at `position`: fine for a run that failed so, a divergence
    for any other."""
    recorded_type = (run.error or {}).get("type") if ended == "run.failed" else None
    if recorded_type == type(exc).__qualname__:
        return Verdict(run, True)
    what = f"{type(exc).__qualname__}: {exc}".splitlines()[0][:300]
    if ended == "run.failed":
        because = f"the run failed with {recorded_type}"
    elif ended is None:
        because = "the run has not ended: its next turn would fail it"
    else:
        because = f"the run ended {ended.removeprefix('run.')}"
    return Verdict(run, False, f"the code raises {what} after {position} call(s); {because}",
                   position)
