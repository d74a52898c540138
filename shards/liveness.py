"""Client-side deadlines for a server that stopped answering: every wait on a shard is bounded.

A frozen server (a storage stall, a SIGSTOPped postmaster, a stuck pooler) keeps
its kernel: it acknowledges packets, so TCP keepalives and `tcp_user_timeout`
see a healthy connection, and it never reads the statement, so the server's
`statement_timeout` never applies. Only the client can tell, and a deadline on
every round trip is the one place to do it for every statement at once: the
claim, the heartbeat, the completer, the relay, the listener's check, `serve`'s
calls, the exporter's scrape, the mover's copy.

A fixed deadline cannot tell a hung server from a slow statement (a long
ANALYZE, a lock wait, a migration's index build); both send nothing until they
are done. So a round trip that has waited SUSPECT_AFTER_S asks the server
itself, on a fresh connection, whether it still answers (`Liveness.answers`:
connect and `SELECT 1` within PROBE_TIMEOUT_S). A server that answers is slow,
not hung: the wait goes on, asking again every VERDICT_TTL_S, and the server's
own `statement_timeout` ends a statement that is merely slow. One that does not
answer is hung: the connection is closed and the statement fails with
ServerNotAnswering, an OperationalError with no SQLSTATE, which the pools take
for a lost connection (the shard is marked down and probed, shards/pools.py).
So a statement to a hung server fails within HUNG_NOTICE_S, and a slow one is
never cut short by the client.

There is one probe per server at a time in a process, whatever the number of
connections waiting on it, and its verdict is shared by all of them for
VERDICT_TTL_S. A connection may also carry a hard cap (`max_wait_s`) that ends a
round trip whatever the probe says; the probe's own connection has only that.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq.abc import PGconn
from psycopg.rows import tuple_row

from shardq.shards.layout import DEFAULT_SCHEMA, AsyncSchemaCursor, SchemaCursor
from shardq.shards.sqlfile import load_queries

RV = TypeVar("RV")
SQL = load_queries("shardq.shards", "queries.sql")

SUSPECT_AFTER_S = 2.0
"""A round trip unanswered this long makes the process ask whether the server answers at all.
A healthy shard answers a claim or a commit in milliseconds."""
PROBE_TIMEOUT_S = 3.0
"""How long the question may take: a new connection and `SELECT 1` (libpq's connect timeout
has a floor of 2 s)."""
VERDICT_TTL_S = 1.0
"""How long a probe's verdict stands for every wait on that server."""
HUNG_NOTICE_S = SUSPECT_AFTER_S + VERDICT_TTL_S + PROBE_TIMEOUT_S
"""The longest a statement to a hung server waits before it fails (about 6 s)."""
CAP_MARGIN_S = 5.0
"""How much longer than the server's statement_timeout a pool's round trip may wait (the
cap of pools given `statement_timeout_s`): time for the server's cancel to come back."""

_WAIT_INTERVAL_S = 0.1  # psycopg's own: how often a wait looks up for Ctrl-C
_WAIT_TIMEOUT: type[Exception] = pg_errors._WaitTimeout
"""What psycopg's `Connection.wait` raises when its `timeout` passes; the generator it was
consuming stays usable (psycopg re-enters it itself after a cancel). The name is psycopg's
private one: tests/integration/test_hung_paths.py fails if a release changes it."""

_NO_ANSWER = ("refused", "timeout", "timed out", "unreachable", "no route",
              "closed the connection", "no such file", "not answering")
"""Connection failures that mean nobody answered. Any other failure (no slots left, a bad
password, a missing database, starting up) came from a server that answers."""


class ServerNotAnswering(psycopg.OperationalError):
    """A round trip abandoned (the server did not answer, and its connection was closed),
    or a wait for a pooled connection given up (the server answered no probe either)."""


def waited_in_vain(timeout_s: float) -> float | None:
    """How long a wait for a pooled connection first lasts before the server is asked
    (`None`: the whole `timeout_s`, it is that short)."""
    return SUSPECT_AFTER_S if timeout_s > SUSPECT_AFTER_S else None


def no_connection(waited_s: float) -> ServerNotAnswering:
    return ServerNotAnswering(
        f"server not answering: no connection in {waited_s:g} s, and no answer to a probe")


class Liveness:
    """Whether one server (a host and port) still answers: probed at most once at a time,
    the verdict shared for VERDICT_TTL_S. Thread-safe; `answers_async` for event loops."""

    def __init__(self, url: str, *, probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self._url = url
        self._probe_timeout_s = probe_timeout_s
        self._lock = threading.Condition(threading.Lock())
        self._verdict: bool | None = None
        self._verdict_at = float("-inf")
        self._probing = False

    def answers(self) -> bool:
        """True when the server answered a probe within the last VERDICT_TTL_S (probing
        now if no verdict is that fresh); False when the last probe got no answer."""
        with self._lock:
            while True:
                if time.monotonic() - self._verdict_at < VERDICT_TTL_S:
                    return bool(self._verdict)
                if not self._probing:
                    self._probing = True
                    break
                # Another thread is asking: its verdict is ours too.
                self._lock.wait(self._probe_timeout_s + 1.0)
        verdict = False
        try:
            verdict = self._probe()
        finally:
            with self._lock:
                self._verdict, self._verdict_at = verdict, time.monotonic()
                self._probing = False
                self._lock.notify_all()
        return verdict

    async def answers_async(self) -> bool:
        """`answers()` without blocking the event loop (the probe runs on a thread)."""
        return await asyncio.to_thread(self.answers)

    def _probe(self) -> bool:
        started = time.monotonic()
        try:
            conn = GuardedConnection.connect(
                self._url, autocommit=True, connect_timeout=max(2, round(self._probe_timeout_s)),
                application_name="shardq-probe")
        except psycopg.OperationalError as exc:
            return not no_answer(exc)
        try:
            conn.guard(None, max_wait_s=max(0.1, self._probe_timeout_s - (time.monotonic()
                                                                           - started)))
            conn.execute(SQL["liveness_probe"])
        except psycopg.Error:
            return False
        finally:
            conn.close()
        return True


def no_answer(exc: BaseException) -> bool:
    """True when a connection attempt failed because nobody answered it."""
    lowered = str(exc).lower()
    return any(marker in lowered for marker in _NO_ANSWER)


_servers: dict[tuple[str, str], Liveness] = {}
_servers_lock = threading.Lock()


def server_key(url: str) -> tuple[str, str]:
    """The server a URL reaches: its host (or socket folder, or address) and port."""
    params = conninfo_to_dict(url)
    host = str(params.get("hostaddr") or params.get("host") or "")
    return host, str(params.get("port") or "5432")


def liveness_of(url: str) -> Liveness:
    """The process's one Liveness of the server `url` reaches (made on first use, probing
    through `url`: any database of a server answers for the server)."""
    key = server_key(url)
    with _servers_lock:
        found = _servers.get(key)
        if found is None:
            found = _servers[key] = Liveness(url)
        return found


class _Guard:
    """What bounds one connection's round trips: a Liveness to ask, a hard cap, or both."""

    __slots__ = ("liveness", "max_wait_s")

    def __init__(self, liveness: Liveness | None, max_wait_s: float | None) -> None:
        self.liveness = liveness
        self.max_wait_s = max_wait_s

    @classmethod
    def of(cls, liveness: Liveness | None, max_wait_s: float | None) -> _Guard | None:
        """The bounds, or None for a connection left unbounded (neither is given)."""
        return cls(liveness, max_wait_s) if liveness or max_wait_s is not None else None

    def first_slice(self) -> float:
        return min(SUSPECT_AFTER_S, self.max_wait_s or SUSPECT_AFTER_S)

    def next_slice(self, waited: float) -> float | None:
        """The next slice to wait, or None when the hard cap is reached."""
        if self.max_wait_s is not None and waited >= self.max_wait_s:
            return None
        step = VERDICT_TTL_S if self.liveness is not None else float("inf")
        if self.max_wait_s is not None:
            step = min(step, self.max_wait_s - waited)
        return step

    def describe(self, waited: float) -> str:
        why = ("no answer to a probe either" if self.liveness is not None
               and (self.max_wait_s is None or waited < self.max_wait_s)
               else f"past the {self.max_wait_s:g} s cap")
        return f"server not answering: no answer in {waited:.1f} s ({why}); connection closed"


class GuardedConnection(psycopg.Connection[dict[str, Any]]):
    """A connection whose every round trip is bounded (see the module's docstring).

    Unguarded until `guard()` is called: pools call it as they open each connection.
    A wait given its own timeout (`notifies(timeout=...)`, a cancel) keeps it.

    `schema` is the schema of the shard it is lent to: its statements are rendered for
    it (shards/layout.py).
    """

    _guard: _Guard | None = None
    schema: str = DEFAULT_SCHEMA

    def __init__(self, pgconn: PGconn, row_factory: Any = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.cursor_factory = SchemaCursor

    def guard(self, liveness: Liveness | None, *, max_wait_s: float | None = None) -> None:
        self._guard = _Guard.of(liveness, max_wait_s)

    @contextmanager
    def capped(self, seconds: float) -> Iterator[None]:
        """Round trips within the block wait at most `seconds`, whatever a probe says: for
        a statement that must be quick (a LISTEN connection's check), where a connection
        of its own that went silent could otherwise hide behind a server that answers."""
        saved = self._guard
        cap = seconds if saved is None or saved.max_wait_s is None \
            else min(seconds, saved.max_wait_s)
        self._guard = _Guard(saved.liveness if saved else None, cap)
        try:
            yield
        finally:
            self._guard = saved

    def wait(self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S,
             timeout: float | None = None) -> RV:
        guard = self._guard
        if guard is None or timeout is not None:
            return super().wait(gen, interval, timeout)
        started = time.monotonic()
        step: float | None = guard.first_slice()
        while step is not None:
            try:
                return super().wait(gen, interval, step)
            except _WAIT_TIMEOUT:
                waited = time.monotonic() - started
                step = guard.next_slice(waited)
                if step is not None and guard.liveness is not None \
                        and not guard.liveness.answers():
                    step = None
        self.pgconn.finish()  # the generator's state is unknown: this connection is done
        raise ServerNotAnswering(guard.describe(time.monotonic() - started))


class GuardedAsyncConnection(psycopg.AsyncConnection[dict[str, Any]]):
    """GuardedConnection for asyncio: the same bounds, the probe on a thread."""

    _guard: _Guard | None = None
    schema: str = DEFAULT_SCHEMA

    def __init__(self, pgconn: PGconn, row_factory: Any = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.cursor_factory = AsyncSchemaCursor

    def guard(self, liveness: Liveness | None, *, max_wait_s: float | None = None) -> None:
        self._guard = _Guard.of(liveness, max_wait_s)

    async def wait(self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S,
                   timeout: float | None = None) -> RV:
        guard = self._guard
        if guard is None or timeout is not None:
            return await super().wait(gen, interval, timeout)
        started = time.monotonic()
        step: float | None = guard.first_slice()
        while step is not None:
            try:
                return await super().wait(gen, interval, step)
            except _WAIT_TIMEOUT:
                waited = time.monotonic() - started
                step = guard.next_slice(waited)
                if step is not None and guard.liveness is not None \
                        and not await guard.liveness.answers_async():
                    step = None
        self.pgconn.finish()
        raise ServerNotAnswering(guard.describe(time.monotonic() - started))
