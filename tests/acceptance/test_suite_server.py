"""The suite's own server choice and clean-up (tests/conftest.py), against a real small server.

A throw-away server with max_connections 13 stands in for a stock one with other work
beside it: the budget check must count what is in use, fall back when short, and the
leftover sweep must drop only what a dead test process left.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from shardq.shards import embedded

from ..conftest import Server, choose_server, connection_budget, sweep_leftovers

MAX_CONNECTIONS = 13  # more than max_wal_senders' default 10, which PostgreSQL requires
RESERVED = 3  # superuser_reserved_connections' default


@pytest.fixture(scope="module")
def small_server() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(embedded._SERVER_SETTINGS, "max_connections", str(MAX_CONNECTIONS))
        server = embedded.EmbeddedPostgres().start()
    try:
        yield server.dsn("postgres")
    finally:
        server.stop()


def hold(dsn: str, count: int) -> list[psycopg.Connection[tuple[object, ...]]]:
    return [psycopg.connect(dsn, autocommit=True) for _ in range(count)]


def settled(dsn: str, free: int) -> None:
    """Until the server counts `free` again: the backend of the last check's connection
    leaves pg_stat_activity a moment after its client closed it (seen in CI: one more
    "in use" on the next reading)."""
    deadline = time.monotonic() + 5
    while connection_budget(dsn)[0] != free and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_server_without_the_connections_the_suite_needs_falls_back_to_embedded(
    small_server: str,
) -> None:
    others = hold(small_server, 4)  # "other work beside it"
    try:
        free, reckoning = connection_budget(small_server)
        assert free == MAX_CONNECTIONS - RESERVED - 4
        assert reckoning == f"{MAX_CONNECTIONS} max_connections - {RESERVED} reserved - 4 in use"

        settled(small_server, free)
        short = choose_server(small_server, free + 1, embedded_available=lambda: True)
        assert short.dsn is None
        assert f"has {free} connections free" in short.reason
        assert "needs 7: using an embedded server instead" in short.reason

        settled(small_server, free)
        assert choose_server(small_server, free).dsn == small_server
        # $SHARDQ_TEST_DSN is what the user asked for: kept, with the shortfall said.
        kept = choose_server(small_server, free + 1, explicit=True)
        assert kept.dsn == small_server and "anyway" in kept.reason
        # With nothing to fall back on, the short server is still better than none.
        stuck = choose_server(small_server, free + 1, embedded_available=lambda: False)
        assert stuck.dsn == small_server and "no embedded server" in stuck.reason
    finally:
        for conn in others:
            conn.close()
    settled(small_server, MAX_CONNECTIONS - RESERVED)
    assert connection_budget(small_server)[0] == MAX_CONNECTIONS - RESERVED


def test_a_server_that_does_not_answer_falls_back() -> None:
    choice = choose_server("postgresql://postgres@/postgres?host=/nonexistent&port=1", 1)
    assert choice.dsn is None and "does not answer" in choice.reason


def test_the_sweep_drops_only_databases_whose_test_process_is_gone(small_server: str) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    names = {
        "dead": f"shardq_t{gone.pid}_abc123_s0_0000",
        "alive": f"shardq_t{os.getpid()}_abc123_s0_0000",
        "busy": f"shardq_t{gone.pid}_def456_s0_0000",  # its pid gone, still connected to
        "other": "shardq_tnot_a_pid",
    }
    with psycopg.connect(small_server, autocommit=True) as conn:
        for name in names.values():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    busy = psycopg.connect(embedded_url(small_server, names["busy"]))
    try:
        assert sweep_leftovers(small_server) == [names["dead"]]
    finally:
        busy.close()
    with psycopg.connect(small_server, autocommit=True) as conn:
        left = {n for (n,) in conn.execute("SELECT datname FROM pg_database")}
        assert left >= {names["alive"], names["busy"], names["other"]}
        assert names["dead"] not in left
        for name in set(names.values()) & left:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_drop_all_waits_out_a_full_server(small_server: str) -> None:
    server = Server(small_server)
    server.create_databases(2, tag="full")
    others = hold(small_server, MAX_CONNECTIONS)  # superusers may use the reserved slots
    with pytest.raises(psycopg.OperationalError, match=r"too many clients|remaining connection"):
        psycopg.connect(small_server)

    def free_them() -> None:
        for conn in others:
            conn.close()

    release = threading.Timer(0.5, free_them)
    release.start()
    started = time.monotonic()
    try:
        server.drop_all(retry_for=10)
    finally:
        release.join()
    assert 0.4 < time.monotonic() - started < 10
    assert server.created == []
    with psycopg.connect(small_server) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE %s", [server.prefix + "%"]
        ).fetchone() == (0,)


def embedded_url(admin_dsn: str, dbname: str) -> str:
    return Server(admin_dsn).url(dbname)
