"""Recorded runs read from the shards for `shardq replay`: a listing page at a time,
each page's histories in one more statement.

Shard by shard, in id order (creation order), by the listing's own keyset pages
(store/listing.py): a run being moved is read once, from the shard the map gives
its bucket, and no statement holds a snapshot longer than a page, so a check of
every run a fleet holds never keeps vacuum from the tables the workers write.
A time window starts the walk at the first id of its start (ids lead with their
creation millisecond) and stops it at the first id past its end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from shardq.client.client import Client
from shardq.core.builds import check_build_id
from shardq.core.models import State
from shardq.core.rules import check_name
from shardq.shards.config import Shard
from shardq.store.listing import Cursor, ListQuery
from shardq.workflow.exported import RecordedRun

PAGE = 500
"""Runs a listing page reads; their histories come in one statement after it."""


def recorded_runs(
    client: Client, *, workflows: Sequence[str] = (), states: Sequence[State] = (),
    since: datetime | None = None, until: datetime | None = None,
    tenant: str | None = None, builds: Sequence[str] = (), limit: int | None = None,
) -> Iterator[RecordedRun]:
    """The runs matching every filter given (any of `workflows`, any of `states`, created
    in [`since`, `until`), of `tenant` or every tenant, started on any of `builds`), with
    their histories; at most `limit` of them. A build filter reads the pages the others
    select and keeps the runs of those builds."""
    for name in workflows:
        check_name(name, "workflow")
    for build in builds:
        check_build_id(build)
    if tenant is not None:
        check_name(tenant, "tenant")
    left = limit
    names: Sequence[str | None] = list(workflows) or [None]
    wanted: Sequence[State | None] = list(states) or [None]
    for shard in client.map.shards:
        for workflow in names:
            for state in wanted:
                window = _Window(workflow, state, since, until, tenant, frozenset(builds))
                for run in _shard_runs(client, shard, window):
                    if left is not None:
                        if left <= 0:
                            return
                        left -= 1
                    yield run


@dataclass(frozen=True)
class _Window:
    workflow: str | None
    state: State | None
    since: datetime | None
    until: datetime | None
    tenant: str | None
    builds: frozenset[str]


def _shard_runs(client: Client, shard: Shard, window: _Window) -> Iterator[RecordedRun]:
    store = client.store
    after: Cursor | None = None
    while True:
        page = store.list_executions(shard, ListQuery(
            tenant=window.tenant, state=window.state, workflow=window.workflow, limit=PAGE,
            after=after, created_after=window.since, created_before=window.until))
        chosen = [e for e in page.runs if not window.builds or e.build_id in window.builds]
        if chosen:
            histories = store.read_histories(shard, [e.id for e in chosen])
            for execution in chosen:
                yield RecordedRun.of(execution, tuple(histories.get(execution.id, ())))
        if len(page.ids) < PAGE:
            return
        after = Cursor(page.ids[-1])
