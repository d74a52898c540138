"""ctx.patched and ctx.deprecate_patch: changing a workflow's code while runs of the old
code are still parked.

A patch marks where new code departs from old. A run that reaches
`ctx.patched("id")` on code that has it records a `patch.marked` event there and
takes the new branch, on every replay after. A run recorded before the patch
finds, at that position, whatever the old code did next (or its end): it takes
the old branch, and the marker takes no position, so the rest of its history
lines up. Once no run of the old code is left, the old branch goes and the call
becomes `ctx.deprecate_patch("id")`, which steps over the marker of runs that
recorded one and takes nothing in runs that did not; once those are gone too,
it goes (docs/versioning.md, which works through the cases).
"""

from __future__ import annotations

from shardq.core.models import Event, NewEvent
from shardq.core.rules import check_name
from shardq.workflow.journal import Journal
from shardq.workflow.replay import Replay


class PatchCalls:
    """patched and deprecate_patch for WorkflowContext, on the state the context keeps."""

    _replay: Replay
    _journal: Journal

    def _guard(self) -> None:
        raise NotImplementedError

    def patched(self, change_id: str) -> bool:
        """True where this run takes the code path of change `change_id`: it reached this
        call on code that has it (recorded, so the answer never flips); False for a run
        whose history went past this point, or ended, before the patch existed."""
        check_name(change_id, "patch")
        self._guard()
        taken = self._replay.patch(change_id)
        if taken is not None and taken >= 0:
            self._journal.events.append(NewEvent(taken, Event.PATCH_MARKED, change_id, {}))
        return taken is not None

    def deprecate_patch(self, change_id: str) -> None:
        """Where `ctx.patched(change_id)` was, once no run that took the old branch is left:
        steps over the marker of runs that recorded it, records nothing in new runs."""
        check_name(change_id, "patch")
        self._guard()
        self._replay.patch(change_id, deprecated=True)
