"""The daemons' skeleton (core/daemons.py ShardFollower): a loop per served shard that
follows the map, and one deadline to stop them all.

A fake daemon stands in for the worker and the relay: its loop sleeps on its
shard's wake until stopped, and lets its shard go when the follower says it is
retiring, as theirs do. Nothing connects: the shards are only names.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence

import pytest

from shardq.core.daemons import ShardFollower
from shardq.shards.config import Shard, ShardMap

SHARDS = ShardMap.from_urls([f"postgresql://h/db{i}" for i in range(4)]).shards
CHECK_S = 0.01
LONG_S = 30.0
"""A sleep no test waits out: a loop still in it when a test ends was never woken."""


def named(*indexes: int) -> list[Shard]:
    return [SHARDS[i] for i in indexes]


def names(*indexes: int) -> set[str]:
    return {SHARDS[i].name for i in indexes}


def eventually(check: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class FakeDaemon:
    """Records what the follower asks of it. `stuck` loops ignore stop until released;
    `crashing` loops raise at once."""

    def __init__(self, served: Sequence[Shard], current: Sequence[Shard] | None, *,
                 stuck: Collection[str] = (), crashing: Collection[str] = (),
                 map_check: Callable[[], Sequence[Shard]] | None = None,
                 on_added: Callable[[Shard], None] | None = None) -> None:
        self.map = list(current) if current is not None else []
        self.wakes = {s.name: threading.Event() for s in SHARDS}
        self.release = threading.Event()
        self.stuck, self.crashing = set(stuck), set(crashing)
        self.started: Counter[str] = Counter()
        self.added: list[str] = []
        self.let_go: list[str] = []
        self.follower = ShardFollower(
            served, self.loop, loop_name="test-loop", map_name="test-map",
            current=None if current is None else (map_check or (lambda: list(self.map))),
            added=on_added or (lambda shard: self.added.append(shard.name)), wake=self.wake,
            check_s=CHECK_S)

    def wake(self, which: Collection[str]) -> None:
        for name in which:
            self.wakes[name].set()

    def loop(self, shard: Shard) -> None:
        self.started[shard.name] += 1
        if shard.name in self.crashing:
            raise RuntimeError("boom")
        if shard.name in self.stuck:
            self.release.wait(LONG_S)
            return
        wake = self.wakes[shard.name]
        while not self.follower.stopping.is_set():
            if self.follower.retiring(shard.name):
                self.follower.let_go(shard.name)
                self.let_go.append(shard.name)
                return
            wake.wait(LONG_S)
            wake.clear()

    def serving(self, expected: set[str]) -> bool:
        """The follower serves exactly `expected`, each with its loop running."""
        served = {s.name for s in self.follower.shards}
        return served == expected and self.follower.running() == expected


@pytest.fixture
def daemons() -> Iterator[Callable[..., FakeDaemon]]:
    made: list[FakeDaemon] = []

    def make(*args: object, **kwargs: object) -> FakeDaemon:
        daemon = FakeDaemon(*args, **kwargs)  # type: ignore[arg-type]
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.release.set()
        daemon.follower.stop(5.0)


def alive(name: str) -> bool:
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


MAP_CASES: list[tuple[str, list[int], list[list[int]], dict[int, int], list[int]]] = [
    # (case, served at start, map versions in turn, loops started per shard, let go)
    ("an unchanged map changes nothing", [0, 1], [[0, 1]], {0: 1, 1: 1}, []),
    ("a shard the map adds gets its loop", [0], [[0, 1]], {0: 1, 1: 1}, []),
    ("several added at once", [0], [[0, 1, 2, 3]], {0: 1, 1: 1, 2: 1, 3: 1}, []),
    ("a shard the map drops is let go", [0, 1], [[0]], {0: 1, 1: 1}, [1]),
    ("every shard dropped", [0, 1], [[]], {0: 1, 1: 1}, [0, 1]),
    ("shards swapped", [0, 1], [[1, 2]], {0: 1, 1: 1, 2: 1}, [0]),
    ("dropped then added back: served afresh", [0, 1], [[0], [0, 1]], {0: 1, 1: 2}, [1]),
]


@pytest.mark.parametrize(("served", "versions", "started", "let_go"),
                         [case[1:] for case in MAP_CASES], ids=[case[0] for case in MAP_CASES])
def test_the_served_shards_follow_the_map(
    daemons: Callable[..., FakeDaemon], served: list[int], versions: list[list[int]],
    started: dict[int, int], let_go: list[int],
) -> None:
    daemon = daemons(named(*served), named(*served))
    daemon.follower.start()
    assert eventually(lambda: daemon.serving(names(*served)))
    for version in versions:
        daemon.map = named(*version)
        assert eventually(functools.partial(daemon.serving, names(*version))), (
            version, daemon.follower.shards, daemon.follower.running())
    assert daemon.started == {SHARDS[i].name: n for i, n in started.items()}
    assert sorted(daemon.let_go) == sorted(SHARDS[i].name for i in let_go)
    # The hook prepares what the map adds, never the shards served from the start.
    assert Counter(daemon.added) == {SHARDS[i].name: n - (i in served)
                                     for i, n in started.items() if n - (i in served)}


def test_a_fixed_set_ignores_the_map_but_lets_go_what_the_store_retires(
    daemons: Callable[..., FakeDaemon],
) -> None:
    daemon = daemons(named(0, 1), None)
    daemon.follower.start()
    assert eventually(lambda: daemon.serving(names(0, 1)))
    assert not alive("test-map")
    daemon.follower.retire(SHARDS[1].name)
    daemon.wakes[SHARDS[1].name].set()  # as the store's refusal ends the loop's round
    assert eventually(lambda: daemon.serving(names(0)))
    assert daemon.let_go == [SHARDS[1].name]


STOP_CASES: list[tuple[str, int, float, float, float]] = [
    # (case, stuck loops, timeout, least and most seconds stop() takes)
    ("every loop ends as soon as it is woken", 0, LONG_S, 0.0, 1.0),
    ("a stuck loop holds stop() to the deadline, no longer", 1, 0.4, 0.4, 0.9),
    ("stuck loops share one deadline", 3, 0.4, 0.4, 0.9),
]


@pytest.mark.parametrize(("stuck", "timeout", "least", "most"),
                         [case[1:] for case in STOP_CASES], ids=[case[0] for case in STOP_CASES])
def test_stop_joins_every_loop_within_one_deadline(
    daemons: Callable[..., FakeDaemon], stuck: int, timeout: float, least: float, most: float,
) -> None:
    stuck_names = {s.name for s in SHARDS[:stuck]}
    daemon = daemons(SHARDS, SHARDS, stuck=stuck_names)
    daemon.follower.start()
    assert eventually(lambda: daemon.follower.running() == {s.name for s in SHARDS})
    started = time.monotonic()
    daemon.follower.stop(timeout)
    took = time.monotonic() - started
    assert least <= took < most
    assert daemon.follower.running() == stuck_names
    assert not alive("test-map")
    for shard in SHARDS:
        assert alive(f"test-loop-{shard.name}") == (shard.name in stuck_names)


def test_stop_waits_for_the_map_thread(daemons: Callable[..., FakeDaemon]) -> None:
    """A map check in progress when stop() comes is waited for: it may be adding a shard
    whose resources the daemon closes next."""
    in_check = threading.Event()
    daemon: FakeDaemon

    def slow_check() -> list[Shard]:
        in_check.set()
        daemon.follower.stopping.wait(LONG_S)
        time.sleep(0.3)
        return named(0, 1)

    daemon = daemons(named(0), named(0), map_check=slow_check)
    daemon.follower.start()
    assert in_check.wait(3.0)
    started = time.monotonic()
    daemon.follower.stop(5.0)
    assert time.monotonic() - started >= 0.3
    assert not alive("test-map")
    # Stopping: the shard the check found is neither prepared nor given a loop.
    assert daemon.added == [] and daemon.started == {SHARDS[0].name: 1}


def test_stop_before_start_returns_at_once(daemons: Callable[..., FakeDaemon]) -> None:
    daemon = daemons(named(0, 1), named(0, 1))
    started = time.monotonic()
    daemon.follower.stop(LONG_S)
    assert time.monotonic() - started < 0.5
    assert daemon.follower.running() == set()


def test_a_shard_added_as_stop_comes_gets_no_loop(daemons: Callable[..., FakeDaemon]) -> None:
    """stop() joins the loops it finds; one started after it looked would run on unjoined."""
    daemon: FakeDaemon

    def stop_comes(shard: Shard) -> None:
        daemon.follower.stopping.set()

    daemon = daemons(named(0), named(0, 1), on_added=stop_comes)
    daemon.follower.start()
    assert eventually(lambda: not alive("test-map"))
    daemon.follower.stop(5.0)
    assert daemon.started == {SHARDS[0].name: 1}


@pytest.mark.parametrize("where", ["loop", "map check"])
def test_a_failure_is_logged_and_the_rest_go_on(
    daemons: Callable[..., FakeDaemon], caplog: pytest.LogCaptureFixture, where: str,
) -> None:
    checks = 0
    daemon: FakeDaemon

    def failing_once() -> list[Shard]:
        nonlocal checks
        checks += 1
        if checks == 1:
            raise RuntimeError("boom")
        return daemon.map

    crashing = {SHARDS[1].name} if where == "loop" else set()
    daemon = daemons(named(0, 1), named(0, 1), crashing=crashing,
                     map_check=failing_once if where == "map check" else None)
    with caplog.at_level(logging.ERROR, logger="shardq.core.daemons"):
        daemon.follower.start()
        assert eventually(lambda: bool(caplog.records))
    (record,) = caplog.records
    assert record.exc_info is not None and str(record.exc_info[1]) == "boom"
    if where == "loop":
        assert getattr(record, "shard", None) == SHARDS[1].name
    # The other loops, and the map thread, carry on.
    daemon.map = named(0, 1, 2)
    expected = names(0, 2) if where == "loop" else names(0, 1, 2)
    assert eventually(lambda: daemon.follower.running() == expected)
    assert alive("test-map")
