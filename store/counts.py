"""Runs counted by workflow and state, over every shard (schema/0029).

A shard answers rows of (workflow, kind, n) (queries.sql, `count_runs`): `started`,
each ended state and each open wait's state from its counters, and the runs workers
hold (running, taken off their wait's count). Counted over the shards, a workflow's
pending runs are what is left: started, less those ended, less those running,
waiting or asking for input. The sums are linear, so the shards' rows are
added before that subtraction, as one shard's would be.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardq.core.models import State

STARTED = "started"


@dataclass(frozen=True)
class RunCounts:
    """Runs per workflow and state, from the shards that answered; `unavailable_shards`
    names the others (their runs are not counted) and `causes` says why, as a partial
    page's do."""

    by_workflow: dict[str, dict[State, int]]
    unavailable_shards: tuple[str, ...] = ()
    causes: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def by_state(self) -> dict[State, int]:
        """Every state's runs over the workflows (a state no run is in counts 0)."""
        totals = dict.fromkeys(State, 0)
        for states in self.by_workflow.values():
            for state, n in states.items():
                totals[state] += n
        return totals

    @property
    def total(self) -> int:
        return sum(self.by_state.values())

    def as_json(self) -> dict[str, object]:
        return {"by_state": {s.value: n for s, n in self.by_state.items()},
                "by_workflow": {w: {s.value: n for s, n in states.items()}
                                for w, states in sorted(self.by_workflow.items())},
                "total": self.total, "unavailable_shards": list(self.unavailable_shards)}


def counted(rows: Iterable[tuple[str, str, int]], unavailable: tuple[str, ...] = (),
            causes: tuple[str, ...] = ()) -> RunCounts:
    """The shards' (workflow, kind, n) rows as counts per workflow and state."""
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for workflow, kind, n in rows:
        kinds[workflow][kind] += n
    by_workflow: dict[str, dict[State, int]] = {}
    for workflow, found in kinds.items():
        states: dict[State, int] = {s: found.get(s.value, 0) for s in State
                                    if s is not State.PENDING}
        states[State.PENDING] = found.get(STARTED, 0) - sum(states.values())
        if any(states.values()):
            by_workflow[workflow] = {s: states[s] for s in State}
    return RunCounts(by_workflow, unavailable, causes)
