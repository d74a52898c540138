"""SignalCoalescer against real shards: concurrent single signals share statements, and
each caller gets what `signal_many([its signal])` would answer: its refusal, its
duplicate, its own failure, never a neighbour's; a caller cancelled before its batch
left stores nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from shardq.client.async_client import AsyncClient
from shardq.client.coalesce import SignalCoalescer
from shardq.core.errors import ExecutionNotFound, InvalidArgument, SignalRefused, StoreRejected
from shardq.core.models import SignalRequest, SignalResult
from shardq.shards.config import Shard, ShardMap

from ..app import registry
from ..support import all_rows

UNKNOWN = uuid.UUID("018f0000-0000-8000-8000-000000000000")


async def _parked(client: AsyncClient, count: int, prefix: str) -> list[uuid.UUID]:
    started = await client.start_many("park", [(f"{prefix}-{i}", None) for i in range(count)])
    return [s.execution_id for s in started]


def _signals(shard_map: ShardMap) -> int:
    return sum(n for (n,) in all_rows(shard_map, "SELECT count(*) FROM shardq.signals"))


def test_concurrent_signals_share_statements_and_each_gets_its_own_answer(
    shard_map: ShardMap,
) -> None:
    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry) as client:
            runs = await _parked(client, 20, "share")
            done = (await client.start("park", "finished")).execution_id
            await client.cancel(done)
            coalescer = SignalCoalescer(client)
            requests = [
                *(SignalRequest(r, "go", {"n": i}, f"key-{i}") for i, r in enumerate(runs)),
                *(SignalRequest(runs[0], "go", {"again": i}, "key-0") for i in range(3)),
                SignalRequest(runs[1], "go", {"unkeyed": True}),
                SignalRequest(UNKNOWN, "go"),
                SignalRequest(runs[2], "not a name"),
                SignalRequest(done, "go"),
                SignalRequest(runs[3], "go"),
            ]
            answers = await asyncio.gather(
                *(coalescer.signal(r) for r in requests),
                coalescer.signal(SignalRequest(runs[4], "go"), tenant="other"))
            await coalescer.close()
            assert coalescer.statements < len(answers)  # shared, under this much load

            delivered = [a.delivered for a in answers[:20]]
            assert delivered == [True] * 20
            repeats = answers[20:23]
            assert [a.delivered for a in repeats] == [False] * 3
            assert {a.signal_id for a in repeats} == {answers[0].signal_id}
            assert answers[23].delivered and answers[23].error is None
            assert isinstance(answers[24].error, ExecutionNotFound)
            assert isinstance(answers[25].error, InvalidArgument)
            assert isinstance(answers[26].error, SignalRefused)
            assert answers[26].error.reason_code == "target_finished"
            assert answers[27].delivered
            assert isinstance(answers[28].error, ExecutionNotFound)  # another tenant's
        # 20 keyed, the unkeyed one and the one with no payload: nothing else stored.
        assert _signals(shard_map) == 22

    asyncio.run(run())


@pytest.fixture
def poison(shard_map: ShardMap) -> Iterator[None]:
    """A rule the database enforces that the client does not know (as a constraint an
    operator added would be): a payload {"poison": true} fails the whole statement."""
    def each(sql: str) -> None:
        for shard in shard_map.shards:
            with psycopg.connect(shard.url, autocommit=True) as conn:
                conn.execute(sql)

    each("CREATE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ "
         "BEGIN IF NEW.payload = '{\"poison\": true}'::jsonb THEN RAISE EXCEPTION "
         "'poisoned' USING ERRCODE = '22023'; END IF; RETURN NEW; END $$")
    each("CREATE TRIGGER refuse_poison BEFORE INSERT ON shardq.signals "
         "FOR EACH ROW EXECUTE FUNCTION public.refuse_poison()")
    try:
        yield
    finally:
        each("DROP TRIGGER refuse_poison ON shardq.signals")
        each("DROP FUNCTION public.refuse_poison()")


def test_a_signal_that_fails_its_statement_fails_alone(
    shard_map: ShardMap, poison: None
) -> None:
    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry) as client:
            runs = await _parked(client, 30, "poison")
            coalescer = SignalCoalescer(client)
            requests = [SignalRequest(r, "go", {"n": i}) for i, r in enumerate(runs)]
            requests[7] = SignalRequest(runs[7], "go", {"poison": True})
            answers = await asyncio.gather(*(coalescer.signal(r) for r in requests),
                                           return_exceptions=True)
            await coalescer.close()
            assert isinstance(answers[7], StoreRejected), answers[7]
            others = [a for i, a in enumerate(answers) if i != 7]
            assert all(isinstance(a, SignalResult) and a.delivered for a in others), others
        assert _signals(shard_map) == 29

    asyncio.run(run())


def _lock_waiters(shard: Shard) -> int:
    with psycopg.connect(shard.url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                           "'Lock' AND datname = current_database()").fetchone()
        return int(row[0]) if row else 0


def test_a_caller_cancelled_before_its_batch_left_stores_nothing(shard_map: ShardMap) -> None:
    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry) as client:
            first, second = await _parked(client, 2, "held")
            shard = client.map.for_execution(first)
            while client.map.for_execution(second) != shard:  # the same lane
                (second,) = await _parked(client, 1, f"held-{time.monotonic_ns()}")
            coalescer = SignalCoalescer(client, in_flight=1)
            with psycopg.connect(shard.url) as holder:
                # The first signal's statement waits on its run's lock, holding the lane.
                holder.execute("SELECT 1 FROM shardq.executions WHERE id = %s FOR UPDATE",
                               (first,))
                ahead = asyncio.create_task(coalescer.signal(SignalRequest(first, "go", 1)))
                deadline = time.monotonic() + 10
                while not _lock_waiters(shard):
                    assert time.monotonic() < deadline, "the statement never waited"
                    await asyncio.sleep(0.01)
                queued = asyncio.create_task(coalescer.signal(SignalRequest(second, "go", 2)))
                await asyncio.sleep(0.05)
                queued.cancel()
                holder.rollback()
            assert (await ahead).delivered
            with pytest.raises(asyncio.CancelledError):
                await queued
            await coalescer.close()
        rows = all_rows(shard_map, "SELECT execution_id FROM shardq.signals")
        assert rows == [(first,)]

    asyncio.run(run())


HOSTILE: list[tuple[str, SignalRequest]] = [
    ("not an id", SignalRequest("not-a-uuid", "go")),
    ("a uuid4", SignalRequest(str(uuid.uuid4()), "go")),
    ("blank name", SignalRequest(UNKNOWN, " ")),
    ("reserved name", SignalRequest(UNKNOWN, "shardq.go")),
    ("NUL in the name", SignalRequest(UNKNOWN, "g\x00o")),
    ("NUL in the payload", SignalRequest(UNKNOWN, "go", {"a": "\x00"})),
    ("a lone surrogate", SignalRequest(UNKNOWN, "go", "\ud800")),
    ("NaN", SignalRequest(UNKNOWN, "go", float("nan"))),
    ("blank key", SignalRequest(UNKNOWN, "go", None, " ")),
    ("a key too long", SignalRequest(UNKNOWN, "go", None, "k" * 5000)),
    ("a payload too large", SignalRequest(UNKNOWN, "go", "x" * (2 << 20))),
    ("not JSON", SignalRequest(UNKNOWN, "go", object())),
]


def _said(answer: object) -> tuple[str, str]:
    error = answer.error if isinstance(answer, SignalResult) else answer
    return type(error).__name__, str(error)


def test_hostile_signals_are_answered_as_signal_many_answers_them(shard_map: ShardMap) -> None:
    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry) as client:
            coalescer = SignalCoalescer(client)
            for label, request in HOSTILE:
                direct = await asyncio.gather(client.signal_many([request]),
                                              return_exceptions=True)
                shared = await asyncio.gather(coalescer.signal(request),
                                              return_exceptions=True)
                expected = direct[0][0] if isinstance(direct[0], list) else direct[0]
                assert _said(shared[0]) == _said(expected), label
                assert _said(expected)[0] != "NoneType", label  # every one is refused
            await coalescer.close()
        assert _signals(shard_map) == 0

    asyncio.run(run())
