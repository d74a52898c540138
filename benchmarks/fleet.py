"""Worker processes, started exactly as an operator would: `python -m shardq.bin.cli worker`.

Ready means: every process printed its "worker ... serving ..." line and every
shard shows one `LISTEN shardq_wake` session per process, so a NOTIFY reaches
all of them. Stopping sends SIGTERM (graceful drain) and kills after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardq.benchmarks.db import BenchError, Poller

APP = "shardq.benchmarks.workflows:registry"
POOL_MAX = 10
"""Connections per shard in each worker process (a claim loop, a completer, turns' checkpoints)."""


@dataclass(frozen=True)
class FleetConfig:
    workers: int
    concurrency: int
    batch_size: int
    poll_interval: float = 1.0
    lease_s: float = 30.0
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment of the worker processes (e.g. the upgrades scenario's tracing)."""

    def describe(self) -> dict[str, Any]:
        return {
            "worker_processes": self.workers, "concurrency": self.concurrency,
            "batch_size": self.batch_size, "poll_interval_s": self.poll_interval,
        }


class Fleet:
    def __init__(self, urls: Sequence[str], config: FleetConfig) -> None:
        self.urls = list(urls)
        self.config = config
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self._dir = Path(tempfile.mkdtemp(prefix="shardq-bench-"))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def command(self) -> list[str]:
        c = self.config
        return [
            sys.executable, "-m", "shardq.bin.cli", "worker", "--app", APP,
            "--concurrency", str(c.concurrency), "--batch-size", str(c.batch_size),
            "--poll-interval", str(c.poll_interval), "--lease", str(c.lease_s),
            "--drain-timeout", "5",
        ]

    def start(self) -> Fleet:
        env = {**os.environ, "SHARDQ_SHARDS": ",".join(self.urls),
               "SHARDQ_POOL_MAX": str(POOL_MAX), **dict(self.config.env)}
        env.pop("SHARDQ_SHARDS_FILE", None)
        for i in range(self.config.workers):
            log = self._dir / f"worker-{i}.log"
            with log.open("wb") as out:
                self.procs.append(subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=env,
                ))
            self.logs.append(log)
        return self

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Block until every worker serves and listens; returns seconds since start()."""
        started = time.monotonic()
        deadline = started + timeout
        with Poller(self.urls) as poller:
            while True:
                self.check_alive()
                printed = all("serving" in log.read_text(errors="replace") for log in self.logs)
                if printed:
                    listening = self.listening(poller)
                    if all(n >= self.config.workers for n in listening):
                        return time.monotonic() - started
                if time.monotonic() > deadline:
                    raise BenchError(f"workers not ready after {timeout} s: {self.tail()}")
                time.sleep(0.02)

    def listening(self, poller: Poller) -> list[int]:
        """The readiness barrier: per shard, how many processes LISTEN for work."""
        return [int(r[0]["n"]) for r in poller.each("listeners")]

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise BenchError(f"worker {proc.pid} exited with {proc.returncode}: {self.tail()}")

    def tail(self, lines: int = 8) -> str:
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            out.append(f"[{log.name}] " + " | ".join(text[-lines:]))
        return "; ".join(out)

    def errors(self) -> list[str]:
        """Warning and error lines the workers logged (lost leases, failed commits...)."""
        found = []
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                if "level=error" in line or "level=warning" in line or "Traceback" in line:
                    found.append(line[:300])
        return found

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every worker stopped (SIGSTOP) inside the block, continued (SIGCONT) on leaving it.

        A NOTIFY sent meanwhile waits in each worker's LISTEN socket, so the
        thawed workers wake at once to whatever was queued while they slept.
        """
        for proc in self.procs:
            proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for proc in self.procs:
                proc.send_signal(signal.SIGCONT)

    def stop(self, grace: float = 15.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._dir.rmdir()
        self.procs = []
        self.logs = []

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RelayFleet(Fleet):
    """`shardq outbox-relay` processes (`workers` of them), started and stopped like workers."""

    def listening(self, poller: Poller) -> list[int]:
        return [int(r[0]["n"]) for r in poller.each("relay_listeners")]

    def command(self) -> list[str]:
        c = self.config
        return [
            sys.executable, "-m", "shardq.bin.cli", "outbox-relay",
            "--batch-size", str(c.batch_size), "--poll-interval", str(c.poll_interval),
        ]
