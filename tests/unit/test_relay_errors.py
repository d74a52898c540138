"""Which delivery errors take a target shard down in the relay, and which stay with their rows.

A shard marked down has every row for it deferred until its prober sees it take
writes; an error that belongs to a statement (a deadlock, one tenant's bad
batch) must only retry the rows it concerns. The relay sees driver errors only
as the store words them, so the server's errors go through the store's mapping.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from shardq.core.errors import ShardUnavailable, StoreConflict, StoreRejected
from shardq.outbox.relay import TRANSIENT, TargetSilent, shard_level
from shardq.shards.config import ShardMap
from shardq.shards.errors import ShardqError
from shardq.store.statements import translated, unmapped

SHARD = ShardMap.from_urls(["postgresql://h/db"]).shards[0]


def stored(exc: psycopg.Error) -> Exception:
    """`exc` as a store's caller meets it (the pool's own mapping aside, which
    reports a lost connection as ShardUnavailable too)."""
    return translated(SHARD, exc) or unmapped(SHARD, exc)


CASES: list[tuple[str, BaseException, bool]] = [
    ("refused or lost connection", ShardUnavailable("shard-0: unreachable"), True),
    ("no answer by the deadline", TargetSilent(SHARD, 3.0), True),
    ("socket error", OSError("broken pipe"), True),
    ("read-only server", stored(errors.ReadOnlySqlTransaction()), True),
    ("out of connection slots", stored(errors.TooManyConnections()), True),
    ("disk full", stored(errors.DiskFull()), True),
    ("shutting down", stored(errors.AdminShutdown()), True),
    ("statement cancelled", stored(errors.QueryCanceled()), True),
    ("connection failure", stored(errors.ConnectionFailure()), True),
    ("connection closed under the statement", stored(psycopg.InterfaceError("closed")), True),
    ("deadlock between two senders", stored(errors.DeadlockDetected()), False),
    ("a value the database refused", StoreRejected("shard-0: refused a value"), False),
    ("a constraint one row broke", stored(errors.UniqueViolation()), False),
    ("a function raising for one row", stored(errors.RaiseException()), False),
    ("a lock another statement holds", stored(errors.LockNotAvailable()), False),
]


@pytest.mark.parametrize(("error", "down"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_error_takes_the_shard_down_only_when_it_speaks_of_the_shard(
    error: BaseException, down: bool
) -> None:
    assert shard_level(error) is down


@pytest.mark.parametrize("error", [c[1] for c in CASES if c[2] or "lock" in c[0]
                                   or "constraint" in c[0] or "deadlock" in c[0]],
                         ids=[c[0] for c in CASES if c[2] or "lock" in c[0]
                              or "constraint" in c[0] or "deadlock" in c[0]])
def test_the_relay_retries_what_the_store_raises_for_a_server_or_a_statement(
    error: BaseException,
) -> None:
    assert isinstance(error, TRANSIENT)


@pytest.mark.parametrize("exc", [errors.UniqueViolation(), errors.RaiseException(),
                                 psycopg.InterfaceError("closed"), errors.QueryCanceled(),
                                 errors.DeadlockDetected(), errors.InvalidTextRepresentation()])
def test_no_driver_error_leaves_the_store_as_it_is(exc: psycopg.Error) -> None:
    assert isinstance(stored(exc), ShardqError)
    assert not isinstance(stored(exc), psycopg.Error)
    assert isinstance(stored(errors.DeadlockDetected()), StoreConflict)
