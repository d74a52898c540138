"""Which delivery errors take a target shard down in the relay, and which stay with their rows.

A shard marked down has every row for it deferred until its prober sees it take
writes; an error that belongs to a statement (a deadlock, one tenant's bad
batch) must only retry the rows it concerns.
"""

from __future__ import annotations

import pytest
from psycopg import errors

from shardq.core.errors import ShardUnavailable, StoreConflict, StoreRejected
from shardq.outbox.relay import TargetSilent, shard_level
from shardq.shards.config import ShardMap

SHARD = ShardMap.from_urls(["postgresql://h/db"]).shards[0]

CASES: list[tuple[str, BaseException, bool]] = [
    ("refused or lost connection", ShardUnavailable("shard-0: unreachable"), True),
    ("no answer by the deadline", TargetSilent(SHARD, 3.0), True),
    ("socket error", OSError("broken pipe"), True),
    ("read-only server", errors.ReadOnlySqlTransaction(), True),
    ("out of connection slots", errors.TooManyConnections(), True),
    ("disk full", errors.DiskFull(), True),
    ("shutting down", errors.AdminShutdown(), True),
    ("statement cancelled", errors.QueryCanceled(), True),
    ("connection failure", errors.ConnectionFailure(), True),
    ("deadlock between two senders", StoreConflict("shard-0: 40P01: deadlock"), False),
    ("a value the database refused", StoreRejected("shard-0: refused a value"), False),
    ("a constraint one row broke", errors.UniqueViolation(), False),
    ("a function raising for one row", errors.RaiseException(), False),
    ("a lock another statement holds", errors.LockNotAvailable(), False),
]


@pytest.mark.parametrize(("error", "down"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_error_takes_the_shard_down_only_when_it_speaks_of_the_shard(
    error: BaseException, down: bool
) -> None:
    assert shard_level(error) is down

