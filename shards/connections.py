"""Direct connections to one shard, and one-line errors when they fail.

Every connection, pooled (shards/pools.py) or direct, carries TCP keepalives and a
TCP user timeout (SILENT_PEER_TIMEOUT_S): a server that vanished without resetting
its connections (a hard stop, a path that drops packets) would otherwise block a
statement for the kernel's retransmission limit, about 15 minutes.
statement_timeout cannot help there: it is enforced by the server, which a silent
path never reaches. Every connection is also a GuardedConnection
(shards/liveness.py): a server that is up but frozen keeps TCP alive, and a round
trip to it fails within HUNG_NOTICE_S once a probe finds it does not answer.

The pools, the migrator and the shard check all connect through here, beneath
each of them: a module that verifies shards for the pools must not need the pools
to reach a shard.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import PoolTimeout

from shardq.shards.config import Shard
from shardq.shards.errors import ShardUnavailable
from shardq.shards.liveness import GuardedConnection, liveness_of

CONNECT_TIMEOUT_S = 5
DictConnection = psycopg.Connection[dict[str, Any]]

TCP_SETTINGS = {
    "keepalives": "1",
    "keepalives_idle": "4",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "8000",
}
"""libpq's settings for a silent peer, added to every shard URL that sets none of its own.
A statement whose bytes the peer never acknowledges fails after tcp_user_timeout
(8 s); one sent whole, waiting on a peer that went silent afterwards, fails once
keepalive probes go unanswered (idle 4 s, then probes every 2 s, cut off by the
same 8 s): about 12 s at most. Ignored on Unix sockets."""
SILENT_PEER_TIMEOUT_S = 12.0
"""The longest a statement to a silent shard blocks before it fails (see TCP_SETTINGS)."""


def tcp_settings(url: str) -> dict[str, Any]:
    """TCP_SETTINGS, less those the URL sets itself (an operator's choice wins)."""
    given = conninfo_to_dict(url)
    return {k: v for k, v in TCP_SETTINGS.items() if k not in given}


def describe_connect_error(shard: Shard, exc: BaseException) -> ShardUnavailable:
    """Turn libpq's multi-line text into a one-line cause that names the shard."""
    text = str(exc).strip()
    lowered = text.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        cause = "wrong password or user"
    elif "does not exist" in lowered and "database" in lowered:
        cause = "database does not exist"
    elif "connection refused" in lowered or "no such file or directory" in lowered:
        cause = "unreachable (connection refused)"
    elif "timeout" in lowered or "timed out" in lowered or isinstance(exc, PoolTimeout):
        cause = "unreachable (timed out)"
    elif "could not translate host name" in lowered:
        cause = "unreachable (unknown host)"
    elif "too many clients" in lowered or "remaining connection slots" in lowered:
        cause = "out of connection slots (too many clients)"
    elif "starting up" in lowered or "shutting down" in lowered or "recovery" in lowered:
        cause = "restarting (" + text.splitlines()[0].removeprefix("FATAL:  ") + ")"
    elif text.splitlines() and "server closed the connection unexpectedly" in (
            text.splitlines()[0].lower()):
        # libpq's lines after it are its guess ("... before or while processing the
        # request."), which alone says nothing of what happened.
        cause = "connection lost (the server closed it unexpectedly)"
    else:
        # The first line is the cause (a FATAL the server sent, the statement
        # abandoned); libpq's later lines are hints.
        cause = text.splitlines()[0] if text else type(exc).__name__
    return ShardUnavailable(f"{shard.label}: {cause}")


def connect(shard: Shard, *, autocommit: bool = False) -> GuardedConnection:
    """A direct connection outside any pool (migrations, LISTEN, one-off CLI checks),
    its round trips bounded like a pooled one's."""
    try:
        conn = GuardedConnection.connect(
            shard.conninfo,
            autocommit=autocommit,
            row_factory=dict_row,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name="shardq",
            **tcp_settings(shard.conninfo),
        )
    except psycopg.OperationalError as exc:
        raise describe_connect_error(shard, exc) from exc
    conn.guard(liveness_of(shard.conninfo))
    conn.schema = shard.schema
    return conn


def connection_lost(exc: psycopg.Error) -> bool:
    """True when the error means the connection itself broke, not the statement."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE


_SERVER_GONE = frozenset({"57P01", "57P02", "57P03"})  # admin/crash shutdown, cannot connect now
