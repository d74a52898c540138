"""ctx.patched and ctx.deprecate_patch with real workers: a run parked on old code
resumes on patched code down the old branch, a new run takes the new one, and neither
answer flips on a later turn; the replay check agrees with what the workers did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardq.client.client import Client
from shardq.client.recorded import recorded_runs
from shardq.core.models import Event, State
from shardq.worker.worker import Worker
from shardq.workflow.replayer import check_run

from .. import versions
from ..support import wait_until

registry = versions.patched
StartWorker = Callable[..., Worker]


def _parked_on_paid(client: Client, run: Any) -> None:
    """The run waits for `paid` (past its timer, whose wait also reads `waiting`)."""
    wait_until(lambda: (w := client.waiting(run)[0]) is not None and w.name == "paid",
               timeout=30, what="parked on paid")


def _calls(client: Client, run: Any) -> list[tuple[int | None, str, str]]:
    return [(e.position, e.kind, e.name) for e in client.history(run)
            if e.position is not None and e.kind in (Event.STEP_COMPLETED, Event.PATCH_MARKED)]


def test_old_runs_keep_the_old_branch_and_new_runs_take_the_patch(
    client: Client, start_worker: StartWorker,
) -> None:
    old_worker = start_worker(versions.v1, poll_interval_s=0.2)
    old = client.start("order", "o-old", {"amount": 1}).execution_id
    _parked_on_paid(client, old)
    old_worker.stop()  # the deploy: v1 is gone, the patched code takes over
    start_worker(versions.patched, poll_interval_s=0.2)
    new = client.start("order", "o-new", {"amount": 2}).execution_id
    _parked_on_paid(client, new)
    # o-new recorded its marker in the turn that parked it; the next turn replays it.
    for run in (old, new):
        client.signal(run, "paid", {"ok": True})
        assert client.wait(run, timeout=30).state is State.COMPLETED
    assert _calls(client, old) == [(0, "step.completed", "charge"),
                                   (3, "step.completed", "ship")]
    assert _calls(client, new) == [(0, "step.completed", "charge"),
                                   (2, "patch.marked", "verify"),
                                   (3, "step.completed", "verify"),
                                   (5, "step.completed", "ship")]
    runs = {r.workflow_id: r for r in recorded_runs(client)}
    assert all(check_run(versions.patched, r).ok for r in runs.values())
    # Back to v1 (a rollback): the new run's marker is where v1 waits for `paid`.
    back = check_run(versions.v1, runs["o-new"])
    assert (back.ok, back.position, back.recorded) == (False, 2, "patch 'verify'")
    assert check_run(versions.v1, runs["o-old"]).ok
    # Retired: right for runs that took the patch, wrong while an old-branch run is kept.
    assert check_run(versions.deprecated, runs["o-new"]).ok
    stale = check_run(versions.deprecated, runs["o-old"])
    assert (stale.ok, stale.position) == (False, 2)


def test_a_deprecated_patch_runs_new_runs_without_a_marker(
    client: Client, start_worker: StartWorker,
) -> None:
    start_worker(versions.deprecated, poll_interval_s=0.2)
    run = client.start("order", "o-dep", {"amount": 3}).execution_id
    client.signal(run, "paid", {"ok": True})
    assert client.wait(run, timeout=30).state is State.COMPLETED
    assert _calls(client, run) == [(0, "step.completed", "charge"),
                                   (2, "step.completed", "verify"),
                                   (4, "step.completed", "ship")]


def test_a_bad_change_id_fails_the_run_with_a_clear_error(
    client: Client, start_worker: StartWorker,
) -> None:
    start_worker(versions.patched, poll_interval_s=0.2)
    for index, bad in enumerate(["", "x" * 1000, "two words", 5, None, ["verify"]]):
        run = client.start("bad_patch", f"bp-{index}", {"id": bad}).execution_id
        done = client.wait(run, timeout=30)
        assert done.state is State.FAILED
        assert done.error is not None and "patch" in done.error["message"], done.error
