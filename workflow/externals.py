"""Signals a turn sends to other runs: each recorded at a call position of its own.

A target on the sender's shard gets its signal in the turn's commit (the
journal's `externals`); one on another shard gets an outbox row in that commit
(`outbox`), which the relay delivers. Replay returns what was recorded and
sends nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from shardq.core.errors import (
    InvalidArgument,
)
from shardq.core.models import (
    Event,
    ExternalRequest,
    ExternalSignal,
    NewEvent,
    OutboxRequest,
    SignalRequest,
)
from shardq.core.rules import (
    Limits,
    check_signal,
    check_signal_name,
)
from shardq.shards.routing import bucket_of, parse_execution_id
from shardq.workflow.journal import Journal
from shardq.workflow.recorded import (
    external_result,
)
from shardq.workflow.replay import Replay

MAX_EXTERNAL_BATCH = 10_000
"""Signals one `signal_external_many` call may send: its targets are locked in one commit."""


def record_externals(
    signals: Sequence[SignalRequest], replay: Replay, journal: Journal, *, limits: Limits,
    on_this_shard: Callable[[uuid.UUID], bool] | None, guard: Callable[[], None],
) -> tuple[list[ExternalSignal | None], list[int]]:
    """Journal what the signals send: (each one's result where already known: recorded,
    or queued for the relay; the indexes of those delivered on this shard, whose results
    the journal's next flush answers). A bad name, key or payload raises first."""
    if len(signals) > MAX_EXTERNAL_BATCH:
        raise InvalidArgument(f"at most {MAX_EXTERNAL_BATCH} signals in one call, "
                              f"got {len(signals)}")
    targets = [parse_execution_id(s.execution_id) for s in signals]
    for s in signals:
        check_signal_name(s.name)
    guard()
    calls = [replay.next("external", s.name) for s in signals]
    # Checked only when sent: a replay returns what was recorded, whatever the
    # code computes now.
    checked = {i: check_signal(s.name, s.payload, s.idempotency_key, limits)
               for i, (s, (_, recorded)) in enumerate(zip(signals, calls, strict=True))
               if not recorded}
    results: list[ExternalSignal | None] = [None] * len(signals)
    here: list[int] = []
    for index, (ident, (position, recorded)) in enumerate(zip(targets, calls, strict=True)):
        if recorded:
            results[index] = external_result(recorded[0].payload)
            continue
        name, encoded, key = checked[index]
        if on_this_shard is not None and on_this_shard(ident):
            journal.externals.append(ExternalRequest(position, ident, name, encoded, key))
            here.append(index)
        else:
            queued = {"target": str(ident), "name": name, "idempotency_key": key,
                      "queued": True}
            journal.outbox.append(
                OutboxRequest(position, ident, bucket_of(ident), name, encoded, key))
            journal.events.append(NewEvent(position, Event.EXTERNAL_QUEUED, name, queued))
            results[index] = external_result(queued)
    return results, here
