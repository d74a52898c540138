"""A page over many shards from each shard's share of ids, refilled where a share may
hold back an id the page keeps (client/reading.py): whatever the spread of runs over
the shards, the pages are the first `limit` ids after the cursor, in order, and a walk
of them loses and repeats nothing. Each shard here is a sorted list, read as the
listing statement reads it: the ids after a position, up to a limit."""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
import uuid
from typing import Any

import pytest

from shardq.client.reading import merged, refilled, refills, shard_rows
from shardq.store.listing import Cursor, ShardPage


def _read(ids: list[uuid.UUID], after: uuid.UUID | None, limit: int) -> ShardPage:
    start = 0 if after is None else bisect.bisect_right(ids, after)
    found = ids[start:start + limit]
    return ShardPage(found, [], 0)


def _page(shards: list[list[uuid.UUID]], after: uuid.UUID | None,
          limit: int) -> tuple[list[uuid.UUID], str | None, int]:
    """One page as list_runs makes it: its ids, its cursor, how many shards were refilled."""
    share = shard_rows(limit, len(shards))
    # Keyed by index: the functions only need the keys to tell the shards apart.
    pages: dict[Any, ShardPage] = {n: _read(ids, after, share) for n, ids in enumerate(shards)}
    again: dict[Any, uuid.UUID] = refills(pages, share, limit)
    more: dict[Any, ShardPage] = {n: _read(shards[n], last, limit) for n, last in again.items()}
    page = merged(refilled(pages, more), limit)
    kept = sorted(ident for ids in page.unread.values() for ident in ids)
    return kept, page.cursor, len(again)


@pytest.mark.parametrize("spread", ["even", "one shard", "two of five", "skewed", "empty"])
@pytest.mark.parametrize("limit", [1, 7, 100])
def test_every_page_is_the_next_ids_whatever_the_spread(spread: str, limit: int) -> None:
    rng = random.Random(f"{spread}-{limit}")
    count = 5
    weights = {"even": [1] * count, "one shard": [1, 0, 0, 0, 0],
               "two of five": [0, 3, 0, 1, 0], "skewed": [50, 5, 1, 1, 0],
               "empty": [0] * count}[spread]
    every = sorted(uuid.UUID(int=rng.getrandbits(128)) for _ in range(0 if spread == "empty"
                                                                    else 1000))
    shards: list[list[uuid.UUID]] = [[] for _ in range(count)]
    for ident in every:
        if any(weights):
            shards[rng.choices(range(count), weights)[0]].append(ident)
    walked: list[uuid.UUID] = []
    after: uuid.UUID | None = None
    refilled_pages = 0
    while True:
        ids, cursor, again = _page(shards, after, limit)
        assert ids == sorted(itertools.islice(heapq.merge(*shards), len(walked),
                                              len(walked) + limit))
        walked += ids
        refilled_pages += bool(again)
        if cursor is None:
            break
        assert len(ids) == limit
        after = Cursor.decode(cursor).id
    assert walked == sorted(every)
    if spread == "even" and limit == 100:
        assert refilled_pages <= 1  # a share is twice the even one: a refill is rare
