"""What a move is, before anything moves: ranges, layouts, batches, rebalancing plans.

Pure functions over map documents (`shard_maps.layout`: {"buckets", "home",
"shards": [{"name", "url"}], "ranges": [[first, last, name], ...]}) and run
counts; the mover (moves/mover.py) acts on them. No database here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardq.shards.errors import ConfigError
from shardq.shards.routing import BUCKETS

Layout = dict[str, Any]

_RANGE = re.compile(r"^(\d{1,4})(?:-(\d{1,4}))?$")


def parse_range(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (inclusive) or one bucket `N`, within 0..4095; ConfigError otherwise."""
    found = _RANGE.match(text)
    if found is None:
        raise ConfigError(f"bucket range {text!r} is not FIRST-LAST or N (whole numbers "
                          f"0..{BUCKETS - 1}, e.g. 0-1023)")
    first = int(found[1])
    last = int(found[2]) if found[2] is not None else first
    if last >= BUCKETS or first >= BUCKETS:
        raise ConfigError(f"bucket range {text!r} is outside 0..{BUCKETS - 1}")
    if first > last:
        raise ConfigError(f"bucket range {text!r} is empty: {first} comes after {last}")
    return first, last


def bits(first: int, last: int) -> str:
    """Buckets first..last as the text of a bit(4096), bucket 0 first."""
    return "0" * first + "1" * (last - first + 1) + "0" * (BUCKETS - 1 - last)


def shard_names(layout: Layout) -> list[str]:
    return [str(s["name"]) for s in layout["shards"]]


def owners(layout: Layout, first: int, last: int) -> list[tuple[int, int, str]]:
    """The parts of first..last each shard owns, in bucket order."""
    parts = []
    for lo, hi, name in sorted(layout["ranges"]):
        a, b = max(lo, first), min(hi, last)
        if a <= b:
            parts.append((a, b, str(name)))
    return parts


def reassign(layout: Layout, first: int, last: int, name: str) -> Layout:
    """`layout` with first..last given to `name`; adjacent ranges of one owner merged."""
    owner = [""] * BUCKETS
    for lo, hi, who in layout["ranges"]:
        owner[lo:hi + 1] = [str(who)] * (hi - lo + 1)
    owner[first:last + 1] = [name] * (last - first + 1)
    ranges: list[list[Any]] = []
    for bucket, who in enumerate(owner):
        if ranges and ranges[-1][2] == who:
            ranges[-1][1] = bucket
        else:
            ranges.append([bucket, bucket, who])
    return {**layout, "ranges": ranges}


def describe_ranges(layout: Layout, name: str) -> str:
    mine = [f"{lo}-{hi}" for lo, hi, who in sorted(layout["ranges"]) if who == name]
    return ", ".join(mine) or "no buckets"


@dataclass(frozen=True)
class Batch:
    """Whole contiguous buckets moved, frozen and switched together."""

    first: int
    last: int
    runs: int
    rows: int


def plan_batches(counts: Mapping[int, tuple[int, int]], first: int, last: int,
                 max_runs: int, max_rows: int) -> list[Batch]:
    """Batches of whole buckets over first..last, each within `max_runs` runs and
    `max_rows` rows unless one bucket alone is larger (then it is a batch of its own).

    `counts` maps a bucket to (runs, rows); buckets absent hold nothing and are
    carried by the batch around them (a switch moves them all the same).
    """
    batches: list[Batch] = []
    start, runs, rows = first, 0, 0
    for bucket in range(first, last + 1):
        b_runs, b_rows = counts.get(bucket, (0, 0))
        if bucket > start and (runs + b_runs > max_runs or rows + b_rows > max_rows):
            batches.append(Batch(start, bucket - 1, runs, rows))
            start, runs, rows = bucket, 0, 0
        runs += b_runs
        rows += b_rows
    batches.append(Batch(start, last, runs, rows))
    return batches


@dataclass(frozen=True)
class PlannedMove:
    """One move of a rebalancing plan."""

    first: int
    last: int
    source: str
    target: str
    runs: int

    def as_dict(self) -> dict[str, Any]:
        return {"buckets": [self.first, self.last], "source": self.source,
                "target": self.target, "runs": self.runs}


def plan_rebalance(layout: Layout, runs: Mapping[int, int], *, tolerance: float = 0.1,
                   max_moves: int | None = None) -> list[PlannedMove]:
    """Moves of contiguous bucket ranges that bring every shard's runs within
    `tolerance` of the mean, taking from the fullest shard for the emptiest each
    time, from the end of a range of the fullest that borders the emptiest when
    there is one (its ranges stay few), else from the end of its last range.

    `runs` maps a bucket to its run count (absent: 0). A shard with no bucket
    receives ranges like any other. Returns [] when the shards are already even.
    """
    names = shard_names(layout)
    if len(names) < 2:
        return []
    total = sum(runs.values())
    mean = total / len(names)
    current = layout
    plan: list[PlannedMove] = []
    for _ in range(max_moves if max_moves is not None else 4 * len(names)):
        load = {n: 0 for n in names}
        for lo, hi, who in current["ranges"]:
            load[str(who)] += sum(runs.get(b, 0) for b in range(lo, hi + 1))
        full = max(names, key=lambda n: (load[n], n))
        empty = min(names, key=lambda n: (load[n], n))
        if total == 0 or (load[full] <= mean * (1 + tolerance)
                          and load[empty] >= mean * (1 - tolerance)):
            break
        want = min(load[full] - mean, mean - load[empty])
        taken = _take(current, runs, full, empty, want)
        if taken is None:
            break
        first, last, moved = taken
        plan.append(PlannedMove(first, last, full, empty, moved))
        current = reassign(current, first, last, empty)
    return plan


def _take(layout: Layout, runs: Mapping[int, int], full: str, empty: str,
          want: float) -> tuple[int, int, int] | None:
    mine = sorted((lo, hi) for lo, hi, who in layout["ranges"] if who == full)
    theirs = [(lo, hi) for lo, hi, who in layout["ranges"] if who == empty]
    # Grow from the end that borders the emptiest shard, else from the top of
    # the fullest's last range, bucket by bucket, while it brings us closer.
    start: tuple[int, int, int] | None = None  # (first, last, step)
    for lo, hi in mine:
        if any(t_hi + 1 == lo for _, t_hi in theirs):
            start = (lo, hi, 1)
        elif any(t_lo - 1 == hi for t_lo, _ in theirs):
            start = (lo, hi, -1)
    if start is None:
        lo, hi = mine[-1]
        start = (lo, hi, -1)
    lo, hi, step = start
    order = range(lo, hi + 1) if step == 1 else range(hi, lo - 1, -1)
    moved, taken = 0, list[int]()
    for bucket in order:
        if len(taken) == hi - lo:  # leave the range at least one bucket
            break
        count = runs.get(bucket, 0)
        # Empty buckets come along for free; a full one only while it brings us closer.
        if count and moved and abs(want - moved - count) >= abs(want - moved):
            break
        taken.append(bucket)
        moved += count
    if not taken or moved == 0:
        return None
    return min(taken), max(taken), moved


def check_layout(layout: Layout) -> None:
    """Raise unless the ranges cover every bucket exactly once with known shards."""
    covered = [0] * BUCKETS
    known = set(shard_names(layout))
    for lo, hi, who in layout["ranges"]:
        if who not in known:
            raise ConfigError(f"map names unknown shard {who!r}")
        for b in range(lo, hi + 1):
            covered[b] += 1
    if any(c != 1 for c in covered):
        raise ConfigError("map ranges do not cover 0..4095 exactly once")

