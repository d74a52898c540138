"""What a shard's claim loop sleeps on: pokes from this process and the shard's NOTIFYs.

The claim loop itself waits on the LISTEN connection's socket, together with a
pipe that other threads poke, rather than a listener thread relaying each
NOTIFY to it: on an idle worker every thread hand-off is a wake-up of a sleeping
CPU, and this one sat on the signal -> resumed step path.

A notification is only a hint that work may be due: notifications are lost
while the connection is down, so every (re)connect also counts as a wake-up,
after which the loop claims and recomputes its timer. The claim loop's poll
stays the correctness path.

A LISTEN connection only ever waits, so a server that hangs (or a path that
stops forwarding without resetting anything) would leave it silent for good,
every later NOTIFY lost unseen. So a connection that heard nothing for
CHECK_AFTER_S is asked for one round trip, which a hung server fails within
shards.liveness.HUNG_NOTICE_S; and the claim loop renews it (`renew()`) when its
shard comes back from an outage, as the old one may be the casualty.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable

import psycopg

from shardq.shards.config import Shard
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import ShardUnavailable
from shardq.shards.liveness import GuardedConnection
from shardq.store.store import listen_for_wakes, ping

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 10.0
CHECK_AFTER_S = 15.0
"""Silence on a LISTEN connection after which it is checked with a round trip."""
PING_CAP_S = 5.0
"""The longest that check may take."""
URGENT = "urgent"
"""The payload of a wake for runs of a priority above 0 (schema/functions/wake_note.sql)."""


class WakeSource:
    """A threading.Event-like flag that one thread waits on, also set by the shard's NOTIFYs.

    Any thread may `set()`; only the claim loop calls `clear()` and `wait()`,
    which also owns the LISTEN connection: it connects lazily, and after a loss
    reconnects with backoff while the loop carries on polling.
    """

    def __init__(
        self, shard: Shard, *, listen: Callable[[DictConnection], None] = listen_for_wakes
    ) -> None:
        """`listen` subscribes a fresh connection: by default to the workers' wake channel."""
        self._shard = shard
        self._listen = listen
        self._lock = threading.Lock()
        self._flag = False
        self._closed = False
        # A byte sits in the pipe exactly while the flag is set, so select()
        # sees a poke that came before the wait as well as during it.
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._conn: GuardedConnection | None = None
        self._reconnect_at = 0.0
        self._backoff = 0.5
        self._heard_at = 0.0  # when the connection last answered or brought a notification
        self._urgent = False

    def set(self) -> None:
        with self._lock:
            # After close() the descriptor numbers may already belong to another file.
            if not self._flag and not self._closed:
                self._flag = True
                os.write(self._write_fd, b"!")

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        with self._lock:
            if self._flag and not self._closed:
                self._flag = False
                os.read(self._read_fd, 1)

    def wait(self, timeout: float) -> bool:
        """Until set, a notification or `timeout` seconds; True when woken."""
        deadline = time.monotonic() + timeout
        while not self._flag:
            conn = self._listening()
            if self._flag:  # (re)connected: notifications may have been missed
                break
            now = time.monotonic()
            if now >= deadline:
                return False
            limit = deadline - now
            fds = [self._read_fd]
            if conn is None:
                limit = min(limit, max(0.0, self._reconnect_at - now))
            elif now - self._heard_at >= CHECK_AFTER_S:
                if self._check(conn):
                    return True
                continue
            else:
                fds.append(conn.fileno())
                limit = min(limit, self._heard_at + CHECK_AFTER_S - now)
            ready, _, _ = select.select(fds, [], [], limit)
            if conn is not None and conn.fileno() in ready and self._drain(conn):
                return True
        return True

    def renew(self) -> None:
        """Drop the LISTEN connection (its shard was unreachable meanwhile); the next wait
        opens a fresh one and counts it as a wake-up."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._reconnect_at = 0.0

    def close(self) -> None:
        """Drop the LISTEN connection and the pipe; later set() calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        os.close(self._read_fd)
        os.close(self._write_fd)

    def _listening(self) -> GuardedConnection | None:
        """The LISTEN connection, (re)opened when due; a fresh one sets the flag."""
        if self._conn is not None or time.monotonic() < self._reconnect_at:
            return self._conn
        try:
            conn = connect(self._shard, autocommit=True)
            try:
                self._listen(conn)
            except BaseException:
                conn.close()
                raise
        except (psycopg.Error, ShardUnavailable) as exc:
            self._lost(exc)
            return None
        self._conn, self._backoff = conn, 0.5
        self._heard_at = time.monotonic()
        self.set()
        return conn

    @property
    def urgent(self) -> bool:
        """A NOTIFY said urgent work came due (a run of a priority above 0), and no
        claim took it yet: read and taken by the claim loop's thread only, which also
        reads the notifications."""
        return self._urgent

    def take_urgent(self) -> bool:
        urgent, self._urgent = self._urgent, False
        return urgent

    def _drain(self, conn: GuardedConnection) -> bool:
        """Read what arrived on the LISTEN socket; True when it held a notification."""
        heard = False
        try:
            for note in conn.notifies(timeout=0):
                heard = True
                if note.payload == URGENT:
                    self._urgent = True
        except psycopg.Error as exc:
            self._lost(exc)
            return False
        self._heard_at = time.monotonic()
        return heard

    def _check(self, conn: GuardedConnection) -> bool:
        """One round trip on a LISTEN connection that heard nothing for a while; True when
        notifications came with it. A server that does not answer fails it (bounded)."""
        try:
            # Capped: a connection that went silent on its own, its server answering
            # others (a stale NAT entry, a pooler's stuck client), is not hung to a probe.
            with conn.capped(PING_CAP_S):
                ping(conn)
        except psycopg.Error as exc:
            self._lost(exc)
            return False
        return self._drain(conn)  # what arrived during the round trip waits in its backlog

    def _lost(self, exc: BaseException) -> None:
        log.warning(
            "wake listener lost its connection; reconnecting",
            extra={"shard": self._shard.name, "error": str(exc).splitlines()[0],
                   "retry_in_s": self._backoff},
        )
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._reconnect_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
