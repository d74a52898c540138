"""The client's reads of many runs (docs/operations.md, "Listing and counting runs"):
pages of runs by filter, every run of a filter, and counts by workflow and state. A
part of `Client` and `AsyncClient`, kept apart so the clients' cores stay readable
modules; both halves are here, over the same sans-I/O parts (client/requests.py,
store/counts.py).

Every call reads every shard, at once: a page costs the slowest shard's page, a count
its counters and task rows (store/listing.py, schema/0029)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from shardq.client.requests import DEFAULT_TENANT, kept_ids, list_query, merged_page
from shardq.core.models import Execution, State
from shardq.core.rules import check_name
from shardq.shards import async_fanout
from shardq.shards.fanout import Reached, each_shard
from shardq.store.counts import RunCounts, counted
from shardq.store.listing import DEFAULT_PAGE, PartialPage

if TYPE_CHECKING:
    from shardq.shards.config import ShardMap
    from shardq.store.async_store import AsyncStore
    from shardq.store.store import Store

R = TypeVar("R")


def _count_filters(tenant: str | None, workflow: str | None) -> None:
    if tenant is not None:
        check_name(tenant, "tenant")
    if workflow is not None:
        check_name(workflow, "workflow")


def _whole(reached: Reached[R], skip_unavailable: bool) -> Reached[R]:
    """`reached`, when every shard answered or the caller skips those that did not;
    else the first one's error."""
    if not skip_unavailable:
        for exc in reached.unavailable.values():
            raise exc
    return reached


def _counts(reached: Reached[list[tuple[str, str, int]]]) -> RunCounts:
    return counted((row for rows in reached.answers.values() for row in rows),
                   tuple(reached.unavailable_names), tuple(reached.causes))


class ReadingCalls:
    """Client's reads of many runs; Client provides `store` and `map`."""

    store: Store

    @property
    def map(self) -> ShardMap:
        raise NotImplementedError

    def list_runs(
        self, *, tenant: str | None = DEFAULT_TENANT, state: State | str | None = None,
        workflow: str | None = None, limit: int = DEFAULT_PAGE, cursor: str | None = None,
        skip_unavailable: bool = False, priority: int | None = None,
        created_after: datetime | None = None, created_before: datetime | None = None,
    ) -> PartialPage:
        """One page of runs over every shard, ordered by id (creation millisecond first).

        Pass `next_cursor` back for the following page. The cursor is a position,
        not an offset, so runs started meanwhile never shift or repeat a page.
        `tenant=None` lists every tenant's runs.

        `skip_unavailable`: as `pending_interrupts`'s, a shard that cannot be reached
        is named in the page's `unavailable_shards` instead of failing the page.
        `priority`: only runs of that priority. `created_after`, `created_before`: runs
        created in [after, before), by their id's millisecond (the starting client's
        clock, a little before `created_at`); aware datetimes.
        """
        query = list_query(tenant, state, workflow, limit, cursor, priority=priority,
                           created_after=created_after, created_before=created_before)
        found = _whole(each_shard(self.map.shards, lambda shard: self.store.listed_ids(
            shard, query)), skip_unavailable)
        chosen, after = kept_ids(found.answers, limit)
        rows = _whole(each_shard(list(chosen), lambda shard: self.store.executions_of(
            shard, chosen[shard])), skip_unavailable)
        return merged_page(list(rows.answers.values()), after, found, rows)

    def iter_all(self, **filters: Any) -> Iterator[Execution]:
        """Every run matching `filters` (list_runs's), page by page."""
        cursor: str | None = None
        while True:
            page = self.list_runs(cursor=cursor, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def count_runs(
        self, *, tenant: str | None = DEFAULT_TENANT, workflow: str | None = None,
        skip_unavailable: bool = False,
    ) -> RunCounts:
        """Runs per workflow and state over every shard (of `tenant`, or every tenant's
        with None; of `workflow` or every one), exact in each shard's snapshot. A shard
        reads its counters and its live runs, never its history. `skip_unavailable`:
        a shard that cannot be reached is named in `unavailable_shards` instead."""
        _count_filters(tenant, workflow)
        return _counts(_whole(each_shard(self.map.shards, lambda shard: self.store.count_runs(
            shard, tenant=tenant, workflow=workflow)), skip_unavailable))


class AsyncReadingCalls:
    """AsyncClient's reads of many runs: ReadingCalls', awaited."""

    store: AsyncStore

    @property
    def map(self) -> ShardMap:
        raise NotImplementedError

    async def list_runs(
        self, *, tenant: str | None = DEFAULT_TENANT, state: State | str | None = None,
        workflow: str | None = None, limit: int = DEFAULT_PAGE, cursor: str | None = None,
        skip_unavailable: bool = False, priority: int | None = None,
        created_after: datetime | None = None, created_before: datetime | None = None,
    ) -> PartialPage:
        """Client.list_runs: one page over every shard (read at once), ordered by id."""
        query = list_query(tenant, state, workflow, limit, cursor, priority=priority,
                           created_after=created_after, created_before=created_before)
        found = _whole(await async_fanout.each_shard(
            self.map.shards, lambda shard: self.store.listed_ids(shard, query)),
            skip_unavailable)
        chosen, after = kept_ids(found.answers, limit)
        rows = _whole(await async_fanout.each_shard(
            list(chosen), lambda shard: self.store.executions_of(shard, chosen[shard])),
            skip_unavailable)
        return merged_page(list(rows.answers.values()), after, found, rows)

    async def iter_all(self, **filters: Any) -> AsyncIterator[Execution]:
        """Client.iter_all: every run matching `filters`, page by page."""
        cursor: str | None = None
        while True:
            page = await self.list_runs(cursor=cursor, **filters)
            for execution in page.items:
                yield execution
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def count_runs(
        self, *, tenant: str | None = DEFAULT_TENANT, workflow: str | None = None,
        skip_unavailable: bool = False,
    ) -> RunCounts:
        """Client.count_runs: runs per workflow and state over every shard."""
        _count_filters(tenant, workflow)
        return _counts(_whole(await async_fanout.each_shard(self.map.shards, lambda shard: (
            self.store.count_runs(shard, tenant=tenant, workflow=workflow))), skip_unavailable))
