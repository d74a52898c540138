"""AsyncClient against real shards: every call answers and refuses as Client's does (one
table run through both), hostile inputs are refused with the sync client's words and
nothing stored, and a task cancelled mid-call leaves no half-written operation and no
connection lent out."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

import psycopg
import pytest

from shardq.client.async_client import AsyncClient
from shardq.client.client import Client
from shardq.core.errors import InvalidArgument
from shardq.core.models import SignalRequest
from shardq.core.rules import Limits
from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.config import ShardMap
from shardq.shards.errors import ShardUnavailable
from shardq.shards.pools import ShardPools
from shardq.store.async_store import AsyncStore
from shardq.store.store import Store

from ..app import registry
from ..support import all_rows, key_on
from .test_client_inputs import CALLS, _counts

OTHER = uuid.UUID("018f0000-0000-7000-8000-000000000000")

Anyclient = Any  # Client or AsyncClient: the table's calls are written once for both
Call = Callable[[Anyclient, dict[str, Any]], Any]


async def _outcome(call: Call, client: Anyclient, ctx: dict[str, Any]) -> Any:
    """What a call answered, or ('raised', type, message) when it refused."""
    try:
        answer = call(client, ctx)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:  # the refusal is what is compared
        return ("raised", type(exc).__name__, str(exc), getattr(exc, "reason_code", None))
    return answer


async def _every_page(client: Anyclient, **filters: Any) -> tuple[int, list[Any]]:
    """Every page of list_runs two runs at a time: how many pages, and the runs by key."""
    pages, items, cursor = 0, list[Any](), None
    while True:
        page = client.list_runs(limit=2, cursor=cursor, **filters)
        page = await page if inspect.isawaitable(page) else page
        pages, items, cursor = pages + 1, items + list(page.items), page.next_cursor
        if cursor is None:
            return pages, sorted(items, key=lambda run: run.workflow_id)


async def _one_page(client: Anyclient, **filters: Any) -> tuple[list[Any], tuple[str, ...]]:
    """One page of list_runs, its runs by key (see _every_page) and the shards it lacks."""
    page = client.list_runs(**filters)
    page = await page if inspect.isawaitable(page) else page
    return sorted(page.items, key=lambda run: run.workflow_id), page.unavailable_shards


class _Names:
    """Ids and instants replaced by their order of first appearance, so two runs of the
    same scenario on fresh shards compare equal when they behaved alike."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, object], str] = {}

    def name(self, value: object, kind: str) -> str:
        return self.seen.setdefault((kind, value), f"<{kind}{len(self.seen)}>")

    def __call__(self, value: Any, key: str = "") -> Any:  # noqa: PLR0911 - one per kind
        if isinstance(value, uuid.UUID):
            return self.name(value, "id")
        if key == "next_cursor" and value is not None:
            return "<cursor>"  # a position: an id, encoded
        if isinstance(value, datetime):
            return "<time>"
        if isinstance(value, enum.Enum):
            return value.value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self(getattr(value, f.name), f.name)
                    for f in dataclasses.fields(value)}
        if isinstance(value, BaseException):
            return (type(value).__name__, self(str(value)))
        if isinstance(value, dict):
            return {k: self(v, str(k)) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self(v, key) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and key in (
            "id", "signal_id", "update_id", "seq", "earlier_id"
        ):
            return self.name(value, "n")
        if isinstance(value, str):
            for (kind, original), token in list(self.seen.items()):
                if kind == "id":
                    value = value.replace(str(original), token)
            return value
        return value


TABLE: list[tuple[str, Call]] = [
    ("start", lambda c, x: c.start("park", "a", {"n": 1})),
    ("start-again", lambda c, x: c.start("park", "a", {"n": 2})),
    ("start_many", lambda c, x: c.start_many("park", [("b", 1), ("c", [2])])),
    ("start-unknown-workflow", lambda c, x: c.start("nope", "k")),
    ("start-bad-tenant", lambda c, x: c.start("park", "k", tenant="no spaces")),
    ("start-schema", lambda c, x: c.start("cart", "k", {"customer": 5})),
    ("get", lambda c, x: c.get(x["a"])),
    ("get-other-tenant", lambda c, x: c.get(x["a"], tenant="other")),
    ("get-unknown", lambda c, x: c.get(OTHER)),
    ("get-not-an-id", lambda c, x: c.get("not-an-id")),
    ("signal", lambda c, x: c.signal(x["a"], "go", {"x": 1}, idempotency_key="k1")),
    ("signal-repeat", lambda c, x: c.signal(x["a"], "go", {"x": 2}, idempotency_key="k1")),
    ("signal-reserved", lambda c, x: c.signal(x["a"], "shardq.go")),
    ("signal-unknown-run", lambda c, x: c.signal(OTHER, "go")),
    ("signal-other-tenant", lambda c, x: c.signal(x["a"], "go", tenant="other")),
    ("signal_many", lambda c, x: c.signal_many([
        SignalRequest(x["a"], "go", 1), SignalRequest(x["a"], "bad name"),
        SignalRequest(OTHER, "go"), SignalRequest(x["a"], "go", 2, "k1")])),
    ("signal-schema", lambda c, x: c.signal(x["cart"], "add_item", {"sku": 1})),
    ("signal_with_start", lambda c, x: c.signal_with_start("park", "d", None, "go", 1)),
    ("signal_with_start-again", lambda c, x: c.signal_with_start(
        "park", "d", None, "go", 2, idempotency_key="w")),
    ("signal_with_start-bad", lambda c, x: c.signal_with_start("park", "e", None, "__x")),
    ("describe", lambda c, x: c.describe(x["a"])),
    ("describe-no-history", lambda c, x: c.describe(x["a"], history=False)),
    ("history", lambda c, x: c.history(x["a"])),
    ("history-other-tenant", lambda c, x: c.history(x["a"], tenant="other")),
    # Two runs started in one millisecond order by bucket, in two by time: which runs
    # fill a page differs between passes, so every page is read and compared as a set.
    ("list_runs", lambda c, x: _every_page(c, workflow="park")),
    ("list_runs-bad", lambda c, x: c.list_runs(workflow="x\x00")),
    ("list_runs-cursor", lambda c, x: c.list_runs(cursor="garbage")),
    ("list_runs-skip", lambda c, x: _one_page(c, workflow="park", skip_unavailable=True)),
    ("interface", lambda c, x: c.interface("cart")),
    ("interface-unknown", lambda c, x: c.interface("nope")),
    ("query", lambda c, x: c.query(x["cart"], "contents")),
    ("query-unknown", lambda c, x: c.query(x["cart"], "nothing")),
    ("query-argument", lambda c, x: c.query(x["cart"], "item", "one")),
    ("update-timeout", lambda c, x: c.update(x["cart"], "add_item",
                                             {"sku": "s", "quantity": 1}, wait=0.05,
                                             idempotency_key="u1")),
    ("update-payload", lambda c, x: c.update(x["cart"], "add_item", {"sku": 1})),
    ("update-wait", lambda c, x: c.update(x["cart"], "add_item", None, wait=-1)),
    ("update-finished", lambda c, x: c.update(x["done"], "add_item",
                                              {"sku": "s", "quantity": 1})),
    ("update-not-a-cart", lambda c, x: c.update(x["b"], "add_item", None)),
    ("update_with_start", lambda c, x: c.update_with_start(
        "cart", "cart-2", {"customer": "c"}, "add_item", {"sku": "s", "quantity": 1},
        wait=0.05)),
    ("pending_interrupts", lambda c, x: c.pending_interrupts()),
    ("pending_interrupts-limit", lambda c, x: c.pending_interrupts(limit=0)),
    ("pending_interrupts-waited", lambda c, x: c.pending_interrupts(waited_s=-1)),
    ("pending_interrupts-skip", lambda c, x: c.pending_interrupts(skip_unavailable=True)),
    ("decide-none-open", lambda c, x: c.decide(x["a"], "review", "approve",
                                               decision_id="d1", actor="me")),
    ("decide-action", lambda c, x: c.decide(x["a"], "review", "maybe",
                                            decision_id="d1", actor="me")),
    ("decide-label", lambda c, x: c.decide(x["a"], "review", "approve",
                                           decision_id=" ", actor="me")),
    ("decide-other-tenant", lambda c, x: c.decide(x["a"], "review", "approve",
                                                  decision_id="d1", actor="me",
                                                  tenant="other")),
    ("set_priority", lambda c, x: c.set_priority(x["a"], 4)),
    ("set_priority-finished", lambda c, x: c.set_priority(x["done"], 4)),
    ("set_priority-bad", lambda c, x: c.set_priority(x["a"], 10)),
    ("set_priority-other-tenant", lambda c, x: c.set_priority(x["c"], 1, tenant="other")),
    ("start_many-keyed", lambda c, x: c.start_many(
        "cart", [("k1", {"customer": "c"}), ("k2", {"customer": "c"})],
        concurrency=("acct:1", 1))),
    ("start-bad-key", lambda c, x: c.start("cart", "k3", {"customer": "c"},
                                           concurrency=("", 1))),
    ("concurrency_limit", lambda c, x: c.concurrency_limit("acct:1")),
    ("concurrency_limit-unknown", lambda c, x: c.concurrency_limit("acct:2")),
    ("concurrency_limit-bad", lambda c, x: c.concurrency_limit("a\x00")),
    ("set_concurrency_limit", lambda c, x: c.set_concurrency_limit("acct:1", 2)),
    ("set_concurrency_limit-reset", lambda c, x: c.set_concurrency_limit("acct:1", None)),
    ("set_concurrency_limit-unknown", lambda c, x: c.set_concurrency_limit("acct:2", 2)),
    ("set_concurrency_limit-zero", lambda c, x: c.set_concurrency_limit("acct:1", 0)),
    ("busiest_concurrency_keys", lambda c, x: c.busiest_concurrency_keys()),
    ("busiest_concurrency_keys-zero", lambda c, x: c.busiest_concurrency_keys(0)),
    ("cancel", lambda c, x: c.cancel(x["b"], actor="ops")),
    ("cancel-again", lambda c, x: c.cancel(x["b"])),
    ("cancel-other-tenant", lambda c, x: c.cancel(x["c"], tenant="other")),
    ("cancel-bad-actor", lambda c, x: c.cancel(x["c"], actor="")),
]


async def _scenario(client: Anyclient) -> list[tuple[str, Any]]:
    """The table, in order, against one client on empty shards, beside two carts (one
    cancelled: a finished run)."""
    ctx: dict[str, Any] = {}
    names = _Names()
    for key in ("cart", "done"):
        started = client.start("cart", key, {"customer": "c"})
        ctx[key] = (await started if inspect.isawaitable(started) else started).execution_id
        names(ctx[key])
    await _outcome(lambda c, x: c.cancel(x["done"]), client, ctx)
    out: list[tuple[str, Any]] = []
    for label, call in TABLE:
        answer = await _outcome(call, client, ctx)
        if label == "start":
            ctx["a"] = answer.execution_id
        if label == "start_many":
            ctx["b"], ctx["c"] = (r.execution_id for r in answer)
        out.append((label, names(answer)))
    return out


def _empty(shard_map: ShardMap) -> None:
    for shard in shard_map.shards:
        with psycopg.connect(shard.url, autocommit=True) as conn:
            conn.execute("TRUNCATE shardq.history, shardq.signals, shardq.waits, shardq.tasks, "
                         "shardq.outbox, shardq.executions, shardq.concurrency_keys, "
                         "shardq.key_queue RESTART IDENTITY")


def test_every_call_answers_and_refuses_as_the_sync_client(
    client: Client, shard_map: ShardMap
) -> None:
    _empty(shard_map)  # the same ids on both passes
    sync = asyncio.run(_scenario(client))
    _empty(shard_map)

    async def through_async() -> list[tuple[str, Any]]:
        async with AsyncClient.connect(shard_map, registry) as aclient:
            return await _scenario(aclient)

    answers = asyncio.run(through_async())
    assert [label for label, _ in answers] == [label for label, _ in sync]
    for (label, mine), (_, theirs) in zip(answers, sync, strict=True):
        assert mine == theirs, label
    # The table reaches every public call of Client (iter_all pages list_runs, above).
    public = {n for n, v in vars(Client).items() if callable(v) and not n.startswith("_")}
    called = {label.split("-")[0] for label, _ in TABLE}
    assert public - called <= {"close", "connect", "wait", "waiting", "waiting_on_page",
                               "iter_all"}


def test_hostile_inputs_are_refused_in_the_sync_client_s_words(shard_map: ShardMap) -> None:
    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry) as aclient:
            target = str((await aclient.start("park", "target")).execution_id)
            before = _counts(shard_map)
            for label, call, message in CALLS:
                with pytest.raises(InvalidArgument) as info:
                    await call(aclient, target)  # type: ignore[arg-type, misc]
                assert message in str(info.value), label
                assert "\n" not in str(info.value), label
            assert _counts(shard_map) == before

    asyncio.run(run())


def test_limits_are_the_async_client_s_own(shard_map: ShardMap) -> None:
    small = Limits(max_input_bytes=20, max_payload_bytes=10, max_idempotency_key=3)

    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry, limits=small) as aclient:
            started = await aclient.start("park", "small", {"n": 1})
            with pytest.raises(InvalidArgument, match="at most 20"):
                await aclient.start("park", "large", {"text": "too long for twenty"})
            with pytest.raises(InvalidArgument, match="at most 10"):
                await aclient.signal(started.execution_id, "go", "eleven chars")
            with pytest.raises(InvalidArgument, match="at most 3"):
                await aclient.signal(started.execution_id, "go", idempotency_key="four")
            assert (await aclient.signal(started.execution_id, "go", 1,
                                         idempotency_key="abc")).delivered

    asyncio.run(run())


def test_a_partial_page_names_the_shard_it_lacks_in_both_clients(shard_map: ShardMap) -> None:
    """With `skip_unavailable`, a page of runs or of open interrupts holds the reachable
    shards' items and names the others, with why; without it, the shard's error raises."""
    with Client.connect(shard_map, registry) as client:
        kept = client.start("proposal_review", key_on(shard_map, 0, "proposal_review", "k"))
    refused = ShardMap.from_urls([shard_map.shards[0].url, "postgresql://x@127.0.0.1:1/x"])

    def check(runs: Any, interrupts: Any) -> None:
        assert [run.id for run in runs.items] == [kept.execution_id]
        for page in (runs, interrupts):
            assert page.unavailable_shards == ("shard-1",)
            (cause,) = page.causes
            assert cause.startswith("shard-1 (") and "connection refused" in cause, cause

    with ShardPools(refused, probe=True) as pools:
        client = Client(Store(pools), registry)
        check(client.list_runs(skip_unavailable=True),
              client.pending_interrupts(skip_unavailable=True))
        with pytest.raises(ShardUnavailable, match="shard-1"):
            client.list_runs()

    async def through_async() -> None:
        pools = AsyncShardPools(refused).open()
        try:
            aclient = AsyncClient(AsyncStore(pools), registry)
            check(await aclient.list_runs(skip_unavailable=True),
                  await aclient.pending_interrupts(skip_unavailable=True))
            with pytest.raises(ShardUnavailable, match="shard-1"):
                await aclient.list_runs()
        finally:
            await pools.close()

    asyncio.run(through_async())


# -- cancellation ----------------------------------------------------------------------------


def _waiting_on_a_lock(shard_map: ShardMap) -> list[tuple[Any, ...]]:
    return all_rows(shard_map, "SELECT pid FROM pg_stat_activity WHERE application_name = "
                               "'shardq' AND wait_event_type = 'Lock' "
                               "AND datname = current_database()")


def _busy(shard_map: ShardMap) -> list[tuple[Any, ...]]:
    return all_rows(shard_map, "SELECT pid, state FROM pg_stat_activity WHERE "
                               "application_name = 'shardq' AND state <> 'idle' "
                               "AND datname = current_database() AND pid <> pg_backend_pid()")


Held = Callable[[AsyncClient, uuid.UUID], Coroutine[Any, Any, Any]]
CANCELLED: list[tuple[str, Held, str]] = [
    ("signal", lambda c, run: c.signal(run, "go", {"x": 1}, idempotency_key="once"),
     "SELECT count(*) FROM shardq.signals"),
    ("signal_many", lambda c, run: c.signal_many([SignalRequest(run, "go", i)
                                                  for i in range(50)]),
     "SELECT count(*) FROM shardq.signals"),
    ("cancel", lambda c, run: c.cancel(run, actor="ops"),
     "SELECT count(*) FROM shardq.events WHERE kind = 'run.cancelled'"),
    ("signal_with_start", lambda c, run: c.signal_with_start("park", "held", None, "go", 1),
     "SELECT count(*) FROM shardq.signals"),
]


@pytest.mark.parametrize(("label", "call", "stored"), CANCELLED, ids=[c[0] for c in CANCELLED])
def test_a_cancelled_call_leaves_nothing_half_written_and_no_connection_lent(
    shard_map: ShardMap, label: str, call: Held, stored: str,
) -> None:
    async def run() -> None:
        async with AsyncClient.connect(shard_map, registry) as aclient:
            target = (await aclient.start("park", "held")).execution_id
            shard = aclient.map.for_execution(target)
            before = all_rows(shard_map, stored)
            history = all_rows(shard_map, "SELECT count(*) FROM shardq.events")
            with psycopg.connect(shard.url) as holder:
                # The run's row, locked by another transaction: the call's statement waits.
                holder.execute("SELECT 1 FROM shardq.executions WHERE id = %s FOR UPDATE",
                               (target,))
                task = asyncio.create_task(call(aclient, target))
                deadline = time.monotonic() + 10
                while not _waiting_on_a_lock(shard_map):
                    assert time.monotonic() < deadline, "the call never waited on the lock"
                    assert not task.done(), task
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # The server's statement was cancelled, not left to finish when the lock goes.
                assert _busy(shard_map) == []
                holder.rollback()
            await asyncio.sleep(0.1)
            assert all_rows(shard_map, stored) == before, label
            assert all_rows(shard_map, "SELECT count(*) FROM shardq.events") == history
            pool = aclient.store.pools.pool(shard)
            assert pool is not None
            stats = pool.get_stats()
            assert stats["pool_size"] - stats["pool_available"] == 0, stats
            # The pool serves the next call; the operation, made again, lands whole.
            await call(aclient, target)
            assert all_rows(shard_map, stored) != before, label

    asyncio.run(run())
