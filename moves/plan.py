"""What a move is, before anything moves: ranges, layouts, batches, rebalancing plans.

Pure functions over map documents (`shard_maps.layout`: {"buckets", "home",
"shards": [{"name", "url"}], "ranges": [[first, last, name], ...]}) and run
counts; the mover (moves/mover.py) acts on them. No database here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardq.shards.errors import ConfigError
from shardq.shards.routing import BUCKETS

Layout = dict[str, Any]

_RANGE = re.compile(r"([0-9]{1,4})(?:-([0-9]{1,4}))?")  # ASCII: int() reads other digits too


def parse_range(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (inclusive) or one bucket `N`, within 0..4095; ConfigError otherwise."""
    found = _RANGE.fullmatch(text)
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


Range = tuple[int, int]
"""Inclusive first and last bucket."""


def bit_ranges(flags: Sequence[bool]) -> list[Range]:
    """The runs of true flags (bucket 0 first) as inclusive ranges."""
    found: list[Range] = []
    for bucket, flag in enumerate(flags):
        if not flag:
            continue
        if found and found[-1][1] == bucket - 1:
            found[-1] = (found[-1][0], bucket)
        else:
            found.append((bucket, bucket))
    return found


def describe(ranges: Iterable[Sequence[int]]) -> str:
    """`1024-1535, 2000-2047`: sorted, touching ranges merged."""
    merged: list[list[int]] = []
    for lo, hi in sorted((int(r[0]), int(r[1])) for r in ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return ", ".join(f"{lo}-{hi}" for lo, hi in merged) or "no buckets"


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
        # Only a bucket with runs closes a batch, and only one that holds runs: empty
        # buckets go with their neighbours, never make a batch of nothing (a batch
        # over the bound by one big bucket was followed by an empty one).
        if runs and b_runs and (runs + b_runs > max_runs or rows + b_rows > max_rows):
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


TOLERANCE = 0.1
"""How far from the mean a shard's runs may be for `rebalance` to call the shards even."""


def within_tolerance(load: Mapping[str, int], tolerance: float = TOLERANCE) -> bool:
    """True when every shard's runs are within `tolerance` of the mean (and when
    there are no runs at all)."""
    mean = sum(load.values()) / len(load) if load else 0.0
    return all(abs(n - mean) <= mean * tolerance for n in load.values())


def plan_rebalance(layout: Layout, runs: Mapping[int, int], *,
                   tolerance: float = TOLERANCE, max_moves: int | None = None) -> list[PlannedMove]:
    """Moves of contiguous bucket ranges that leave the shards even.

    Even means: every shard's runs within `tolerance` (10%) of the mean, or, where
    whole buckets cannot get there, no range taken from either end of one of the
    ranges of a shard above the mean would bring it and a shard below the mean
    closer together (a bucket never splits: one bucket holding more runs than two
    shards differ by stays where it is).

    Each move takes, for the fullest shard and the emptiest one that such a range
    can bring closer, the end of one of the fuller shard's ranges whose runs come
    nearest to what evens the pair without carrying either past the mean; among
    equals, one that borders a range of the emptier shard (its ranges stay few),
    then the fewest buckets. Every move brings the sum of squared loads down, so
    planning ends; `max_moves` (default 8 per shard) bounds it all the same.

    `runs` maps a bucket to its run count (absent: 0). A shard with no bucket
    receives ranges like any other. Returns [] when the shards are already even.
    """
    names = shard_names(layout)
    if len(names) < 2:
        return []
    counts = [0] * BUCKETS
    for bucket, count in runs.items():
        counts[bucket] += count
    mean = sum(counts) / len(names)
    current = layout
    plan: list[PlannedMove] = []
    while len(plan) < (max_moves if max_moves is not None else 8 * len(names)):
        load = loads(current, counts)
        if within_tolerance(load, tolerance):
            break
        found = _next_move(current, counts, load, mean)
        if found is None:
            break
        plan.append(found)
        current = reassign(current, found.first, found.last, found.target)
    return plan


def loads(layout: Layout, counts: list[int]) -> dict[str, int]:
    """Runs per shard under `layout`, from runs per bucket."""
    load = {n: 0 for n in shard_names(layout)}
    for lo, hi, who in layout["ranges"]:
        load[str(who)] += sum(counts[lo:hi + 1])
    return load


def _next_move(layout: Layout, counts: list[int], load: dict[str, int],
               mean: float) -> PlannedMove | None:
    fuller = sorted((n for n in load if load[n] > mean), key=lambda n: (-load[n], n))
    emptier = sorted((n for n in load if load[n] < mean), key=lambda n: (load[n], n))
    for source in fuller:
        for target in emptier:
            found = _best_piece(layout, counts, source, target,
                                want=min(load[source] - mean, mean - load[target]),
                                gap=load[source] - load[target])
            if found is not None:
                first, last, moved = found
                return PlannedMove(first, last, source, target, moved)
    return None


def _best_piece(layout: Layout, counts: list[int], source: str, target: str, *,
                want: float, gap: int) -> tuple[int, int, int] | None:
    """(first, last, runs) of the best end of one of `source`'s ranges to give to
    `target`, or None when no end brings the two closer (runs strictly between 0
    and their gap)."""
    theirs = [0] * (BUCKETS + 2)  # theirs[b + 1]: `target` owns bucket b
    for lo, hi, who in layout["ranges"]:
        if who == target:
            theirs[lo + 1:hi + 2] = [1] * (hi - lo + 1)
    best: tuple[tuple[float, bool, int, int], tuple[int, int, int]] | None = None
    for lo, hi, who in sorted(layout["ranges"]):
        if who != source:
            continue
        # The prefixes lo..k, then the suffixes k..hi; the whole range is both.
        for start, stop, step, borders in ((lo, hi, 1, theirs[lo]),
                                           (hi, lo, -1, theirs[hi + 2])):
            moved = 0
            for k in range(start, stop + step, step):
                moved += counts[k]
                if moved >= gap:
                    break
                if moved == 0:
                    continue
                first, last = (start, k) if step == 1 else (k, start)
                key = (abs(want - moved), not borders, last - first, first)
                if best is None or key < best[0]:
                    best = (key, (first, last, moved))
    return best[1] if best is not None else None


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

