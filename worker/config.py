"""How a worker is sized and paced: `WorkerConfig`, checked when it is made."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

from shardq.core.builds import check_build_id
from shardq.core.daemons import MIN_POLL_S
from shardq.core.errors import InvalidArgument
from shardq.core.rules import Limits
from shardq.workflow.registry import DEFAULT_RETENTION_S


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 10
    """Turns running at once, over all shards (the turn threads)."""
    batch_size: int = 10
    """Most tasks one claim statement leases."""
    lease_s: float = 30.0
    poll_interval_s: float = 10.0
    """Safety poll: the longest a claim loop sleeps without a notification or a due timer."""
    drain_timeout_s: float = 30.0
    housekeeping_interval_s: float = 300.0
    """How often the worker purges finished runs past retention (worker/retention.py), one
    worker at a time per shard; 0 turns it off (run `shardq purge` instead)."""
    count_fold_interval_s: float = 5.0
    """How often the worker folds each served shard's appended count changes into its
    counters (schema/0029), one worker at a time per shard; counts stay exact without
    it, but read more rows the longer it is off. 0 turns it off."""
    default_retention_s: float = DEFAULT_RETENTION_S
    """Retention of runs whose definition sets none."""
    commit_batch: int = 500
    """Most commits one transaction groups; also how many finished turns may wait for
    their last commit before the worker stops claiming."""
    schedules: bool = True
    """Run the schedule ticker (docs/schedules.md): the workers are the scheduler."""
    limits: Limits = field(default_factory=Limits)
    """Bounds on what runs send (`ctx.signal_external` payloads and keys), as a Client's
    `limits` bound what its callers send: give both the same."""
    build_id: str | None = None
    """The build of the code this worker runs (docs/versioning.md, "Builds"): it claims
    runs pinned to this build as well as unpinned ones. None: unpinned ones only."""
    owner: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )

    def __post_init__(self) -> None:
        if self.build_id is not None:
            try:
                check_build_id(self.build_id)
            except InvalidArgument as exc:
                raise ValueError(str(exc)) from None
        if self.concurrency < 1 or self.batch_size < 1 or self.commit_batch < 1:
            raise ValueError("concurrency, batch size and commit batch must be >= 1")
        if self.lease_s <= 0 or self.drain_timeout_s < 0:
            raise ValueError("lease must be > 0 and drain timeout >= 0")
        if not self.poll_interval_s >= MIN_POLL_S:
            # NOTIFY and timers wake a claim loop; a shorter safety poll only
            # turns idle workers into a steady load on every shard.
            raise ValueError(f"poll interval must be at least {MIN_POLL_S} s, got "
                             f"{self.poll_interval_s}")
