"""How a broken connection is worded in logs and errors: one line that names the shard and
keeps libpq's cause, never only its closing hint."""

from __future__ import annotations

import psycopg
import pytest

from shardq.shards.config import ShardMap
from shardq.shards.connections import describe_connect_error

SHARD = ShardMap.from_urls(["postgresql://app@db.example:5432/orders"]).shards[0]
HINT = ("\n\tThis probably means the server terminated abnormally\n"
        "\tbefore or while processing the request.")


@pytest.mark.parametrize(("text", "cause"), [
    ("server closed the connection unexpectedly" + HINT,
     "connection lost (the server closed it unexpectedly)"),
    ("consuming input failed: server closed the connection unexpectedly" + HINT,
     "connection lost (the server closed it unexpectedly)"),
    ("terminating connection due to administrator command\n"
     "server closed the connection unexpectedly" + HINT,
     "terminating connection due to administrator command"),
    ("server not answering: no answer in 5.0 s (no answer to a probe either); "
     "connection closed",
     "server not answering: no answer in 5.0 s (no answer to a probe either); "
     "connection closed"),
    ('connection to server at "db.example" (10.0.0.1), port 5432 failed: Connection refused\n'
     "\tIs the server running on that host and accepting TCP/IP connections?",
     "unreachable (connection refused)"),
])
def test_a_lost_connection_keeps_its_cause(text: str, cause: str) -> None:
    error = describe_connect_error(SHARD, psycopg.OperationalError(text))
    assert str(error) == f"{SHARD.label}: {cause}"
    assert "\n" not in str(error)
