"""A move's values: what an operator asks of a move (MoveOptions), what a mover's run
reports (MoveResult, BatchResult, Cleanup), and what the move store reads (the
journal's moves and batches, the copies left to clean up, a shard's ownership row,
the writers a freeze waits for, the lock's holder). No SQL, no driver types; each
field of a record is a column of the statement that reads it (moves/queries.sql).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardq.shards.errors import ConfigError

# -- what an operator asks of a move, and what a mover's run reports ---------------------


@dataclass(frozen=True)
class MoveOptions:
    max_batch_runs: int = 1000
    max_batch_rows: int = 50_000
    fence_wait_s: float = 1.0
    fence_retries: int = 10
    grace_s: float = 60.0
    max_pause_s: float = 1.0
    """A batch whose pause (freeze to switch) took longer halves the batch size of the
    batches not started yet, down to one run. 0: never."""
    rest: float = 1.0
    """After each batch (and each chunk of cleanup), rest this many times as long as it
    took: a move is background work, and on a busy server the copy's CPU and I/O are
    taken from the shard's own traffic. 0 moves at full speed."""

    def __post_init__(self) -> None:
        if self.max_batch_runs <= 0 or self.max_batch_rows <= 0:
            raise ConfigError("batch sizes must be positive (--batch-runs, --batch-rows)")
        if not 0 <= self.grace_s <= 1e9 or not 0 < self.fence_wait_s <= 3600:
            raise ConfigError("--grace must be >= 0 and --fence-wait > 0 seconds")
        if not 0 <= self.max_pause_s <= 3600:  # nan fails too
            raise ConfigError("--max-pause must be within 0..3600 seconds")
        if not 0 <= self.rest <= 100:  # nan fails too
            raise ConfigError("--rest must be within 0..100 (times a batch's own time)")

    def pace(self, since: float) -> None:
        """Rest in proportion to the work done since `since` (time.monotonic())."""
        if self.rest > 0:
            time.sleep(self.rest * (time.monotonic() - since))


@dataclass
class BatchResult:
    batch: int
    first: int
    last: int
    phase: str
    runs: int | None = None
    rows: int | None = None
    paused_ms: int | None = None
    map_version: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "buckets": [self.first, self.last], "phase": self.phase,
                "runs": self.runs, "rows": self.rows, "paused_ms": self.paused_ms,
                "map_version": self.map_version}


@dataclass
class Cleanup:
    """What a mover's run did about the copies sources keep of switched batches (of
    its own move and of earlier ones): deleted, or left for their grace period."""

    deleted_runs: int = 0
    cleaned: list[tuple[int, int]] = field(default_factory=list)
    """(move, batch) of each batch whose copy was deleted."""
    pending: list[dict[str, Any]] = field(default_factory=list)
    """Copies left: move, batch, buckets, source, due_at (when the grace period ends)."""
    waited_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"deleted_runs": self.deleted_runs, "batches_cleaned": len(self.cleaned),
                "waited_s": round(self.waited_s, 3),
                "pending": [{**p, "due_at": p["due_at"].isoformat()} for p in self.pending]}


@dataclass
class MoveResult:
    move: int
    first: int
    last: int
    source: str
    target: str
    phase: str
    batches: list[BatchResult] = field(default_factory=list)
    seconds: float = 0.0
    map_version: int = 0
    cleanup: Cleanup = field(default_factory=Cleanup)

    def as_dict(self) -> dict[str, Any]:
        runs = sum(b.runs or 0 for b in self.batches)
        pauses = [b.paused_ms for b in self.batches if b.paused_ms is not None]
        return {
            "move": self.move, "buckets": [self.first, self.last], "source": self.source,
            "target": self.target, "phase": self.phase, "map_version": self.map_version,
            "runs_moved": runs, "seconds": round(self.seconds, 3),
            "runs_per_second": round(runs / self.seconds, 1) if self.seconds > 0 else None,
            "max_pause_ms": max(pauses, default=None),
            "batches": [b.as_dict() for b in self.batches],
            "cleanup": self.cleanup.as_dict(),
        }


# -- what the move store reads ----------------------------------------------------------



@dataclass(frozen=True)
class MoveRecord:
    """A move as the journal on home has it (shardq.moves)."""

    id: int
    first_bucket: int
    last_bucket: int
    source: str
    target: str
    phase: str
    """`moving` or `cleaning` (unfinished), `done` or `aborted`."""
    from_version: int
    max_batch_runs: int
    max_batch_rows: int
    grace_s: float
    started_at: datetime


@dataclass(frozen=True)
class BatchRecord:
    """A batch of a move as the journal has it (shardq.move_batches)."""

    batch: int
    first_bucket: int
    last_bucket: int
    phase: str
    """`planned`, `fenced`, `switched`, `released`, `cleaned` or `rolled_back`."""
    planned_runs: int
    planned_rows: int
    runs: int | None
    rows_copied: int | None
    paused_ms: int | None
    map_version: int | None
    released_at: datetime | None


@dataclass(frozen=True)
class PendingCleanup:
    """A switched batch whose source still keeps its copy."""

    move_id: int
    batch: int
    first_bucket: int
    last_bucket: int
    source: str
    due_at: datetime
    """When the move's grace period after the batch's release ends."""
    due_in_s: float
    """Seconds until then by home's clock, 0 once due."""

    def as_dict(self) -> dict[str, Any]:
        """As a mover's run reports a copy it left (Cleanup.pending)."""
        return {"move": self.move_id, "batch": self.batch,
                "buckets": [self.first_bucket, self.last_bucket], "source": self.source,
                "due_at": self.due_at}


@dataclass(frozen=True)
class Ownership:
    """A shard's own ownership row, its bitmaps as text (bucket 0 first)."""

    deployment: uuid.UUID
    map_version: int
    writable: str
    owned: str
    unclean: bool
    """The shard holds rows of buckets it cannot write (a move off it not cleaned up)."""
    fence_move: int | None
    fence_target: str | None


@dataclass(frozen=True)
class Writer:
    """A transaction a freeze waits for: it held an xid when the freeze committed."""

    pid: int
    xid: str


@dataclass(frozen=True)
class LateWriter:
    """A writer still running past the fence wait, for the warning that names it."""

    pid: int
    application_name: str
    age_s: float


@dataclass(frozen=True)
class LockHolder:
    """The session holding the mover's lock on home."""

    pid: int
    application_name: str
    host: str
    backend_start: datetime


@dataclass(frozen=True)
class BatchMaxima:
    """The largest sequence values among a batch's rows: the target's sequences go past
    them so its later rows sort after the copied ones. None: the batch has no such row."""

    history_seq: int | None
    signal_id: int | None
