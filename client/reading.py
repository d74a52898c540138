"""The client's reads of many runs (docs/operations.md, "Listing and counting runs"):
pages of runs by filter, every run of a filter, and counts by workflow and state. A
part of `Client` and `AsyncClient`, kept apart so the clients' cores stay readable
modules; both halves are here, over the same sans-I/O parts (client/requests.py,
store/counts.py).

Every call reads every shard, at once: a page costs the slowest shard's share of it
(refilled where the runs are crowded on a few shards), a count its counters and task
rows (store/listing.py, schema/0029)."""

from __future__ import annotations

import heapq
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from shardq.client.requests import DEFAULT_TENANT, check_filters, list_query, unread_of
from shardq.core.attributes import check_filters as check_where
from shardq.core.models import Execution, OutboxEntry, RunOutbox, State
from shardq.shards import async_fanout
from shardq.shards.fanout import Reached, each_shard
from shardq.shards.routing import parse_execution_id
from shardq.store.counts import RunCounts, counted
from shardq.store.listing import DEFAULT_PAGE, Cursor, ListQuery, PartialPage, ShardPage

if TYPE_CHECKING:
    from shardq.shards.config import Shard, ShardMap
    from shardq.store.async_store import AsyncStore
    from shardq.store.store import Store

R = TypeVar("R")


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


def run_outbox(ident: uuid.UUID, reached: Reached[list[OutboxEntry]]) -> RunOutbox:
    """The shards' outbox rows of run `ident`: those it sent and those sent to it."""
    rows = sorted((r for found in reached.answers.values() for r in found),
                  key=lambda r: (r.queued_at, r.id))
    return RunOutbox([r for r in rows if r.source_execution_id == ident],
                     [r for r in rows if r.target_execution_id == ident],
                     tuple(reached.unavailable_names))


def shard_rows(limit: int, shards: int) -> int:
    """How many ids (and their rows) each shard reads for a page over `shards`, at
    first: about twice its even share of the page (ids are spread evenly over the
    shards' buckets), so the ids and rows a page keeps nearly always come in one round
    trip; all of them on one shard."""
    return limit if shards <= 1 else min(limit, 2 * -(-limit // shards) + 1)


def first_round(query: ListQuery, shards: int) -> ListQuery:
    """Each shard's first read of a page over `shards`: its share of the ids."""
    return replace(query, limit=shard_rows(query.limit, shards))


def refills(pages: Mapping[Shard, ShardPage], share: int,
            limit: int) -> dict[Shard, uuid.UUID]:
    """The shards to ask again, each after the last id it gave: those that gave their
    whole share while the page is short, or whose share ends before the page's last
    id (ids of theirs past it could belong in the page). Asked for a whole page more
    after it, a shard can hold back no id the page keeps, so one refill is enough."""
    kept = list(itertools.islice(heapq.merge(*(page.ids for page in pages.values())), limit))
    if not kept:
        return {}
    return {shard: page.ids[-1] for shard, page in pages.items()
            if len(page.ids) == share and (len(kept) < limit or page.ids[-1] < kept[-1])}


def refilled(pages: Mapping[Shard, ShardPage],
             more: Mapping[Shard, ShardPage]) -> dict[Shard, ShardPage]:
    """The shards' pages with the ids their refill read appended (their rows unread)."""
    return {shard: page if shard not in more else ShardPage(
        [*page.ids, *more[shard].ids], page.runs, page.read) for shard, page in pages.items()}


@dataclass(frozen=True)
class MergedPage:
    """The ids a page over many shards keeps, merged from the shards' pages: the rows
    already read for them, the ids whose rows a shard still has to read (`unread`,
    by shard), and the cursor of the page after it."""

    runs: list[Execution]
    unread: dict[Shard, list[uuid.UUID]]
    cursor: str | None


def merged(pages: Mapping[Shard, ShardPage], limit: int) -> MergedPage:
    """The first `limit` of the shards' page ids, with what is read and left to read."""
    shards = list(pages)
    tagged = heapq.merge(*([(ident, n) for ident in page.ids]
                           for n, page in enumerate(pages.values())))
    kept = list(itertools.islice(tagged, limit))
    wanted = {ident for ident, _ in kept}
    runs = [e for page in pages.values() for e in page.runs if e.id in wanted]
    read = [set(page.ids[:page.read]) for page in pages.values()]
    unread: dict[Shard, list[uuid.UUID]] = {}
    for ident, n in kept:
        if ident not in read[n]:
            unread.setdefault(shards[n], []).append(ident)
    return MergedPage(runs, unread, Cursor(kept[-1][0]).encode() if len(kept) == limit else None)


def merged_page(merged_runs: MergedPage, more: Sequence[list[Execution]],
                *reached: Reached[Any]) -> PartialPage:
    """The page: the merged rows and the rows read after (`more`), by id; `reached` (the
    reads by `each_shard` that skipped unavailable shards) names the shards not read."""
    unread = [unread_of(r) for r in reached]  # a shard the ids' read missed has no rows to read
    names = tuple(n for names, _ in unread for n in names)
    causes = tuple(c for _, causes in unread for c in causes)
    runs = sorted([*merged_runs.runs, *(e for rows in more for e in rows)], key=lambda e: e.id)
    return PartialPage(runs, merged_runs.cursor, names, causes)


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
        where: Mapping[str, Any] | Sequence[str] | None = None,
    ) -> PartialPage:
        """One page of runs over every shard, ordered by id (creation millisecond first).

        Pass `next_cursor` back for the following page. The cursor is a position,
        not an offset, so runs started meanwhile never shift or repeat a page.
        `tenant=None` lists every tenant's runs.

        `skip_unavailable`: as `pending_interrupts`'s, a shard that cannot be reached
        is named in the page's `unavailable_shards` instead of failing the page.
        `priority`: only runs of that priority. `created_after`, `created_before`: runs
        created in [after, before), by their id's millisecond (the starting client's
        clock, a little before `created_at`); aware datetimes. `where`: search attributes
        the runs have (ctx.set_attributes), as a mapping of names to values or a list of
        `NAME OP VALUE` filters (`"amount>=100"`; core/attributes.py), all of them met.
        """
        query = list_query(tenant, state, workflow, limit, cursor, priority=priority,
                           created_after=created_after, created_before=created_before,
                           where=where)
        first = first_round(query, len(self.map.shards))
        found = _whole(each_shard(self.map.shards, lambda shard: self.store.list_executions(
            shard, first, rows=first.limit)), skip_unavailable)
        pages, reached = found.answers, [found]
        again = refills(pages, first.limit, limit)
        if again:  # rare: the shards' runs are not spread evenly over this page
            extra = _whole(each_shard(list(again), lambda shard: self.store.list_executions(
                shard, replace(query, after=Cursor(again[shard])), rows=0)), skip_unavailable)
            pages, reached = refilled(pages, extra.answers), [found, extra]
        page = merged(pages, limit)
        if not page.unread:
            return merged_page(page, (), *reached)
        more = _whole(each_shard(list(page.unread), lambda shard: self.store.executions_of(
            shard, page.unread[shard])), skip_unavailable)
        return merged_page(page, list(more.answers.values()), *reached, more)

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
        skip_unavailable: bool = False, where: Mapping[str, Any] | Sequence[str] | None = None,
    ) -> RunCounts:
        """Runs per workflow and state over every shard (of `tenant`, or every tenant's
        with None; of `workflow` or every one), exact in each shard's snapshot. A shard
        reads its counters and its live runs, never its history. `skip_unavailable`:
        a shard that cannot be reached is named in `unavailable_shards` instead.
        `where`: only runs with these search attributes (list_runs'), counted from the
        runs they match: a count that costs its matches, not a few counters."""
        check_filters(tenant, workflow)
        filters = check_where(where)
        return _counts(_whole(each_shard(self.map.shards, lambda shard: self.store.count_runs(
            shard, tenant=tenant, workflow=workflow, where=filters)), skip_unavailable))

    def outbox_of(self, execution_id: str | uuid.UUID, *,
                  tenant: str = DEFAULT_TENANT) -> RunOutbox:
        """A run's signals on their way between shards (docs/signals.md): those it sent,
        read on its shard, and those sent to it, read on every shard; each pending or
        failed for good (delivered ones are gone). A shard that cannot be read is named
        in `unavailable_shards`."""
        ident = parse_execution_id(execution_id)
        check_filters(tenant, None)
        return run_outbox(ident, each_shard(self.map.shards, lambda shard: (
            self.store.outbox_of(shard, ident, tenant))))


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
        where: Mapping[str, Any] | Sequence[str] | None = None,
    ) -> PartialPage:
        """Client.list_runs: one page over every shard (read at once), ordered by id."""
        query = list_query(tenant, state, workflow, limit, cursor, priority=priority,
                           created_after=created_after, created_before=created_before,
                           where=where)
        first = first_round(query, len(self.map.shards))
        found = _whole(await async_fanout.each_shard(self.map.shards, lambda shard: (
            self.store.list_executions(shard, first, rows=first.limit))), skip_unavailable)
        pages, reached = found.answers, [found]
        again = refills(pages, first.limit, limit)
        if again:
            extra = _whole(await async_fanout.each_shard(list(again), lambda shard: (
                self.store.list_executions(shard, replace(query, after=Cursor(again[shard])),
                                           rows=0))), skip_unavailable)
            pages, reached = refilled(pages, extra.answers), [found, extra]
        page = merged(pages, limit)
        if not page.unread:
            return merged_page(page, (), *reached)
        more = _whole(await async_fanout.each_shard(
            list(page.unread), lambda shard: self.store.executions_of(shard, page.unread[shard])),
            skip_unavailable)
        return merged_page(page, list(more.answers.values()), *reached, more)

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
        skip_unavailable: bool = False, where: Mapping[str, Any] | Sequence[str] | None = None,
    ) -> RunCounts:
        """Client.count_runs: runs per workflow and state over every shard."""
        check_filters(tenant, workflow)
        filters = check_where(where)
        return _counts(_whole(await async_fanout.each_shard(self.map.shards, lambda shard: (
            self.store.count_runs(shard, tenant=tenant, workflow=workflow, where=filters))),
            skip_unavailable))

    async def outbox_of(self, execution_id: str | uuid.UUID, *,
                        tenant: str = DEFAULT_TENANT) -> RunOutbox:
        """Client.outbox_of: a run's signals on their way between shards."""
        ident = parse_execution_id(execution_id)
        check_filters(tenant, None)
        return run_outbox(ident, await async_fanout.each_shard(self.map.shards, lambda shard: (
            self.store.outbox_of(shard, ident, tenant))))
