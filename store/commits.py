"""A batch of turn commits as the parameters of one statement (shardq.commit_turns_v2).

The worker's group commit: Store.commit_turns sends what `commit_turns` builds.
Each column travels as one text and the rare writes (signals to other runs,
child starts, a family's ends) as one JSON document; store/queries.sql says why.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg.rows import tuple_row

from shardq.core.errors import StoreRejected
from shardq.core.models import CommitOutcome, Event, NewEvent, TurnCommit
from shardq.shards.connections import DictConnection
from shardq.store.statements import MAX_PENDING_SIGNALS, MAX_PENDING_SIGNALS_TOTAL, SQL


def commit_turns(
    conn: DictConnection, commits: Sequence[TurnCommit], lease_s: float
) -> dict[uuid.UUID, CommitOutcome]:
    """The whole batch as one statement: shardq.commit_turns_v2().

    At most one commit per execution, so the writes, grouped by table, keep
    each execution's own order. Each column of each kind of write goes as one
    text (queries.sql says why and how); the rare signals to other runs go as
    a JSON document.
    """
    ids = {c.execution_id for c in commits}
    if len(ids) != len(commits):
        raise ValueError("commit_turns takes at most one commit per execution")
    # A commit that ends its run stores its turn's last step inside the
    # outcome event: one history row fewer per finished run (schema/0017).
    folded = {c.execution_id: c.events[-1] for c in commits if _folds(c)}
    events = [(c.execution_id, e) for c in commits
              for e in (c.events[:-1] if c.execution_id in folded else c.events)]
    waits = [(c.execution_id, c.open_wait) for c in commits if c.open_wait is not None]
    consumed = [s for c in commits for s in c.consumed_signals]
    parking = [(c.execution_id, name) for c in commits for name in c.wake_on_signals]
    externals = [
        [c.execution_id.hex, x.position, x.target.hex, x.name, json.loads(x.payload_json),
         x.idempotency_key, MAX_PENDING_SIGNALS, MAX_PENDING_SIGNALS_TOTAL, c.trace]
        for c in commits for x in c.externals
    ]
    outbox = [
        [c.execution_id.hex, o.position, o.target.hex, o.target_bucket, o.name,
         json.loads(o.payload_json), o.idempotency_key, c.trace]
        for c in commits for o in c.outbox
    ]
    children = [
        [c.execution_id.hex, k.position, k.child_id.hex, k.here, k.workflow, k.version,
         k.workflow_id, json.loads(k.input_json), k.priority, k.policy,
         None if k.gates is None else list(k.gates), c.trace]
        for c in commits for k in c.children
    ]
    ends = [[c.execution_id.hex, None if c.family[0] is None else c.family[0].hex]
            for c in commits if c.family is not None]
    continued = [[c.execution_id.hex, json.loads(c.continued[0]), c.continued[1],
                  c.continued[2]] for c in commits if c.continued is not None]
    attributes = [[c.execution_id.hex, set_] for c in commits
                  if (set_ := _attributes_set(c.events))]
    rare = {k: v for k, v in (("local", externals), ("outbox", outbox),
                              ("children", children), ("ends", ends),
                              ("continued", continued), ("attributes", attributes)) if v}
    # Every relative time a turn chose (its task's delay, a timer's wake, a wait's
    # deadline) counts from when it chose it, less the time its commit queued since:
    # a run parked for a rate limiter's slot is due at the slot, and its timer's
    # wake_at agrees with its task's due time.
    now = time.monotonic()
    queued = {c.execution_id: now - c.decided_at for c in commits}

    def left(run: uuid.UUID, seconds: float | None) -> str:
        return "-" if seconds is None else repr(max(0.0, seconds - queued[run]))

    params = {
        "lease_s": lease_s,
        "c_ids": ",".join([c.execution_id.hex for c in commits]),
        "c_tokens": ",".join([c.lease_token.hex for c in commits]),
        "c_next": ",".join([c.next_token.hex for c in commits]),
        "c_states": ",".join([c.state or "-" for c in commits]),
        # The output's JSON text wrapped as is: SQL NULL (none set) stays apart
        # from a workflow's null.
        "c_outputs": "[" + ",".join(["null" if c.output_json is None
                                     else '{"v":' + c.output_json + "}" for c in commits]) + "]",
        "c_errors": json.dumps([c.error for c in commits]),
        "c_actions": ",".join([c.task for c in commits]),
        "c_delays": ",".join([left(c.execution_id, c.delay) if c.delay else "0.0"
                              for c in commits]),
        "c_close_wait": ",".join(["t" if c.close_wait and c.open_wait is None else "f"
                                  for c in commits]),
        "e_ids": ",".join([run.hex for run, _ in events]),
        "e_positions": ",".join(["-" if e.position is None else str(e.position)
                                 for _, e in events]),
        "e_kinds": ",".join([e.kind for _, e in events]),
        "e_names": _names([e.name for _, e in events]),
        "e_payloads": json.dumps([e.payload for _, e in events]),
        "e_wake_ins": ",".join([left(run, e.wake_in) for run, e in events]),
        "w_ids": ",".join([run.hex for run, _ in waits]),
        "w_positions": ",".join([str(w.position) for _, w in waits]),
        "w_kinds": ",".join([w.kind for _, w in waits]),
        "w_names": _names([w.name for _, w in waits]),
        "w_deadline_ins": ",".join([left(run, w.deadline_in) for run, w in waits]),
        "w_requests": json.dumps([w.request for _, w in waits]),
        "s_ids": ",".join([str(signal_id) for signal_id, _ in consumed]),
        "s_positions": ",".join([str(position) for _, position in consumed]),
        "p_ids": ",".join([run.hex for run, _ in parking]),
        "p_names": _names([name for _, name in parking]),
        "rare": json.dumps(rare) if rare else None,
        "c_steps": json.dumps([_folded(folded.get(c.execution_id)) for c in commits]),
    }
    with conn.cursor(row_factory=tuple_row) as cur:
        # (position in the batch from 1, cancel requested, signals' outcomes) of each
        # commit that landed
        landed: dict[int, tuple[bool, list[dict[str, Any]] | None]] = {
            ord_: (cancel, sent) for ord_, cancel, sent in cur.execute(SQL["commit_turns"], params)
        }
    return {c.execution_id: _outcome(landed.get(i)) for i, c in enumerate(commits, 1)}


def _folds(c: TurnCommit) -> bool:
    """Whether `c` ends its run in the turn of its last event, a step's result.

    Any state that writes an outcome folds: a cancellation asked meanwhile turns
    a completing commit into `run.cancelled`, which then carries the step.
    """
    if c.state is None or not c.state.terminal or not c.events:
        return False
    last = c.events[-1]
    return last.kind == Event.STEP_COMPLETED and last.wake_in is None and last.position is not None


def _attributes_set(events: Sequence[NewEvent]) -> dict[str, Any]:
    """The search attributes a commit's events set, the last value of each (None: removed)."""
    values: dict[str, Any] = {}
    for event in events:
        if event.kind == Event.ATTRIBUTES_SET:
            values.update(event.payload["values"])
    return values


def _folded(event: NewEvent | None) -> list[Any] | None:
    return None if event is None else [event.position, event.name, event.payload]


def _names(names: list[str]) -> str:
    """Names joined by commas; a name holds none (core/rules.py), checked anyway."""
    joined = ",".join(names)
    if names and joined.count(",") != len(names) - 1:
        raise StoreRejected(f"a name holds a comma: {names!r}")
    return joined


def _outcome(landed: tuple[bool, list[dict[str, Any]] | None] | None) -> CommitOutcome:
    if landed is None:
        return _LOST
    cancel, sent = landed
    if sent is not None:
        return CommitOutcome(True, cancel, tuple(sent))
    return _CANCEL if cancel else _LANDED


_LANDED, _CANCEL, _LOST = CommitOutcome(True), CommitOutcome(True, True), CommitOutcome(False)


