"""What the long-lived processes (the worker, the relay) share: their pacing and their
collector settings."""

from __future__ import annotations

import gc

MIN_POLL_S = 0.1
"""The shortest safety poll a worker or a relay accepts."""
MAP_CHECK_S = 1.0
"""How often a worker (and a relay) compares the shards it serves with the current map
version; the version itself is kept current by the pools (shards/follow.py)."""
GC_YOUNG_THRESHOLD = 20_000
"""Allocations between young collections in a worker daemon (CPython's default: 700)."""


def tune_gc_for_worker() -> None:
    """Collector settings for a process that is above all a shardq worker (the CLI daemon).

    A turn allocates a few hundred short-lived containers. At CPython's defaults
    (a young collection every 700 allocations, a full one every 70,000) a
    draining worker spent about a third of its CPU in the collector, most of it
    walking the long-lived objects of its imports on each full collection.
    Those are frozen out of collection here, and collections come ~30 times
    less often; cyclic garbage is still collected. Call once, after imports.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def first_line(error: BaseException | None) -> str:
    """An error's first line, for a log field: a daemon logs one line per failure."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
