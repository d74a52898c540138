"""The client's schedule calls (docs/schedules.md): a part of `Client`, kept apart so
client.py stays one readable module. Schedules are rows of the home shard; the
workers' tickers start their runs."""

from __future__ import annotations

from typing import Any

from shardq.client.requests import DEFAULT_TENANT
from shardq.core.errors import ScheduleNotFound
from shardq.core.rules import check_name, check_page_size
from shardq.core.schedules import DEFAULT_CATCHUP_S, Schedule, ScheduleSpec, check_schedule
from shardq.store.async_store import AsyncStore
from shardq.store.store import Store
from shardq.workflow.registry import Registry


def schedule_spec(registry: Registry, limits: Any, name: str, workflow: str, value: Any, *,
                  cron: object, every: object, timezone: object, overlap: object,
                  catchup_window: object, tenant: str) -> ScheduleSpec:
    """A schedule to create, every field checked: the workflow must be registered and
    the input match its schema, as a start's."""
    check_name(tenant, "tenant")
    check_name(name, "schedule")
    check_name(workflow, "workflow")
    definition = registry.get(workflow)
    input_json = definition.checked_input(f"schedule {name}", value, limits)
    return check_schedule(name, definition.name, input_json, cron=cron, every=every,
                          timezone=timezone, overlap=overlap, catchup_window=catchup_window)


def _named(name: str, tenant: str) -> None:
    check_name(tenant, "tenant")
    check_name(name, "schedule")


def _found(found: Schedule | None, name: str) -> Schedule:
    if found is None:
        raise ScheduleNotFound(f"schedule {name!r} not found")
    return found


class ScheduleCalls:
    """Client's schedule methods; Client provides `store`, `registry` and `limits`."""

    store: Store
    registry: Registry
    limits: Any

    def create_schedule(
        self, name: str, workflow: str, input: Any = None,  # noqa: A002 - the API name
        *, cron: str | None = None, every: float | None = None, timezone: str = "UTC",
        overlap: str = "skip", catchup_window: float = DEFAULT_CATCHUP_S,
        tenant: str = DEFAULT_TENANT,
    ) -> Schedule:
        """A schedule starting a run of `workflow` with `input` at every tick of `cron`
        (read in `timezone`) or `every` seconds: its first tick comes after now.

        `overlap` says what a tick does while the schedule's last run is still running:
        `skip` it (the default), `buffer_one` (start it when that run ends; one at
        most), or `allow` it. Ticks missed by more than `catchup_window` seconds (every
        worker down) are counted as missed, not run. InvalidArgument for a bad field or
        an input its schema refuses, UnknownWorkflow for a workflow not registered,
        ScheduleExists for a name already taken."""
        return self.store.create_schedule(tenant, schedule_spec(
            self.registry, self.limits, name, workflow, input, cron=cron, every=every,
            timezone=timezone, overlap=overlap, catchup_window=catchup_window,
            tenant=tenant))

    def schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """One schedule; ScheduleNotFound when the tenant has none of that name."""
        _named(name, tenant)
        found = self.store.schedules(tenant=tenant, name=name)
        return _found(found[0] if found else None, name)

    def schedules(self, *, tenant: str | None = DEFAULT_TENANT, after: str = "",
                  limit: int = 100) -> list[Schedule]:
        """A page of schedules by name, after `after` (every tenant's with None)."""
        if tenant is not None:
            check_name(tenant, "tenant")
        return self.store.schedules(tenant=tenant, after=after,
                                    limit=check_page_size(limit, 1000))

    def pause_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """No tick starts a run until resumed (a trigger still does)."""
        return self._change(name, "pause", tenant)

    def resume_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Ticks start runs again, from the first tick after now: those that passed while
        paused are not run."""
        return self._change(name, "resume", tenant)

    def trigger_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Start a run now, whatever the overlap policy: the next ticker round does, with
        a workflow id `<name>@manual-<time>`."""
        return self._change(name, "trigger", tenant)

    def delete_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """No tick starts another run; the runs it started go on. Returns it as it was."""
        return self._change(name, "delete", tenant)

    def _change(self, name: str, action: str, tenant: str) -> Schedule:
        _named(name, tenant)
        return _found(self.store.change_schedule(tenant, name, action), name)


class AsyncScheduleCalls:
    """AsyncClient's schedule methods: ScheduleCalls', awaited."""

    store: AsyncStore
    registry: Registry
    limits: Any

    async def create_schedule(
        self, name: str, workflow: str, input: Any = None,  # noqa: A002 - the API name
        *, cron: str | None = None, every: float | None = None, timezone: str = "UTC",
        overlap: str = "skip", catchup_window: float = DEFAULT_CATCHUP_S,
        tenant: str = DEFAULT_TENANT,
    ) -> Schedule:
        """Client.create_schedule."""
        return await self.store.create_schedule(tenant, schedule_spec(
            self.registry, self.limits, name, workflow, input, cron=cron, every=every,
            timezone=timezone, overlap=overlap, catchup_window=catchup_window,
            tenant=tenant))

    async def schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Client.schedule."""
        _named(name, tenant)
        found = await self.store.schedules(tenant=tenant, name=name)
        return _found(found[0] if found else None, name)

    async def schedules(self, *, tenant: str | None = DEFAULT_TENANT, after: str = "",
                        limit: int = 100) -> list[Schedule]:
        """Client.schedules."""
        if tenant is not None:
            check_name(tenant, "tenant")
        return await self.store.schedules(tenant=tenant, after=after,
                                          limit=check_page_size(limit, 1000))

    async def pause_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Client.pause_schedule."""
        return await self._change(name, "pause", tenant)

    async def resume_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Client.resume_schedule."""
        return await self._change(name, "resume", tenant)

    async def trigger_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Client.trigger_schedule."""
        return await self._change(name, "trigger", tenant)

    async def delete_schedule(self, name: str, *, tenant: str = DEFAULT_TENANT) -> Schedule:
        """Client.delete_schedule."""
        return await self._change(name, "delete", tenant)

    async def _change(self, name: str, action: str, tenant: str) -> Schedule:
        _named(name, tenant)
        return _found(await self.store.change_schedule(tenant, name, action), name)
