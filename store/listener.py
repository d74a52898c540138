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

Shards in schemas of one database (shards/layout.py) share one LISTEN connection, a
DatabaseListener's: its thread reads the notifications and hands each to the shard
its channel names. That is one thread hand-off more on the wake path, the price of a
connection count that does not grow with the shards.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import ClassVar

import psycopg

from shardq.shards.config import Shard
from shardq.shards.connections import DictConnection, connect
from shardq.shards.errors import ShardUnavailable
from shardq.shards.layout import DEFAULT_SCHEMA
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
        self, shard: Shard, *, listen: Callable[[DictConnection], object] = listen_for_wakes
    ) -> None:
        """`listen` subscribes a fresh connection: by default to the workers' wake channel.
        A shard in a schema of a shared database is woken by that database's
        DatabaseListener instead of a connection of its own."""
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
        self._shared = (None if shard.schema == DEFAULT_SCHEMA
                        else DatabaseListener.joined(shard, listen, self))

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
        while not self._flag and self._shared is not None:
            limit = deadline - time.monotonic()
            if limit <= 0:
                return False
            select.select([self._read_fd], [], [], limit)
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
        if self._shared is not None:
            self._shared.renew()
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
        if self._shared is not None:
            self._shared.leave(self._shard, self)
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
        with self._lock:  # a DatabaseListener's thread may be setting it
            urgent, self._urgent = self._urgent, False
        return urgent

    def heard(self, urgent: bool) -> None:
        """A notification for this shard came (from its DatabaseListener)."""
        if urgent:
            with self._lock:
                self._urgent = True
        self.set()

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


class DatabaseListener:
    """One LISTEN connection for the shards of one database this process listens for,
    one channel each (`listen` returns its name), on a thread of its own that hands each
    notification to its shard's WakeSource.

    Made by the first WakeSource of a database (`joined`) and ended by the last one's
    `leave`, per database and kind of channel (`listen`). Like a WakeSource's own
    connection it counts every (re)connect as a wake-up of every shard, checks a silent
    connection with a round trip after CHECK_AFTER_S, and reconnects with backoff."""

    _all: ClassVar[dict[tuple[str, object], DatabaseListener]] = {}
    _all_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def joined(cls, shard: Shard, listen: Callable[[DictConnection], object],
               source: WakeSource) -> DatabaseListener:
        """The listener of `shard`'s database for channels `listen` makes, `source` one of
        those it wakes."""
        with cls._all_lock:
            key = (shard.conninfo, listen)
            found = cls._all.get(key)
            if found is None:
                found = cls._all[key] = cls(shard, listen, key)
            found._join(shard, source)
            return found

    def __init__(self, shard: Shard, listen: Callable[[DictConnection], object],
                 key: tuple[str, object]) -> None:
        self._database = shard  # any shard of the database: it connects to its conninfo
        self._listen = listen
        self._key = key
        self._members: dict[str, tuple[Shard, WakeSource]] = {}  # by shard name
        self._channels: dict[str, str] = {}  # shard names by channel
        self._subscribed: set[str] = set()  # shard names LISTENed on the connection
        self._lock = threading.Lock()  # members; the pipe, once closed
        self._stopped = False
        self._ended = False
        self._renew = False
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._conn: GuardedConnection | None = None
        self._reconnect_at = 0.0
        self._backoff = 0.5
        self._heard_at = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"shardq-listen-{shard.name}")
        self._thread.start()

    def _join(self, shard: Shard, source: WakeSource) -> None:
        with self._lock:
            self._members[shard.name] = (shard, source)
        source.set()  # its first wait claims: nothing heard before it joined counts
        self._poke()

    def leave(self, shard: Shard, source: WakeSource) -> None:
        """`source` is closed; the last one to leave ends the listener."""
        with DatabaseListener._all_lock, self._lock:
            if self._members.get(shard.name, (None, None))[1] is source:
                del self._members[shard.name]
            if self._members:
                return
            self._stopped = True
            DatabaseListener._all.pop(self._key, None)
        self._poke()

    def renew(self) -> None:
        """Drop the connection (a shard of it was unreachable); the next one wakes all."""
        self._renew = True
        self._poke()

    def _poke(self) -> None:
        with self._lock, suppress(BlockingIOError):  # a full pipe has a poke in it
            # After the end the descriptor numbers may already belong to another file.
            if not self._ended:
                os.write(self._write_fd, b"!")

    def _run(self) -> None:
        try:
            while not self._stopped:
                self._round()
        finally:
            if self._conn is not None:
                self._conn.close()
            with self._lock:
                self._ended = True
                os.close(self._read_fd)
                os.close(self._write_fd)

    def _round(self) -> None:
        if self._renew:
            self._renew = False
            self._drop()
        conn = self._connected()
        now = time.monotonic()
        fds, limit = [self._read_fd], CHECK_AFTER_S
        if conn is None:
            limit = max(0.0, self._reconnect_at - now)
        elif now - self._heard_at >= CHECK_AFTER_S:
            self._check(conn)
            return
        else:
            fds.append(conn.fileno())
            limit = self._heard_at + CHECK_AFTER_S - now
        ready, _, _ = select.select(fds, [], [], limit)
        if self._read_fd in ready:
            with suppress(BlockingIOError):
                os.read(self._read_fd, 512)
        if conn is not None and conn.fileno() in ready:
            self._drain(conn)

    def _connected(self) -> GuardedConnection | None:
        """The connection, (re)opened when due, LISTENing for every member: one newly
        subscribed is woken (what came before was not heard)."""
        if self._conn is None and time.monotonic() >= self._reconnect_at:
            try:
                self._conn = connect(self._database, autocommit=True)
            except ShardUnavailable as exc:
                self._lost(exc)
            else:
                self._subscribed.clear()
                self._heard_at = time.monotonic()
        conn = self._conn
        if conn is None:
            return None
        with self._lock:
            pending = [m for name, m in self._members.items() if name not in self._subscribed]
        try:
            for shard, source in pending:
                conn.schema = shard.schema
                self._channels[str(self._listen(conn))] = shard.name
                self._subscribed.add(shard.name)
                source.set()
        except psycopg.Error as exc:
            self._lost(exc)
            return None
        if pending:  # a NOTIFY that came during the LISTENs is in psycopg's backlog,
            self._drain(conn)  # which the socket's select() never shows
        self._backoff = 0.5
        return conn

    def _drain(self, conn: GuardedConnection) -> None:
        try:
            notes = list(conn.notifies(timeout=0))
        except psycopg.Error as exc:
            self._lost(exc)
            return
        self._heard_at = time.monotonic()
        for note in notes:
            with self._lock:
                member = self._members.get(self._channels.get(note.channel, ""))
            if member is not None:
                member[1].heard(note.payload == URGENT)

    def _check(self, conn: GuardedConnection) -> None:
        try:
            with conn.capped(PING_CAP_S):
                ping(conn)
        except psycopg.Error as exc:
            self._lost(exc)
            return
        self._drain(conn)

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._reconnect_at = 0.0

    def _lost(self, exc: BaseException) -> None:
        log.warning("shared wake listener lost its connection; reconnecting", extra={
            "shard": self._database.name, "error": str(exc).splitlines()[0],
            "retry_in_s": self._backoff})
        self._drop()
        self._reconnect_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
