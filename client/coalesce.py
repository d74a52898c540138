"""Single signals from concurrent callers, sent together: a group commit for an ingress.

An HTTP server receiving webhooks gets one signal per request, each of which,
sent alone, costs a statement, a commit and a round trip. `SignalCoalescer`
sends the signals that arrive while a shard's statement is in flight as one
`signal_many` batch to that shard: one statement, one commit (one WAL flush)
for all of them. A caller alone waits for nothing: with nothing in flight its
signal goes at once; only under load do requests share a commit, and then each
waits at most for the statement ahead of it, as in PostgreSQL's own group
commit.

What each caller gets is exactly what `AsyncClient.signal_many([its signal])`
would answer: the batch statement (shardq.deliver_signals) judges every signal
on its own (refusals, idempotency keys, several signals to one run in arrival
order) and locks its runs in the order every sender does. A failure of the
whole statement that is not the shard's (a value the database refused, a lost
deadlock) sends the batch again one signal at a time, so one caller's bad
input never fails another's request. A caller cancelled before its batch left
is dropped from it (nothing stored); one cancelled after may still be stored,
as with any request cut off mid-commit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardq.client.async_client import AsyncClient
from shardq.client.requests import DEFAULT_TENANT
from shardq.core import tracing
from shardq.core.models import SignalRequest, SignalResult
from shardq.shards.errors import ShardUnavailable
from shardq.shards.routing import InvalidExecutionId, parse_execution_id

IN_FLIGHT = 2
"""Statements one lane (tenant and shard) keeps in flight: the second overlaps the first's
commit flush, and more would only queue on the shard's row locks and WAL."""
MAX_BATCH = 100
"""Signals one statement carries at most: deliver_signals' cost grows with the batch, and a
bound keeps one statement's time (and its callers' wait) short."""

Waiter = tuple[SignalRequest, "asyncio.Future[SignalResult]", str | None]
"""A caller's signal, its answer, and its trace (core/tracing.py), which its signal keeps
whatever batch it shares."""


@dataclass
class _Lane:
    """The signals waiting for one tenant's shard, and the statements in flight to it."""

    waiting: deque[Waiter] = field(default_factory=deque)
    running: int = 0


class SignalCoalescer:
    """`signal` sends one signal as `client.signal_many` would, sharing the statement with
    whatever other signals to the same shard are waiting. Share one per event loop;
    `await close()` before the client's pools close."""

    def __init__(self, client: AsyncClient, *, in_flight: int = IN_FLIGHT,
                 max_batch: int = MAX_BATCH) -> None:
        self._client = client
        self._in_flight = in_flight
        self._max_batch = max_batch
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._draining: set[asyncio.Task[None]] = set()
        self.statements = 0
        """Batches sent so far (signals / statements is the sharing achieved)."""

    async def signal(
        self, request: SignalRequest, *, tenant: str = DEFAULT_TENANT
    ) -> SignalResult:
        """`(await client.signal_many([request], tenant=tenant))[0]`: a refusal is carried
        in the result's `error`; a shard that cannot be reached raises."""
        try:
            ident = parse_execution_id(request.execution_id)
        except InvalidExecutionId:  # refused by the client in its own words
            (result,) = await self._client.signal_many([request], tenant=tenant)
            return result
        key = (tenant, self._client.map.for_execution(ident).name)
        lane = self._lanes.setdefault(key, _Lane())
        answer: asyncio.Future[SignalResult] = asyncio.get_running_loop().create_future()
        lane.waiting.append((request, answer, tracing.current_traceparent()))
        if lane.running < self._in_flight:
            lane.running += 1
            task = asyncio.create_task(self._drain(tenant, lane))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
        return await answer

    async def close(self) -> None:
        """Wait for the statements in flight, so their callers get their answers."""
        while self._draining:
            await asyncio.gather(*self._draining, return_exceptions=True)

    async def _drain(self, tenant: str, lane: _Lane) -> None:
        try:
            while lane.waiting:
                batch: list[Waiter] = []
                while lane.waiting and len(batch) < self._max_batch:
                    waiter = lane.waiting.popleft()
                    if not waiter[1].done():  # its caller gave up: not sent
                        batch.append(waiter)
                if batch:
                    self.statements += 1
                    answers = await self._send(tenant, [w[0] for w in batch],
                                               [w[2] for w in batch])
                    for (_, future, _), answer in zip(batch, answers, strict=True):
                        if future.done():
                            continue
                        if isinstance(answer, BaseException):
                            future.set_exception(answer)
                        else:
                            future.set_result(answer)
        finally:
            lane.running -= 1

    async def _send(
        self, tenant: str, requests: Sequence[SignalRequest], traces: Sequence[str | None],
    ) -> list[SignalResult | BaseException]:
        try:
            return list(await self._client._signal_many(
                requests, tenant, traces if any(traces) else None))
        except ShardUnavailable as exc:  # the shard's, so every signal's
            return [exc] * len(requests)
        except Exception as exc:
            if len(requests) == 1:
                return [exc]
        # One signal's fault must not become its neighbours': each alone.
        return [answer for request, trace in zip(requests, traces, strict=True)
                for answer in await self._send(tenant, [request], [trace])]
