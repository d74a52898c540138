"""LISTEN on a shard's wake channel and poke the shard's claim loop.

A notification is only a hint that work may be due: notifications are lost
while the connection is down, so every (re)connect also pokes the loop, which
then claims and recomputes its timer. The claim loop's poll stays the
correctness path.
"""

from __future__ import annotations

import logging
import threading

import psycopg

from shardq.shards.config import Shard
from shardq.shards.errors import ShardUnavailable
from shardq.shards.pools import connect

log = logging.getLogger(__name__)

CHANNEL = "shardq_wake"


class WakeListener:
    def __init__(self, shard: Shard, wake: threading.Event, stopping: threading.Event) -> None:
        self._shard = shard
        self._wake = wake
        self._stopping = stopping
        self._thread = threading.Thread(
            target=self._run, name=f"shardq-listen-{shard.name}", daemon=True
        )

    def start(self) -> WakeListener:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                with connect(self._shard, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._wake.set()
                    backoff = 0.5
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=0.5):
                            self._wake.set()
            except (psycopg.Error, ShardUnavailable) as exc:
                if self._stopping.is_set():
                    return
                log.warning(
                    "wake listener lost its connection; reconnecting",
                    extra={"shard": self._shard.name, "error": str(exc).splitlines()[0]},
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
