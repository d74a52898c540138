"""Small measuring tools: a stderr progress bar, percentiles, CPU accounting from /proc."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Progress:
    """`label [#####.....] done/total rate/s` on stderr, shown once a phase passes `after` s.

    Phases shorter than a few seconds stay silent. Off a terminal (CI logs) it
    prints one plain line every 5 s instead of redrawing.
    """

    enabled = True

    def __init__(
        self, label: str, total: float, *, unit: str = "", after: float = 2.0, rate: bool = True
    ) -> None:
        self.label, self.total, self.unit, self.after = label, total, unit, after
        self.rate = rate
        self.started = time.monotonic()
        self._last = 0.0
        self._shown = False
        self._tty = sys.stderr.isatty()

    def update(self, done: float) -> None:
        now = time.monotonic()
        elapsed = now - self.started
        if not self.enabled or elapsed < self.after or now - self._last < (0.2 if self._tty
                                                                             else 5.0):
            return
        self._last, self._shown = now, True
        frac = min(1.0, done / self.total) if self.total else 0.0
        rate = done / elapsed if elapsed > 0 else 0.0
        bar = "#" * int(frac * 24) + "." * (24 - int(frac * 24))
        text = f"{self.label} [{bar}] {done:,.0f}/{self.total:,.0f}{self.unit} "
        text += f"{rate:,.0f}/s {elapsed:.0f}s" if self.rate else f"{elapsed:.0f}s"
        if self._tty:
            sys.stderr.write("\r" + text[:110].ljust(110))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._shown and self._tty:
            sys.stderr.write("\r" + " " * 110 + "\r")
            sys.stderr.flush()


def wait_for(
    check: Callable[[], float],
    target: float,
    *,
    label: str,
    timeout: float,
    interval: float = 0.02,
) -> float:
    """Poll `check()` (a count going up) until it reaches `target`; monotonic end time.

    Raises TimeoutError naming the label and how far it got.
    """
    bar = Progress(label, target)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = check()
            now = time.monotonic()
            bar.update(done)
            if done >= target:
                return now
            if now > deadline:
                raise TimeoutError(f"{label}: {done:,.0f} of {target:,.0f} after {timeout:.0f} s")
            time.sleep(interval)
    finally:
        bar.close()


def percentiles(
    values: Sequence[float], points: Iterable[float] = (50, 95, 99)
) -> dict[str, float]:
    """Nearest-rank percentiles, plus min, max and mean, keyed `p50`, `min`..."""
    ordered = sorted(values)
    if not ordered:
        return {}
    out = {f"p{p:g}": ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] for p in points}
    out.update(min=ordered[0], max=ordered[-1], mean=sum(ordered) / len(ordered))
    return out


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, 0 if it is gone."""
    sample = _proc_sample(pid)
    return 0.0 if sample is None else sample[1]


def _proc_sample(pid: int) -> tuple[int, float] | None:
    """(start time, CPU seconds) of a process, None if it is gone. The start time tells
    a process from a later one given the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / _TICKS


def _postgres_cpu() -> dict[tuple[int, int], float]:
    """CPU seconds of every `postgres` process, by (pid, start time). A backend that
    exits between the listing and the read is left out, not read as 0 (which made a
    phase's PostgreSQL CPU negative while other tests' backends came and went)."""
    found: dict[tuple[int, int], float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() != "postgres":
                    continue
            except OSError:
                continue
            pid = int(entry.name)
            sample = _proc_sample(pid)
            if sample is not None:
                found[(pid, sample[0])] = sample[1]
    return found


def _machine() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    try:
        parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / _TICKS, sum(parts[:8]) / _TICKS


@dataclass
class CpuMeter:
    """Where the CPU went during a phase: worker processes, PostgreSQL, this process, idle.

    Linux /proc only; elsewhere every figure reads 0. PostgreSQL is every process
    named `postgres` on this machine (other users' too), counted per process: one
    that started during the phase counts whole, one that exited is lost.
    """

    worker_pids: Sequence[int] = ()
    _start: dict[str, float] = field(default_factory=dict)
    _pg_start: dict[tuple[int, int], float] = field(default_factory=dict)

    def _sample(self) -> tuple[dict[str, float], dict[tuple[int, int], float]]:
        busy, total = _machine()
        times = os.times()
        return {
            "machine_busy": busy,
            "machine_total": total,
            "workers": sum(_proc_cpu(p) for p in self.worker_pids),
            "bench": times.user + times.system,
        }, _postgres_cpu()

    def start(self) -> CpuMeter:
        self._start, self._pg_start = self._sample()
        return self

    def stop(self, jobs: int | None = None) -> dict[str, Any]:
        end, pg_end = self._sample()
        d = {k: end[k] - self._start.get(k, 0.0) for k in end}
        d["postgres"] = sum(cpu - self._pg_start.get(key, 0.0) for key, cpu in pg_end.items())
        wall_cpu = d["machine_total"]
        out: dict[str, Any] = {
            "machine_busy_pct": round(100 * d["machine_busy"] / wall_cpu, 1) if wall_cpu else None,
            "workers_cpu_s": round(d["workers"], 2),
            "postgres_cpu_s": round(d["postgres"], 2),
            "bench_cpu_s": round(d["bench"], 2),
            # Busy time no process of this run explains: other work on a shared machine.
            "other_cpu_s": round(d["machine_busy"] - d["workers"] - d["postgres"] - d["bench"], 2),
            "wall_s": round(wall_cpu / (os.cpu_count() or 1), 2),
        }
        if jobs:
            out["workers_us_per_job"] = round(1e6 * d["workers"] / jobs, 1)
            out["postgres_us_per_job"] = round(1e6 * d["postgres"] / jobs, 1)
        return out
