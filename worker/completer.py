"""Commit turn writes for one shard, grouping those that arrive together into one transaction.

Whatever queued up while the previous transaction ran goes into the next one
(group commit): at low load each commit is its own transaction, under load
hundreds share one. A mid-turn checkpoint blocks its turn until it is durable
(`submit`); the commit that ends a turn is handed over with a callback
(`submit_async`) so the turn's thread takes the next claimed run at once; a
one-step job never blocks a thread on the database. Per-execution order holds
because an execution makes its next commit only after the previous one's
outcome is known.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable

from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from shardq.core import tracing
from shardq.core.errors import ShardUnavailable, StoreConflict, StoreRejected
from shardq.core.instruments import COMMIT_BATCH, COMMIT_SECONDS
from shardq.core.models import CommitOutcome, TurnCommit
from shardq.shards.config import Shard
from shardq.shards.errors import NotOwner
from shardq.store.protocol import WorkerStore

log = logging.getLogger(__name__)

Result = CommitOutcome | Exception
"""A commit's outcome, or why it could not be made (StoreRejected, ShardUnavailable...)."""
OnDone = Callable[[Result], None]
Pending = tuple[TurnCommit, OnDone]


class _Waiter:
    """The cheapest one-shot hand-off between two threads: a lock released once."""

    __slots__ = ("_lock", "result")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.result: Result = CommitOutcome(landed=False)

    def __call__(self, result: Result) -> None:
        self.result = result
        self._lock.release()

    def wait(self) -> Result:
        self._lock.acquire()
        return self.result


class Completer:
    """Group commit of one shard's turn commits.

    Threads: its own (`shardq-completer-<shard>`) takes the queued commits,
    applies them in batches and runs their `on_done` callbacks. `submit` and
    `submit_async` are called by turn threads, `submit_async` also by those
    callbacks; `submit` commits on the calling turn thread itself when nothing
    is queued or being applied, so the store is called from several threads at
    once (each call takes its own pooled connection). `close` is called once,
    by the worker's stop(); `_closing` makes it and `submit_async` agree on
    whether a commit got into the queue.

    `_busy` is written by the completer's thread only, and `submit` reads it
    (and the queue's emptiness) without a lock: a stale read is harmless. Seen
    False while a batch is being applied, a checkpoint commits alone beside the
    batch, which holds other executions only (an execution makes its next
    commit only once its previous one is settled); seen True just after, the
    checkpoint is queued and waits for the completer's thread, slower but
    correct. A lock there would cost every checkpoint.
    """

    def __init__(
        self,
        store: WorkerStore,
        shard: Shard,
        *,
        lease_s: float,
        max_batch: int = 500,
        retry_for_s: float | None = None,
    ) -> None:
        self._store = store
        self._shard = shard
        self._lease_s = lease_s
        self._max_batch = max_batch
        # A lost connection is retried for up to half a lease: the commits carry
        # their next token, so a retry of one that already landed is recognised.
        self._retry_for_s = lease_s / 2 if retry_for_s is None else retry_for_s
        self._batch_sizes = COMMIT_BATCH.labels(shard.name)
        self._latency = COMMIT_SECONDS.labels(shard.name)
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._closing = threading.Lock()
        self._busy = False  # a batch is being applied: new commits should queue behind it
        self._thread = threading.Thread(
            target=self._run, name=f"shardq-completer-{shard.name}", daemon=True
        )

    def start(self) -> Completer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop taking commits; later submitters are told their lease is gone."""
        with self._closing:
            self._closed.set()
            self._queue.put(None)
        if self._thread.ident is not None:  # a worker stopped before it started has none
            self._thread.join(timeout=10)

    def submit(self, commit: TurnCommit) -> CommitOutcome:
        """Block until `commit` is durable (or refused by its fence); raises on store errors."""
        if not self._busy and self._queue.empty() and not self._closed.is_set():
            # Nothing to group it with: commit on this thread and spare the two
            # thread hand-offs (an idle worker's signal -> resumed step path).
            # Racing an arriving batch is harmless: the executions differ.
            return self._commit_alone(commit)
        waiter = _Waiter()
        self.submit_async(commit, waiter)
        result = waiter.wait()
        if isinstance(result, Exception):
            raise result
        return result

    def submit_async(self, commit: TurnCommit, on_done: OnDone) -> None:
        """Queue `commit`; `on_done` gets its outcome or error on the completer's thread.

        `on_done` must be quick and must not block on this completer (it may
        queue another commit). After close() it is called at once with
        `landed=False`.
        """
        with self._closing:  # nothing may be queued behind the closing sentinel
            if not self._closed.is_set():
                self._queue.put((commit, on_done))
                return
        on_done(CommitOutcome(landed=False))

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            self._busy = True
            batch = [first]
            ids = {first[0].execution_id}
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                # One commit per run per call, and a run has one in flight: a
                # second would go in the next batch, after its first.
                if item[0].execution_id in ids:
                    self._queue.put(item)
                    break
                batch.append(item)
                ids.add(item[0].execution_id)
            self._apply(batch)
            self._busy = False
        self._drain_closed()

    def _commit_alone(self, commit: TurnCommit) -> CommitOutcome:
        try:
            return self._commit([commit])[commit.execution_id]
        except StoreRejected:
            raise
        except Exception as exc:
            log.warning("commit failed", extra={"shard": self._shard.name, "error": str(exc),
                                                "commits": 1})
            raise

    def _drain_closed(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                _call(item[1], CommitOutcome(landed=False))

    def _apply(self, batch: list[Pending]) -> None:
        try:
            outcomes = self._commit([c for c, _ in batch])
        except StoreRejected as exc:
            if len(batch) == 1:
                _call(batch[0][1], exc)
                return
            # One commit poisoned the group: commit each alone so the others land.
            for item in batch:
                self._apply([item])
            return
        except Exception as exc:
            log.warning(
                "commit failed", extra={"shard": self._shard.name, "error": str(exc),
                                        "commits": len(batch)},
            )
            for _, on_done in batch:
                _call(on_done, exc)
            return
        for commit, on_done in batch:
            _call(on_done, outcomes[commit.execution_id])

    def _commit(self, commits: list[TurnCommit]) -> dict[uuid.UUID, CommitOutcome]:
        self._batch_sizes.observe(len(commits))
        started = time.perf_counter()
        # One span per batch, linked to the turns it commits (each its own trace).
        span = tracing.start_span(
            "shardq.commit", kind=tracing.CLIENT, links=[c.trace for c in commits],
            attributes={"shardq.shard": self._shard.name, "shardq.commits": len(commits)},
        ) if any(c.trace for c in commits) else None
        failure: BaseException | None = None
        try:
            return self._commit_retrying(commits)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            tracing.end(span, failure)
            self._latency.observe(time.perf_counter() - started)

    def _commit_retrying(self, commits: list[TurnCommit]) -> dict[uuid.UUID, CommitOutcome]:
        results: dict[uuid.UUID, CommitOutcome] = {}
        pending = commits
        # A NotOwner (or Fenced) here is a same-shard send's target that a move froze
        # or took between the commit's read of what this shard can write and the
        # send's own fence: the batch stored nothing, and its retry reads the move
        # and queues that send for the relay (commit_turns_v2, local_away).
        retrying = Retrying(
            retry=retry_if_exception_type((ShardUnavailable, StoreConflict, NotOwner)),
            stop=stop_after_delay(self._retry_for_s),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    # The broken attempt may have committed: those must not be
                    # applied again (their lease token has rotated).
                    landed = self._store.landed_commits(self._shard, pending)
                    results.update({i: CommitOutcome(landed=True) for i in landed})
                    pending = [c for c in pending if c.execution_id not in landed]
                if pending:
                    results.update(
                        self._store.commit_turns(self._shard, pending, lease_s=self._lease_s)
                    )
                return results
        raise AssertionError("unreachable: tenacity reraises")


def _call(on_done: OnDone, result: Result) -> None:
    try:
        on_done(result)
    except Exception:  # one bad callback must not stop the shard's commits
        log.exception("commit callback failed")
