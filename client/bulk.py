"""Bulk actions by query: cancel or signal every live run a filter matches
(docs/operations.md, "Search attributes"), with a dry run and a bound.

The filter is a listing's (client/reading.py), its runs found page by page over
every shard; runs already ended are passed over. Nothing is done when more live
runs match than the bound (`max_runs`): a filter that says more than meant stops
before its first action, and says so. A dry run finds the same runs
and does nothing. A part of `Client` and `AsyncClient`, both halves here.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shardq.client.requests import DEFAULT_TENANT
from shardq.core.errors import InvalidArgument
from shardq.core.models import Execution, SignalRequest, SignalResult, State
from shardq.core.rules import Limits, check_label, check_signal, check_state
from shardq.shards.errors import ShardqError

DEFAULT_MAX_RUNS = 1000
"""The bound of a bulk action that names none."""
MAX_RUNS = 100_000
"""The largest bound a bulk action may be given."""


class TooManyRuns(InvalidArgument):
    """A bulk action's filter matched more live runs than its bound: nothing was done."""

    def __init__(self, action: str, bound: int) -> None:
        super().__init__(f"more than {bound} live runs match; nothing was {action}: narrow "
                         "the filter, or raise max_runs (--max-runs) to at least their number")
        self.bound = bound


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action did, or would do (`dry_run`): the live runs its filter matched,
    in id order, and of those the ones it acted on; `skipped` says why it did not act on
    the others (a run that ended meanwhile, a refused signal)."""

    action: str
    dry_run: bool
    matched: list[uuid.UUID]
    done: list[uuid.UUID] = field(default_factory=list)
    skipped: dict[uuid.UUID, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "dry_run": self.dry_run,
                "matched": [str(i) for i in self.matched], "done": [str(i) for i in self.done],
                "skipped": {str(i): why for i, why in self.skipped.items()}}


def bulk_filters(filters: dict[str, Any], max_runs: object, actor: str | None = None) -> int:
    """The bound, checked, and the filters checked to say something: a bulk action with
    none would act on every run of the tenant; the actor of a cancel, if any."""
    if actor is not None:
        check_label(actor, "actor")
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or not (
            1 <= max_runs <= MAX_RUNS):
        raise InvalidArgument(f"max_runs must be a whole number within 1..{MAX_RUNS}, got "
                              f"{max_runs!r:.40}")
    unknown = set(filters) - _FILTERS
    if unknown:
        raise InvalidArgument(f"unknown filter {', '.join(sorted(unknown))}")
    state = check_state(filters.get("state"))
    if state is not None and state.terminal:
        raise InvalidArgument("a bulk action acts on live runs: state must be one of "
                              + ", ".join(s.value for s in State if not s.terminal))
    if not any(filters.get(name) not in (None, {}, [], ()) for name in _FILTERS - {"tenant"}):
        raise InvalidArgument("a bulk action needs a filter: a workflow, state, attribute "
                              "(where), priority or creation window")
    return max_runs


_FILTERS = frozenset({"tenant", "state", "workflow", "where", "priority", "created_after",
                      "created_before"})


def live(runs: Iterable[Execution], action: str, bound: int) -> list[Execution]:
    """The live runs among `runs`, at most `bound` of them; TooManyRuns past it."""
    found: list[Execution] = []
    for run in runs:
        _keep(found, run, action, bound)
    return found


async def alive(runs: AsyncIterator[Execution], action: str, bound: int) -> list[Execution]:
    """`live`, of runs read asynchronously."""
    found: list[Execution] = []
    async for run in runs:
        _keep(found, run, action, bound)
    return found


def _keep(found: list[Execution], run: Execution, action: str, bound: int) -> None:
    if not run.state.terminal:
        if len(found) == bound:
            raise TooManyRuns(action, bound)
        found.append(run)


def _signals(runs: list[Execution], name: str, payload: Any,
             key: str | None) -> dict[str, list[SignalRequest]]:
    """One signal a run, grouped by the run's tenant (signal_many's unit)."""
    by_tenant: dict[str, list[SignalRequest]] = {}
    for run in runs:
        by_tenant.setdefault(run.tenant, []).append(SignalRequest(run.id, name, payload, key))
    return by_tenant


def _signalled(result: BulkResult, answers: Iterable[SignalResult]) -> None:
    for answer in answers:
        ident = answer.execution_id
        if answer.error is not None:
            result.skipped[ident] = str(answer.error)
        elif answer.delivered:
            result.done.append(ident)
        else:
            result.skipped[ident] = "already delivered (idempotency key)"


def _cancelled(result: BulkResult, ident: uuid.UUID, state: State | Exception) -> None:
    if isinstance(state, Exception):
        result.skipped[ident] = str(state)
    elif state.terminal and state is not State.CANCELLED:
        result.skipped[ident] = f"already {state.value}"
    else:
        result.done.append(ident)


class BulkCalls:
    """Client's bulk actions; Client provides iter_all, cancel and signal_many."""

    limits: Limits

    def iter_all(self, **filters: Any) -> Iterator[Execution]:
        raise NotImplementedError

    def cancel(self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
               actor: str | None = None) -> State:
        raise NotImplementedError

    def signal_many(self, signals: list[SignalRequest], *,
                    tenant: str = DEFAULT_TENANT) -> list[SignalResult]:
        raise NotImplementedError

    def cancel_matching(self, *, dry_run: bool = False, max_runs: int = DEFAULT_MAX_RUNS,
                        actor: str | None = None, **filters: Any) -> BulkResult:
        """Cancel every live run `filters` (list_runs's: tenant, state, workflow, where,
        priority, created_after, created_before) match, as `cancel` does each; none when
        more than `max_runs` match (TooManyRuns), or when `dry_run`."""
        bound = bulk_filters(filters, max_runs, actor)
        runs = live(self.iter_all(**filters, limit=1000), "cancelled", bound)
        result = BulkResult("cancel", dry_run, [r.id for r in runs])
        if not dry_run:
            for run in runs:
                try:
                    state: State | Exception = self.cancel(run.id, tenant=run.tenant,
                                                           actor=actor)
                except ShardqError as exc:  # gone (purged) or refused since it was listed
                    state = exc
                _cancelled(result, run.id, state)
        return result

    def signal_matching(self, name: str, payload: Any = None, *,
                        idempotency_key: str | None = None, dry_run: bool = False,
                        max_runs: int = DEFAULT_MAX_RUNS, **filters: Any) -> BulkResult:
        """Send signal `name` to every live run `filters` match (as cancel_matching's),
        one commit per shard and tenant; with `idempotency_key`, each run takes it once,
        so a repeated call (after a crash, say) signals no run twice."""
        check_signal(name, payload, idempotency_key, self.limits)
        bound = bulk_filters(filters, max_runs)
        runs = live(self.iter_all(**filters, limit=1000), "signalled", bound)
        result = BulkResult("signal", dry_run, [r.id for r in runs])
        if not dry_run:
            for tenant, signals in _signals(runs, name, payload, idempotency_key).items():
                _signalled(result, self.signal_many(signals, tenant=tenant))
        return result


class AsyncBulkCalls:
    """AsyncClient's bulk actions: BulkCalls', awaited."""

    limits: Limits

    def iter_all(self, **filters: Any) -> AsyncIterator[Execution]:
        raise NotImplementedError

    async def cancel(self, execution_id: str | uuid.UUID, *, tenant: str = DEFAULT_TENANT,
                     actor: str | None = None) -> State:
        raise NotImplementedError

    async def signal_many(self, signals: list[SignalRequest], *,
                          tenant: str = DEFAULT_TENANT) -> list[SignalResult]:
        raise NotImplementedError

    async def cancel_matching(self, *, dry_run: bool = False, max_runs: int = DEFAULT_MAX_RUNS,
                              actor: str | None = None, **filters: Any) -> BulkResult:
        """Client.cancel_matching: cancel every live run `filters` match, within a bound."""
        bound = bulk_filters(filters, max_runs, actor)
        runs = await alive(self.iter_all(**filters, limit=1000), "cancelled", bound)
        result = BulkResult("cancel", dry_run, [r.id for r in runs])
        if not dry_run:
            for run in runs:
                try:
                    state: State | Exception = await self.cancel(run.id, tenant=run.tenant,
                                                                 actor=actor)
                except ShardqError as exc:
                    state = exc
                _cancelled(result, run.id, state)
        return result

    async def signal_matching(self, name: str, payload: Any = None, *,
                              idempotency_key: str | None = None, dry_run: bool = False,
                              max_runs: int = DEFAULT_MAX_RUNS, **filters: Any) -> BulkResult:
        """Client.signal_matching: signal every live run `filters` match, within a bound."""
        check_signal(name, payload, idempotency_key, self.limits)
        bound = bulk_filters(filters, max_runs)
        runs = await alive(self.iter_all(**filters, limit=1000), "signalled", bound)
        result = BulkResult("signal", dry_run, [r.id for r in runs])
        if not dry_run:
            for tenant, signals in _signals(runs, name, payload, idempotency_key).items():
                _signalled(result, await self.signal_many(signals, tenant=tenant))
        return result

