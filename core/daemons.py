"""What the long-lived processes (the worker, the relay) share: the skeleton that follows
the shard map with a loop per shard, their pacing and their collector settings."""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from shardq.shards.config import Shard

log = logging.getLogger(__name__)

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


def spawn(name: str, target: Callable[[], None]) -> threading.Thread:
    """Start a daemon thread: a step or a delivery stuck past a drain deadline must not keep
    the process alive (what it held has been handed back or expires by then)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _nothing(_: object) -> None:
    return None


class ShardFollower:
    """The skeleton a long-lived daemon runs its per-shard loops on.

    One loop thread per served shard (`<loop_name>-<shard>`, running `loop(shard)`).
    Given `current` (the shards of the current map version), a map thread
    (`map_name`) compares it with the served shards every `check_s`: a shard a
    newer version adds is prepared by `added(shard)` and gets its loop; one it
    drops is marked retiring and its loop woken through `wake(names)`; the loop
    lets it go (`let_go`) when it is ready to, which the daemon decides (a worker
    waits for its leases first). A version that adds it again has it served
    afresh once it was let go. Without `current` the shards served are a fixed
    set, but a loop may still learn from the store that its shard left the map
    (`retire`).

    `stop(timeout)` sets `stopping`, wakes every loop, and joins the map thread
    and every loop against one deadline. A loop or a map check that raises is
    logged; the other loops and the map thread go on.

    The hooks run without the follower's lock held, so they may take the
    daemon's own locks, and the daemon may call `let_go`/`retire` under them.
    """

    def __init__(
        self,
        shards: Iterable[Shard],
        loop: Callable[[Shard], None],
        *,
        loop_name: str,
        map_name: str,
        current: Callable[[], Sequence[Shard]] | None = None,
        added: Callable[[Shard], None] = _nothing,
        wake: Callable[[Collection[str]], None] = _nothing,
        check_s: float = MAP_CHECK_S,
    ) -> None:
        self.stopping = threading.Event()
        self._served = list(shards)
        self._loop = loop
        self._loop_name = loop_name
        self._map_name = map_name
        self._current = current
        self._added = added
        self._wake = wake
        self._check_s = check_s
        self._lock = threading.Lock()  # _served, _retiring and _loops
        self._retiring: set[str] = set()
        self._loops: dict[str, threading.Thread] = {}
        self._map_thread: threading.Thread | None = None

    @property
    def shards(self) -> list[Shard]:
        """The shards served now (a copy: the map thread changes them as it runs)."""
        with self._lock:
            return list(self._served)

    def start(self) -> None:
        for shard in self.shards:
            self._start_loop(shard)
        if self._current is not None:
            self._map_thread = spawn(self._map_name, self._follow)

    def retiring(self, name: str) -> bool:
        """Whether the loop of shard `name` is to let it go."""
        with self._lock:
            return name in self._retiring

    def retire(self, name: str) -> None:
        """The store says shard `name` left the map: its loop lets it go next."""
        with self._lock:
            self._retiring.add(name)

    def let_go(self, name: str) -> None:
        """Shard `name` is no longer served (its loop ends now); a later map version that
        adds it again has it served afresh."""
        with self._lock:
            self._served = [s for s in self._served if s.name != name]
            self._retiring.discard(name)
            self._loops.pop(name, None)

    def stop(self, timeout: float) -> None:
        """Stop following the map and wait, at most `timeout` seconds in all, for the map
        thread and every loop to end."""
        self.stopping.set()
        self._wake([s.name for s in self.shards])
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._loops.values())
        if self._map_thread is not None:
            threads.append(self._map_thread)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def running(self) -> set[str]:
        """The shards whose loop has not ended (after `stop`: those stuck past the deadline)."""
        with self._lock:
            return {name for name, thread in self._loops.items() if thread.is_alive()}

    def _start_loop(self, shard: Shard) -> None:
        # Checked under the lock stop() copies the loops under: a loop is either
        # joined by stop() or never started.
        with self._lock:
            if self.stopping.is_set():
                return
            self._loops[shard.name] = spawn(f"{self._loop_name}-{shard.name}",
                                            functools.partial(self._run, shard))

    def _run(self, shard: Shard) -> None:
        try:
            self._loop(shard)
        except Exception:
            # A thread's uncaught error would print a bare trace, without the shard.
            log.exception("shard loop crashed; its shard goes unserved",
                          extra={"shard": shard.name})

    def _follow(self) -> None:
        while not self.stopping.wait(self._check_s):
            try:
                self._check()
            except Exception:
                # The map thread dying would freeze the served shards while the
                # process looks healthy: whatever failed is tried again next check.
                log.exception("map check failed; checking again")

    def _check(self) -> None:
        assert self._current is not None
        current = {s.name: s for s in self._current()}
        with self._lock:
            served = {s.name for s in self._served}
            self._retiring |= served - set(current)
            retiring = sorted(self._retiring & served)
        # Every check, not once: a wake that lands between a loop's look at
        # `retiring` and its next sleep is lost, and the sleep may be long.
        self._wake(retiring)
        for name, shard in current.items():
            if name in served:
                continue
            if self.stopping.is_set():
                return
            self._added(shard)
            with self._lock:
                self._served.append(shard)
            self._start_loop(shard)
