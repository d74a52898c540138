"""The mover: moves a bucket range from the shard that owns it to another, online.

Per batch of whole buckets (docs/design/growing.md, section 4):

- F1 freeze, on the source A: clear the batch's `writable` bits (it stays
  `owned`), `unclean`, `fence_move`, `fence_target`. From here on a write to
  the batch's runs is refused by shardq.fence (SQ001, retry soon).
- F2 wait until every transaction of A's database that held an xid when F1
  committed has ended: those may have read the fence before F1 and still
  write. Bounded by `fence_wait_s`; on timeout unfreeze, back off, retry.
- S1 the switch, one transaction on the target B: binary COPY of the batch's
  rows from one REPEATABLE READ READ ONLY snapshot of A, B's sequences past
  the copied ids, the bits in B's `owned` and `writable`, map version N+1 on B,
  and the row in B's `applied_batches`. B owns the batch iff that row committed.
- R release, on A: clear the `owned` bits, version N+1; then home and every
  other shard get version N+1 (the others best effort).
- C cleanup, after a grace period: A's rows of the batch deleted in small
  transactions, then `unclean` cleared once nothing frozen or foreign is left.

Journal first, then act, on the home shard (moves, move_batches); every step is
re-entrant and a re-run decides from the shards' own state: `applied_batches`
on B, the bits on A. Only one mover runs per deployment: it holds a session
advisory lock on home for its whole run.

Every statement goes through the deployment's MoveStore (moves/store.py). For the
crash tests, failpoints `move.<point>@<batch>` (shards/failpoints.py) kill the
process at each step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg
from psycopg import IsolationLevel

from shardq.moves.deployment import Deployment, mover_lock
from shardq.moves.models import (
    BatchRecord,
    BatchResult,
    Cleanup,
    LateWriter,
    MoveOptions,
    MoveResult,
    PendingCleanup,
)
from shardq.moves.plan import (
    Batch,
    PlannedMove,
    bits,
    describe_ranges,
    owners,
    plan_batches,
    plan_rebalance,
    reassign,
)
from shardq.moves.store import TABLES
from shardq.shards.config import ShardMap
from shardq.shards.connections import DictConnection
from shardq.shards.errors import (
    ConfigError,
    MoveRunning,
    SchemaBehind,
    ShardqError,
    ShardUnavailable,
)
from shardq.shards.failpoints import failpoint

log = logging.getLogger(__name__)

ANALYZE_AFTER_ROWS = 1000
"""A table the move changed by fewer rows than this is left to autovacuum."""
CLEAN_CHUNK = 500
ORPHAN_WAIT_S = 5.0


# -- the mover ------------------------------------------------------------------------


class Mover:
    """Runs, resumes or aborts one move, under the mover's lock on home."""

    def __init__(self, dep: Deployment, home: DictConnection, options: MoveOptions,
                 progress: Callable[[str], None] | None = None) -> None:
        self.dep = dep
        self.store = dep.store
        self.home = home
        self.options = options
        self.progress = progress or (lambda _line: None)
        self._conns: dict[str, DictConnection] = {}
        self.source = self.target = ""
        # Rows this run copied into (or deleted from) each table of a shard since it
        # last analyzed that table there: see _keep_statistics.
        self._changed: dict[tuple[str, str], int] = {}

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def conn(self, name: str) -> DictConnection:
        """A direct autocommit connection to shard `name`, kept for the mover's run."""
        if name == self.dep.home:
            return self.home
        found = self._conns.get(name)
        if found is None or found.closed:
            found = self._conns[name] = self.dep.connect(name)
        return found

    # -- starting ----------------------------------------------------------------

    def start(self, first: int, last: int, target: str) -> int:
        """Check and journal a new move; return its id."""
        dep = self.dep
        unfinished = self.store.unfinished_move(self.home)
        if unfinished is not None:
            if (unfinished.first_bucket, unfinished.last_bucket,
                    unfinished.target) == (first, last, target):
                return unfinished.id
            raise MoveRunning(
                f"move {unfinished.id} (buckets {unfinished.first_bucket}-"
                f"{unfinished.last_bucket} from {unfinished.source} to "
                f"{unfinished.target}) is unfinished: run `shardq shards move --resume` "
                "or `--abort` first")
        dep.refresh({"home": self.home})
        if target not in dep.names:
            raise ConfigError(f"unknown shard {target!r}: the map (version {dep.version}) has "
                              f"{', '.join(dep.names)}")
        parts = owners(dep.layout, first, last)
        if len(parts) > 1:
            listed = "; ".join(f"{a}-{b} on {who}" for a, b, who in parts)
            raise ConfigError(f"buckets {first}-{last} span {len(parts)} owners ({listed}): "
                              "move each part on its own")
        source = parts[0][2]
        if source == target:
            raise ConfigError(f"{target} already owns buckets {first}-{last} "
                              f"(it owns {describe_ranges(dep.layout, target)})")
        src, dst = self.conn(source), self.conn(target)
        own = self.store.ownership(src)
        if own is None or own.owned[first:last + 1] != "1" * (last - first + 1):
            raise ConfigError(f"{source} does not own all of buckets {first}-{last} by its "
                              "own record: its ownership disagrees with the map")
        have = {n: self.store.schema_version(c) for n, c in ((source, src), (target, dst))}
        if have[source] != have[target]:
            raise SchemaBehind(f"schema versions differ ({source} {have[source]}, {target} "
                               f"{have[target]}): run `shardq migrate` on both first")
        batches = plan_batches(self.store.bucket_counts(src, first, last), first, last,
                               self.options.max_batch_runs, self.options.max_batch_rows)
        move = self.store.journal_move(
            self.home, first=first, last=last, source=source, target=target,
            from_version=dep.version, max_runs=self.options.max_batch_runs,
            max_rows=self.options.max_batch_rows, grace_s=self.options.grace_s,
            batches=batches)
        self.progress(f"move {move}: buckets {first}-{last} from {source} to {target}, "
                      f"{len(batches)} batch(es), {sum(b.runs for b in batches)} runs")
        failpoint("move.plan", 0)
        return move

    # -- carrying a move out ------------------------------------------------------

    def run(self, move: int, *, abort: bool = False, wait: bool = True) -> MoveResult:
        """Finish (or roll back) move `move` from wherever it stopped, then delete the
        copies its source keeps (and those earlier moves left) once their grace period
        is over: waiting for it when `wait`, else leaving what is not due yet."""
        started = time.monotonic()
        row = self.store.move(self.home, move)
        assert row is not None
        result = MoveResult(move, row.first_bucket, row.last_bucket, row.source, row.target,
                            "moving")
        self.source, self.target = row.source, row.target
        limits = (row.max_batch_runs, row.max_batch_rows)
        # The journal is read again after each batch: a slow one re-plans those after it.
        while (b := self._batch_after(move, result.batches[-1].batch if result.batches
                                      else -1)) is not None:
            item = BatchResult(b.batch, b.first_bucket, b.last_bucket, b.phase, b.runs,
                               b.rows_copied, b.paused_ms, b.map_version)
            result.batches.append(item)
            if b.phase in ("released", "cleaned", "rolled_back"):
                continue
            batch = Batch(item.first, item.last, b.planned_runs, b.planned_rows)
            if abort:
                self._roll_back(move, item, batch)
            else:
                began = time.monotonic()
                self._move_batch(move, item, batch)
                self._keep_statistics(self.target)
                limits = self._lower_batch_size(move, item, limits)
                self.options.pace(began)
        # Every batch switched or went back: the map change is complete, and the journal
        # says so before the cleanup, which is housekeeping that never blocks a new move.
        # An abort that found every batch switched rolled nothing back: the move is done.
        rolled_back = any(item.phase == "rolled_back" for item in result.batches)
        result.phase = "aborted" if rolled_back else "done"
        if row.phase != result.phase:
            self.store.set_move_phase(self.home, move, result.phase)
        self.dep.refresh({"home": self.home})
        result.map_version = self.dep.version
        result.cleanup = self.clean_up(wait=wait, current=move)
        for item in result.batches:
            if (move, item.batch) in result.cleanup.cleaned:
                item.phase = "cleaned"
        result.seconds = time.monotonic() - started
        return result

    def _lower_batch_size(self, move: int, item: BatchResult,
                          limits: tuple[int, int]) -> tuple[int, int]:
        """Re-plan the batches after `item` at half its size when its pause exceeded
        --max-pause; the limits in force afterwards.

        A batch's pause grows with what it copies (the rows, and the server's load
        meanwhile), and every run of the batch is refused for all of it. Only batches
        journaled `planned` are re-planned: none of them was ever frozen (the journal
        says `fenced` before a freeze), so none is on the target under its number.
        """
        bound = self.options.max_pause_s
        if not bound or item.paused_ms is None or item.paused_ms <= bound * 1000:
            return limits
        later = [b for b in self.store.batches(self.home, move) if b.batch > item.batch]
        if not later or any(b.phase != "planned" for b in later):
            return limits
        runs = max(1, min(limits[0], item.runs or limits[0]) // 2)
        rows = max(1, min(limits[1], item.rows or limits[1]) // 2)
        first, last = later[0].first_bucket, later[-1].last_bucket
        counts = self.store.bucket_counts(self.conn(self.source), first, last)
        batches = plan_batches(counts, first, last, runs, rows)
        if len(batches) <= len(later):
            return limits  # single buckets already, or nothing gained
        self.store.replan_batches(self.home, move, item.batch, batches, max_runs=runs,
                                  max_rows=rows)
        self.progress(f"batch {item.batch} paused {item.paused_ms} ms, above --max-pause "
                      f"{bound:g} s: the {len(later)} batch(es) after it re-planned as "
                      f"{len(batches)} of at most {runs} runs and {rows} rows")
        return runs, rows

    def clean_up(self, *, wait: bool, current: int | None = None) -> Cleanup:
        """Delete the copy each source keeps of a switched batch, of any move, once the
        batch's grace period is over; wait for those not due when `wait`.

        The due times are read once and kept as deadlines, so the waits overlap: the
        whole cleanup waits for the last batch's grace period, not for one per batch
        in turn (a killed 11-batch move took 9 minutes to resume that way).
        """
        done = Cleanup()
        rows = self.store.pending_cleanups(self.home)
        read_at = time.monotonic()
        sources = {self.source} if current is not None else set()
        if rows and wait:
            longest = max(r.due_in_s for r in rows)
            if longest > 0:
                self.progress(_waiting(rows, longest))
        for row in rows:
            left = read_at + row.due_in_s - time.monotonic()
            if left > 0 and not wait:
                done.pending.append(row.as_dict())
                continue
            if left > 0:
                time.sleep(left)
                done.waited_s += left
            source = row.source
            try:
                deleted = self._delete_range(
                    self.conn(source), Batch(row.first_bucket, row.last_bucket, 0, 0),
                    chunked=True, number=row.batch)
            except (ShardUnavailable, psycopg.OperationalError) as exc:
                if row.move_id == current:
                    raise
                # An earlier move's source that is down keeps its copy until a later run.
                log.warning("copy of batch %d of move %d on %s left for later: %s",
                            row.batch, row.move_id, source, exc)
                self._conns.pop(source, None)
                done.pending.append(row.as_dict())
                continue
            # Runs, not rows: every table lost about as many of its rows as it has per run.
            for table in TABLES:
                self._changed[source, table] = self._changed.get((source, table), 0) + deleted
            self._journal(row.move_id, row.batch, "cleaned")
            done.cleaned.append((row.move_id, row.batch))
            done.deleted_runs += deleted
            sources.add(source)
            log.info("cleaned batch %d of move %d: %d runs deleted on %s", row.batch,
                     row.move_id, deleted, source)
            failpoint("move.cleaned", row.batch)
        for source in sorted(sources):
            self._keep_statistics(source)
            self.store.mark_clean(self.conn(source))
        if done.cleaned:
            self.progress(f"deleted the sources' copies of {len(done.cleaned)} switched "
                          f"batch(es): {done.deleted_runs} runs")
        return done

    def _batch_after(self, move: int, after: int) -> BatchRecord | None:
        return next((b for b in self.store.batches(self.home, move) if b.batch > after), None)

    def _journal(self, move: int, batch: int, phase: str) -> None:
        self.store.set_batch_phase(self.home, move, batch, phase)

    def _move_batch(self, move: int, item: BatchResult, batch: Batch) -> None:
        target = self.target
        version = self._applied(move, item.batch, target)
        if version is None:
            # Journal first: a mover that dies between the freeze and the journal must
            # not leave paused runs behind a journal that says the batch is only planned.
            self._journal(move, item.batch, "fenced")
            item.phase = "fenced"
            try:
                frozen_at = self._freeze(move, item.batch, batch)
            except ShardUnavailable:
                self._journal(move, item.batch, "planned")  # gave up, nothing frozen
                raise
            failpoint("move.fenced", item.batch)
            version = self._switch(move, item, batch, frozen_at)
            self.store.batch_switched(self.home, move, item.batch, version=version,
                                      runs=item.runs, rows=item.rows,
                                      paused_ms=item.paused_ms)
        else:
            self.store.batch_switched_found(self.home, move, item.batch, version)
        item.phase, item.map_version = "switched", version
        self._release(move, item, batch, version)

    def _roll_back(self, move: int, item: BatchResult, batch: Batch) -> None:
        source, target = self.source, self.target
        version = self._applied(move, item.batch, target)
        if version is not None:
            # Switched: the target owns it, and a finished part of a move is a valid map.
            item.map_version = version
            self._release(move, item, batch, version)
            return
        self.store.unfreeze(self.conn(source), bits(batch.first, batch.last))
        self._journal(move, item.batch, "rolled_back")
        item.phase = "rolled_back"
        self.progress(f"batch {item.batch} ({batch.first}-{batch.last}) rolled back: "
                      f"{source} owns it")

    # -- F1, F2 -------------------------------------------------------------------

    def _freeze(self, move: int, number: int, batch: Batch) -> float:
        """Freeze the batch on the source and wait out its writers; the freeze's time."""
        source, target = self.source, self.target
        src = self.conn(source)
        mask = bits(batch.first, batch.last)
        backoff = 0.05
        for attempt in range(self.options.fence_retries + 1):
            if not self.store.freeze(src, mask, move, target):
                raise ShardqError(f"{source} no longer owns buckets {batch.first}-{batch.last} "
                                  f"but {target} has no switch of batch {number} of move "
                                  f"{move}: resolve by hand")
            frozen_at = time.monotonic()
            failpoint("move.freeze", number)
            blocking = self._wait_for_writers(src)
            if not blocking:
                return frozen_at
            self.store.unfreeze(src, mask)
            log.warning("writers outlived the fence wait on %s, unfrozen to retry: %s",
                        source, ", ".join(f"pid {b.pid} ({b.application_name}, "
                                          f"{b.age_s:.1f} s)" for b in blocking))
            if attempt < self.options.fence_retries:
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        raise ShardUnavailable(f"{source}: transactions kept writing past the fence wait "
                               f"({self.options.fence_wait_s:g} s, {self.options.fence_retries}"
                               " retries): the move stopped with nothing frozen; resume later")

    def _wait_for_writers(self, src: DictConnection) -> list[LateWriter]:
        """Wait until every transaction holding an xid now has ended; those left at the bound."""
        writers = self.store.writers(src)
        if not writers:
            return []
        deadline = time.monotonic() + self.options.fence_wait_s
        while True:
            left = self.store.writers_left(src, writers)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.005)

    # -- S1 -----------------------------------------------------------------------

    def _applied(self, move: int, batch: int, target: str) -> int | None:
        """The version batch `batch` switched to on the target, None if it did not.

        Waits first for a switch of that batch still running in an orphaned
        backend (a killed mover's), ending it after ORPHAN_WAIT_S.
        """
        dst = self.dep.connect(target, autocommit=False)
        try:
            deadline = time.monotonic() + ORPHAN_WAIT_S
            with dst.transaction():
                while not self.store.try_switch_lock(dst, move, batch):
                    if time.monotonic() > deadline:
                        with dst.transaction():
                            self.store.end_orphaned_switch(dst, _switch_name(move, batch))
                        self.store.switch_lock(dst, move, batch)
                        break
                    time.sleep(0.05)
                return self.store.applied_batch(dst, move, batch)
        finally:
            dst.close()

    def _switch(self, move: int, item: BatchResult, batch: Batch, frozen_at: float) -> int:
        source, target = self.source, self.target
        # The next version after the newest that home, source or target holds.
        self.dep.refresh({n: self.conn(n) for n in (self.dep.home, source, target)})
        version = self.dep.version + 1
        new_layout = reassign(self.dep.layout, batch.first, batch.last, target)
        mask = bits(batch.first, batch.last)
        dst = self.dep.connect(target, autocommit=False)
        src = self.dep.connect(source, autocommit=False)
        src.isolation_level = IsolationLevel.REPEATABLE_READ
        src.read_only = True
        try:
            with dst.transaction():
                self.store.set_application_name(dst, _switch_name(move, item.batch))
                self.store.switch_lock(dst, move, item.batch)
                if self.store.applied_batch(dst, move, item.batch) is not None:
                    raise ShardqError(f"batch {item.batch} of move {move} switched under us")
                own = self.store.ownership(dst)
                if own is not None and own.unclean:
                    self._delete_range(dst, batch, chunked=False)
                self.store.move_session(dst)
                with src.transaction():
                    ids = self.store.batch_runs(src, batch.first, batch.last)
                    maxima = self.store.batch_maxima(src, ids)
                    copied: dict[str, int] = {}
                    for table in TABLES:
                        copied[table] = self.store.copy(src, dst, table, ids, batch)
                        if table == "history":
                            failpoint("move.copy", item.batch)
                    rows = sum(copied.values())
                self.store.take_batch(dst, move, item.batch, bits=mask, version=version,
                                      layout=new_layout, maxima=maxima)
                failpoint("move.switch", item.batch)
            item.paused_ms = round((time.monotonic() - frozen_at) * 1000)
            item.runs, item.rows = len(ids), rows
            for table, count in copied.items():
                self._changed[target, table] = self._changed.get((target, table), 0) + count
            failpoint("move.switched", item.batch)
        finally:
            dst.close()
            src.close()
        self.progress(f"batch {item.batch} ({batch.first}-{batch.last}): {len(ids)} runs, "
                      f"{rows} rows switched to {target} as version {version}, paused "
                      f"{item.paused_ms} ms")
        return version

    def _keep_statistics(self, name: str) -> None:
        """ANALYZE the tables of shard `name` this run has changed by at least as many
        rows as their statistics describe (so at most a few times per table per move).

        A copy or a cleanup changes a table far faster than autovacuum notices (a
        minute's naptime, if it runs at all), and the planner then plans by a table
        a fraction of its size: measured with the reshard benchmark at 100,000 runs,
        claims on the target took 1-6 s each (sequential scans of executions and
        history, by then hundreds of thousands of rows) until its tables were
        analyzed, and the drain on other buckets fell to 0.09 of its rate.
        """
        changed = {t: n for (shard, t), n in self._changed.items() if shard == name and n}
        if not changed:
            return
        conn = self.conn(name)
        described = self.store.table_rows(conn, list(changed))
        for table, count in changed.items():
            if count < max(ANALYZE_AFTER_ROWS, described.get(table, -1.0)):
                continue
            # Never queued behind an operator's VACUUM of the table: skipped, it is
            # tried again after the next batch.
            if not self.store.analyze(conn, table):
                log.info("%s on %s is being vacuumed: analyzed later", table, name)
                continue
            self._changed[name, table] = 0
            log.info("analyzed %s on %s after %d rows changed by the move", table, name, count)

    def _delete_range(self, conn: DictConnection, batch: Batch, *, chunked: bool,
                      number: int = -1) -> int:
        """Delete the rows of the batch's buckets `conn`'s shard does not own."""
        deleted = 0
        while True:
            ids = self.store.leftover_runs(conn, batch.first, batch.last, CLEAN_CHUNK)
            if not ids:
                self.store.delete_leftover_keys(conn, batch.first, batch.last)
                return deleted
            if chunked:
                began = time.monotonic()
                with conn.transaction():
                    self.store.delete_runs(conn, ids)
                failpoint("move.clean", number)
                self.options.pace(began)
            else:
                self.store.delete_runs(conn, ids)
            deleted += len(ids)

    # -- R, C ---------------------------------------------------------------------

    def _release(self, move: int, item: BatchResult, batch: Batch, version: int) -> None:
        source, target = self.source, self.target
        layout = self.store.map_layout(self.conn(target), version)
        assert layout is not None, f"{target} lacks map version {version} it switched to"
        self.store.release(self.conn(source), bits=bits(batch.first, batch.last),
                           version=version, layout=layout)
        failpoint("move.release", item.batch)
        self.store.add_map(self.home, version, layout)
        self.store.batch_released(self.home, move, item.batch, version)
        item.phase, item.map_version = "released", version
        for name in self.dep.names:
            if name in (source, target, self.dep.home):
                continue
            try:
                self.store.add_map(self.conn(name), version, layout)
            except (ShardUnavailable, psycopg.Error) as exc:
                # Best effort: a process reading an older version from it is
                # corrected by the first refusal of the shard it then writes to.
                log.warning("map version %d not written to %s: %s", version, name, exc)
                self._conns.pop(name, None)
        failpoint("move.released", item.batch)


def _waiting(rows: list[PendingCleanup], longest: float) -> str:
    sources = ", ".join(sorted({r.source for r in rows}))
    return (f"every batch has switched: the map change is complete. Waiting {longest:.0f} s "
            f"more before deleting {sources}'s copy of {len(rows)} switched batch(es): the "
            "grace period (--grace) lets reads planned on the previous map version finish "
            "against it. --no-wait returns at the switch and leaves the deletion to "
            "`shardq shards move --resume` or the next move.")


def _switch_name(move: int, batch: int) -> str:
    return f"shardq-mover/{move}/{batch}"


# -- entry points -----------------------------------------------------------------------


def move(seeds: ShardMap, first: int | None, last: int | None, target: str | None,
         options: MoveOptions | None = None, *, resume: bool = False, abort: bool = False,
         wait: bool = True, progress: Callable[[str], None] | None = None) -> MoveResult:
    """Move buckets first..last to `target`; or resume or abort the unfinished move.

    Returns once every batch has switched and, when `wait`, the sources' copies are
    deleted after their grace period. `resume` with no unfinished move finishes the
    cleanup a move left (of the latest such move, with every other one's).
    """
    options = options or MoveOptions()
    dep = Deployment.load(seeds)
    with mover_lock(dep) as home:
        mover = Mover(dep, home, options, progress)
        try:
            if resume or abort:
                unfinished = dep.store.unfinished_move(home)
                uncleaned = dep.store.latest_uncleaned_move(home)
                if unfinished is None and uncleaned is not None and abort:
                    raise ConfigError(
                        f"no unfinished move to abort: move {uncleaned} is done (every "
                        "batch switched); its source keeps a copy of the moved runs until "
                        "`shardq shards move --resume` deletes it")
                number = unfinished.id if unfinished is not None else uncleaned
                if number is None:
                    raise ConfigError("no unfinished move to " + ("abort" if abort else "resume")
                                      + (" and no copy left to clean up" if resume else ""))
            else:
                assert first is not None and last is not None and target is not None
                number = mover.start(first, last, target)
            return mover.run(number, abort=abort, wait=wait)
        finally:
            mover.close()


def clean_up(seeds: ShardMap, options: MoveOptions | None = None, *, wait: bool = True,
             progress: Callable[[str], None] | None = None) -> Cleanup:
    """Delete the copies earlier moves left, once their grace period is over."""
    dep = Deployment.load(seeds)
    with mover_lock(dep) as home:
        mover = Mover(dep, home, options or MoveOptions(), progress)
        try:
            return mover.clean_up(wait=wait)
        finally:
            mover.close()


def rebalance_plan(seeds: ShardMap) -> tuple[Deployment, list[PlannedMove], dict[str, int]]:
    """The moves that even runs per shard, and each shard's runs now."""
    dep = Deployment.load(seeds)
    runs: dict[int, int] = {}
    per_shard = {}
    for name in dep.names:
        with dep.connect(name) as conn:
            counted = dep.store.runs_per_bucket(conn)
        runs.update(counted)
        per_shard[name] = sum(counted.values())
    return dep, plan_rebalance(dep.layout, runs), per_shard


def rebalance(seeds: ShardMap, options: MoveOptions | None = None, *, wait: bool = True,
              progress: Callable[[str], None] | None = None) -> tuple[list[MoveResult], Cleanup]:
    """Carry out the rebalancing plan, one move at a time, each returning at its last
    switch; then delete the sources' copies after one grace period (when `wait`)."""
    _dep, plan, _runs = rebalance_plan(seeds)
    done = [move(seeds, m.first, m.last, m.target, options, wait=False, progress=progress)
            for m in plan]
    return done, clean_up(seeds, options, wait=wait, progress=progress)
