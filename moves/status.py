"""What `shardq shards status` says about moves, and what to run about them.

Three sources, each for what it alone knows: the home shard's journal (the unfinished
move, its batches, the copies switched batches left to clean up), the mover's lock on
home (is a mover running now), and every shard's own ownership row (which buckets are
frozen there now: the journal may lag the shards by one step, so frozen buckets are
never taken from it). Reads only, and raises nothing: what it cannot read it says it
cannot tell, naming the shard.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from itertools import groupby
from typing import Any

import psycopg

from shardq.moves.models import BatchRecord, LockHolder, MoveRecord, Ownership, PendingCleanup
from shardq.moves.plan import Range, bit_ranges, describe
from shardq.moves.store import MoveStore
from shardq.shards.config import ShardMap
from shardq.shards.connections import connect
from shardq.shards.errors import ShardqError

RESUME = "shardq shards move --resume"
ABORT = "shardq shards move --abort"


def move_status(shard_map: ShardMap, reachable: Collection[str],
                store: MoveStore | None = None) -> dict[str, Any]:
    """The moves part of `shards status` for `shard_map`, reading only the shards named
    in `reachable`: {"moves": [...] (None when home cannot be read), "problem",
    "frozen": [...], "cleanups": [...], "lines": [...] (the text to print)}."""
    store = store or MoveStore()
    frozen = _frozen(store, shard_map, reachable)
    journal, problem = _journal(store, shard_map, reachable)
    report: dict[str, Any] = {"moves": None, "problem": problem, "frozen": frozen,
                              "cleanups": [], "lines": []}
    lines: list[str] = report["lines"]
    if journal is None:
        lines.append(f"moves: {problem}")
        lines += [f"frozen: {_frozen_text(f)}" for f in frozen]
        return report
    unfinished, batches, pending, holder = journal
    report["moves"] = moves = []
    shown: set[tuple[str, int]] = set()
    if unfinished is not None:
        move = _move(unfinished, batches, frozen, reachable, holder)
        moves.append(move)
        lines.append(move["text"])
        shown = {(unfinished.source, unfinished.id)}
    else:
        lines.append("no move in progress" + (
            f" (a mover or map change holds the lock: {_holder(holder)})" if holder else ""))
    # Frozen buckets no unfinished move explains (a journal that lags): said all the same.
    lines += [f"frozen: {_frozen_text(f)}" for f in frozen
              if (f["shard"], f["move"]) not in shown]
    report["cleanups"] = cleanups = _cleanups(pending)
    lines += [c["text"] for c in cleanups]
    return report


def _frozen(store: MoveStore, shard_map: ShardMap,
            reachable: Collection[str]) -> list[dict[str, Any]]:
    """Buckets each reachable shard owns and does not take writes for now, with the
    move and target it names, and whether the target has switched them already."""
    rows: dict[str, Ownership] = {}
    for shard in shard_map.shards:
        if shard.name not in reachable:
            continue
        try:
            with connect(shard, autocommit=True) as conn:
                row = store.ownership(conn)
        except (ShardqError, psycopg.Error):
            continue  # shown as the shard's own problem
        if row is not None:
            rows[shard.name] = row
    found = []
    for name, row in rows.items():
        stuck = [o == "1" and w == "0" for o, w in zip(row.owned, row.writable, strict=True)]
        ranges = bit_ranges(stuck)
        if not ranges:
            continue
        target = rows.get(str(row.fence_target))
        switched = target is not None and all(
            target.writable[b] == "1" for lo, hi in ranges for b in range(lo, hi + 1))
        found.append({"shard": name, "buckets": [list(r) for r in ranges],
                      "move": row.fence_move, "target": row.fence_target,
                      "switched": switched})
    return found


Journal = tuple[MoveRecord | None, list[BatchRecord], list[PendingCleanup], LockHolder | None]


def _journal(store: MoveStore, shard_map: ShardMap,
             reachable: Collection[str]) -> tuple[Journal | None, str | None]:
    home = shard_map.get(shard_map.home)
    cannot = (f"cannot tell whether a move is in progress: its journal is on the home "
              f"shard {shard_map.home}, which")
    if home is None or home.name not in reachable:
        return None, f"{cannot} is unreachable"
    try:
        with connect(home, autocommit=True) as conn:
            unfinished = store.unfinished_move(conn)
            batches = store.batches(conn, unfinished.id) if unfinished else []
            pending = store.pending_cleanups(conn)
            holder = store.mover_lock_holder(conn)
    except (ShardqError, psycopg.Error) as exc:
        return None, f"{cannot} cannot be read ({str(exc).strip().splitlines()[0]})"
    return (unfinished, batches, pending, holder), None


def _move(found: MoveRecord, batches: list[BatchRecord], frozen: list[dict[str, Any]],
          reachable: Collection[str], holder: LockHolder | None) -> dict[str, Any]:
    source, number = found.source, found.id
    done = sum(b.phase in ("switched", "released", "cleaned") for b in batches)
    mine = next((f for f in frozen if (f["shard"], f["move"]) == (source, number)), None)
    frozen_buckets = mine["buckets"] if mine else []
    frozen_batch = next((b.batch for b in batches if any(
        b.first_bucket <= hi and lo <= b.last_bucket for lo, hi in frozen_buckets)), None)
    journaled = next((b.batch for b in batches if b.phase == "fenced"), None)
    move = {
        "id": number, "buckets": [found.first_bucket, found.last_bucket],
        "source": source, "target": found.target, "phase": found.phase,
        "batches": len(batches), "batches_switched": done,
        "runs_moved": sum(b.runs or 0 for b in batches),
        "frozen_batch": frozen_batch, "frozen_buckets": frozen_buckets,
        "mover_running": holder is not None, "started_at": found.started_at,
        "commands": [] if holder else [RESUME, ABORT],
    }
    text = [f"move {number}: buckets {found.first_bucket}-{found.last_bucket} "
            f"{source} -> {found.target}, {found.phase}, {done} of {len(batches)} "
            f"batches switched, {move['runs_moved']} runs moved, started "
            f"{_when(found.started_at)}"]
    if mine is not None:
        text.append(f"  frozen: {_frozen_text(mine, batch=frozen_batch)}")
    elif source not in reachable:
        text.append(f"  frozen: cannot tell, {source} is unreachable")
    elif journaled is not None:
        text.append(f"  batch {journaled} was being frozen when the mover stopped; nothing "
                    f"is frozen on {source}")
    if holder is not None:
        text.append(f"  a mover is running it: {_holder(holder)}")
    else:
        paused = " (the frozen buckets' runs stay paused until then)" if mine else ""
        text.append(f"  no mover is running: `{RESUME}` finishes it, `{ABORT}` rolls back "
                    f"the batches that did not switch{paused}")
    move["text"] = "\n".join(text)
    return move


def _frozen_text(frozen: dict[str, Any], *, batch: int | None = None) -> str:
    what = f"buckets {describe(frozen['buckets'])} on {frozen['shard']}"
    by = (f" (move {frozen['move']}" + (f", batch {batch}" if batch is not None else "")
          + f", to {frozen['target']})")
    if frozen["switched"]:
        return (f"{what}{by}: switched, {frozen['target']} serves their runs; "
                f"{frozen['shard']} has not released them yet")
    return f"{what}{by}: writes to their runs are refused until the move goes on"


def _cleanups(pending: list[PendingCleanup]) -> list[dict[str, Any]]:
    found = []
    for (move, source), rows in groupby(sorted(pending, key=lambda r: (r.move_id, r.source)),
                                        key=lambda r: (r.move_id, r.source)):
        batches = list(rows)
        due_at = max(r.due_at for r in batches)
        due_in = max(r.due_in_s for r in batches)
        ranges: list[Range] = [(r.first_bucket, r.last_bucket) for r in batches]
        when = "due now" if due_in <= 0 else f"due at {_when(due_at)}"
        found.append({
            "move": move, "source": source, "batches": len(batches),
            "buckets": [list(r) for r in ranges], "due_at": due_at, "command": RESUME,
            "text": (f"cleanup: {source} keeps its copy of {len(batches)} switched batch(es) "
                     f"of move {move} (buckets {describe(ranges)}; not counted in its runs) "
                     f"until the grace period ends, {when}: `{RESUME}` deletes it, and so "
                     "does the next move or rebalance"),
        })
    return found


def _holder(holder: LockHolder) -> str:
    return (f"pid {holder.pid} on {holder.host} ({holder.application_name}) since "
            f"{_when(holder.backend_start)}")


def _when(moment: dt.datetime) -> str:
    return f"{moment.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
