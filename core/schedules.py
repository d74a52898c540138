"""Schedules: what one is, checked, and what a ticker does with its due ticks.

A schedule fires by a cron expression read in a time zone (cronsim, which
handles the hours a DST change skips or repeats) or every so many seconds. The
store keeps it on the home shard (schema/0024); a worker's ticker claims it
when due and asks `plan` what to start. `plan` is pure: the ticks, the overlap
policy and the catch-up window decide, from the row's own times and the home
shard's clock, never a worker's (docs/schedules.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from shardq.core.errors import InvalidArgument
from shardq.core.rules import check_name

Overlap = Literal["skip", "buffer_one", "allow"]
OVERLAPS: tuple[Overlap, ...] = ("skip", "buffer_one", "allow")
DEFAULT_CATCHUP_S = 600.0
"""Ticks missed by more than this (the workers were all down) are counted, not run."""
MAX_TICKS_PER_CLAIM = 100
"""Ticks one claim of a schedule acts on; the rest wait for the next claim."""
NEVER_WITHIN_DAYS = 366 * 5
"""A cron expression with no tick in this many days is refused (it would never fire)."""
MIN_EVERY_S = 1.0


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as created: checked by `check_schedule`."""

    name: str
    workflow: str
    input_json: str
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    overlap: Overlap = "skip"
    catchup_s: float = DEFAULT_CATCHUP_S


@dataclass(frozen=True)
class Schedule:
    """A schedule as the home shard holds it."""

    name: str
    tenant: str
    workflow: str
    input: Any
    cron: str | None
    every_s: float | None
    timezone: str
    overlap: str
    catchup_s: float
    paused: bool
    next_at: datetime | None
    last_tick: datetime | None
    last_run: Any
    buffered_at: datetime | None
    triggered_at: datetime | None
    started: int
    skipped: int
    missed: int
    created_at: datetime


class DueSchedule(NamedTuple):
    """A schedule as a ticker's claim reads it: what `plan` and the starts need, the
    input still JSON text (a tick's run takes it as it is), and the home shard's
    clock at the claim. A tuple: a round reads thousands."""

    name: str
    tenant: str
    workflow: str
    input_json: str
    cron: str | None
    every_s: float | None
    timezone: str
    overlap: str
    catchup_s: float
    paused: bool
    next_at: datetime | None
    last_run: Any
    buffered_at: datetime | None
    triggered_at: datetime | None
    claimed_at: datetime


class Planned(Protocol):
    """What `plan` reads of a schedule: a `Schedule` or a `DueSchedule`."""

    @property
    def cron(self) -> str | None: ...
    @property
    def every_s(self) -> float | None: ...
    @property
    def timezone(self) -> str: ...
    @property
    def overlap(self) -> str: ...
    @property
    def catchup_s(self) -> float: ...
    @property
    def paused(self) -> bool: ...
    @property
    def next_at(self) -> datetime | None: ...
    @property
    def buffered_at(self) -> datetime | None: ...
    @property
    def triggered_at(self) -> datetime | None: ...


@dataclass
class Plan:
    """What a ticker does with one claimed schedule: the ticks to start a run for (a
    manual trigger's too), and the row's new times and counters."""

    starts: list[datetime] = field(default_factory=list)
    manual: datetime | None = None
    next_at: datetime | None = None
    buffered_at: datetime | None = None
    skipped: int = 0
    missed: int = 0


def check_schedule(name: object, workflow: object, input_json: str, *, cron: object = None,
                   every: object = None, timezone: object = "UTC", overlap: object = "skip",
                   catchup_window: object = DEFAULT_CATCHUP_S) -> ScheduleSpec:
    """A schedule's fields, each checked; InvalidArgument naming the first bad one."""
    check_name(name, "schedule")
    check_name(workflow, "workflow")
    assert isinstance(name, str) and isinstance(workflow, str)
    zone = _zone(timezone)
    if (cron is None) == (every is None):
        raise InvalidArgument("a schedule takes exactly one of cron and every")
    every_s: float | None = None
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int | float) or not (
                math.isfinite(every) and every >= MIN_EVERY_S):
            raise InvalidArgument(f"every must be a number of seconds >= {MIN_EVERY_S:g}, "
                                  f"got {every!r}")
        every_s = float(every)
    if cron is not None:
        check_cron(cron, zone)
    if overlap not in OVERLAPS:
        raise InvalidArgument(f"overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}")
    if isinstance(catchup_window, bool) or not isinstance(catchup_window, int | float) or not (
            math.isfinite(catchup_window) and catchup_window >= 0):
        raise InvalidArgument(f"catchup_window must be a number of seconds >= 0, "
                              f"got {catchup_window!r}")
    assert isinstance(timezone, str)
    return ScheduleSpec(name, workflow, input_json, cron if isinstance(cron, str) else None,
                        every_s, timezone, overlap, float(catchup_window))


def check_cron(cron: object, zone: ZoneInfo) -> str:
    """A cron expression cronsim reads and that fires within NEVER_WITHIN_DAYS."""
    if not isinstance(cron, str) or not cron.strip() or "\x00" in cron or len(cron) > 200:
        raise InvalidArgument(f"cron must be a cron expression, got {cron!r}")
    start = datetime.now(zone)
    try:
        first = next(CronSim(cron, start))
    except (CronSimError, StopIteration, ValueError) as exc:
        raise InvalidArgument(f"cron {cron!r} is not a cron expression cronsim reads: "
                              f"{exc}") from None
    if first - start > timedelta(days=NEVER_WITHIN_DAYS):
        raise InvalidArgument(f"cron {cron!r} does not fire within {NEVER_WITHIN_DAYS} days")
    return cron


def _zone(timezone: object) -> ZoneInfo:
    if not isinstance(timezone, str) or not timezone or "\x00" in timezone:
        raise InvalidArgument(f"timezone must be an IANA time zone name, got {timezone!r}")
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidArgument(f"timezone {timezone!r} is not a known IANA time zone: "
                              f"{exc}") from None


def first_tick(cron: str | None, every_s: float | None, timezone: str,
               after: datetime) -> datetime | None:
    """The first tick strictly after `after` (an interval's first is `after` + every)."""
    if every_s is not None:
        return after + timedelta(seconds=every_s)
    return next_tick(cron, None, timezone, after)


def next_tick(cron: str | None, every_s: float | None, timezone: str,
              tick: datetime) -> datetime | None:
    """The tick after `tick`; None when a cron expression fires no more."""
    if every_s is not None:
        return tick + timedelta(seconds=every_s)
    assert cron is not None
    try:
        following = next(CronSim(cron, tick.astimezone(ZoneInfo(timezone))))
    except (StopIteration, CronSimError):
        return None
    return following.astimezone(UTC)


def plan(schedule: Planned, now: datetime, last_live: bool) -> Plan:
    """What to do now: `last_live` says whether the schedule's last run is still running.

    Ticks up to `now` older than the catch-up window are missed; the others start a
    run each as the overlap policy allows: `allow` always, `skip` only when no run of
    the schedule is running, `buffer_one` holding one tick until the running one ends.
    A tick buffered earlier starts first once the last run ended.
    """
    out = Plan(next_at=schedule.next_at, buffered_at=schedule.buffered_at)
    live = last_live
    if out.buffered_at is not None and not live:
        out.starts.append(out.buffered_at)
        out.buffered_at, live = None, True
    horizon = now - timedelta(seconds=schedule.catchup_s)
    tick = schedule.next_at
    while (not schedule.paused and tick is not None and tick <= now
           and len(out.starts) + out.skipped + out.missed < MAX_TICKS_PER_CLAIM):
        if tick < horizon:
            out.missed += 1
        elif schedule.overlap == "allow" or not live:
            out.starts.append(tick)
            live = True
        elif schedule.overlap == "buffer_one" and out.buffered_at is None:
            out.buffered_at = tick
        else:
            out.skipped += 1
        tick = next_tick(schedule.cron, schedule.every_s, schedule.timezone, tick)
    out.next_at = tick
    out.manual = schedule.triggered_at
    return out


def tick_workflow_id(schedule: str, tick: datetime, *, manual: bool = False) -> str:
    """The workflow id of a tick's run: the schedule's name and the tick's UTC time, so a
    tick started twice finds its run (a trigger's says so)."""
    return f"{schedule}@{'manual-' if manual else ''}{_stamp(tick)}"


@functools.lru_cache(maxsize=256)
def _stamp(tick: datetime) -> str:
    # Cached: the schedules due at one second share a tick, and a busy round's
    # starts are thousands of them.
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
