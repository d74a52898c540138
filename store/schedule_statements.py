"""The schedule operations the clients call, written once as statement generators
(store/statements.py says why) for the sync and the async store: create, read,
pause, resume, trigger and delete, each on the home shard."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from shardq.core.errors import InvalidArgument
from shardq.core.schedules import Schedule, ScheduleSpec, first_tick
from shardq.store.statements import SQL, Op

ACTIONS = {"pause": SQL["pause_schedule"], "resume": SQL["resume_schedule"],
           "trigger": SQL["trigger_schedule"], "delete": SQL["delete_schedule"]}
"""The statement of each change of a schedule."""


class ScheduleExists(InvalidArgument):
    """A schedule of that name exists already."""


def create_schedule(tenant: str, spec: ScheduleSpec) -> Op[Schedule]:
    """A new schedule, its first tick after the home shard's now; ScheduleExists when
    the name is taken."""
    now = yield from db_now()
    created = yield SQL["create_schedule"], {
        "name": spec.name, "tenant": tenant, "workflow": spec.workflow,
        "input": spec.input_json, "cron": spec.cron, "every_s": spec.every_s,
        "timezone": spec.timezone, "overlap": spec.overlap, "catchup_s": spec.catchup_s,
        "next_at": first_tick(spec.cron, spec.every_s, spec.timezone, now)}
    if not created:
        raise ScheduleExists(f"schedule {spec.name!r} exists already")
    (schedule,) = yield from schedules(tenant=tenant, name=spec.name)
    return schedule


def schedules(*, tenant: str | None, name: str | None = None, after: str = "",
              limit: int = 100) -> Op[list[Schedule]]:
    """Schedules by name (a tenant's, or every tenant's with None), after `after`."""
    rows = yield SQL["schedules"], {"tenant": tenant, "name": name, "after": after,
                                    "limit": limit}
    return [schedule_of(r) for r in rows]


def change_schedule(tenant: str, name: str, action: str) -> Op[Schedule | None]:
    """Pause, resume, trigger or delete; None when the tenant has no such schedule. A
    deleted schedule comes back as it was."""
    if action not in ACTIONS:
        raise InvalidArgument(f"a schedule is paused, resumed, triggered or deleted, "
                              f"not {action!r}")
    found = yield from schedules(tenant=tenant, name=name)
    if not found:
        return None
    params: dict[str, Any] = {"name": name, "tenant": tenant}
    if action == "resume":
        now = yield from db_now()
        params["next_at"] = first_tick(found[0].cron, found[0].every_s, found[0].timezone,
                                       now)
    yield ACTIONS[action], params
    if action == "delete":
        return found[0]
    changed = yield from schedules(tenant=tenant, name=name)
    return changed[0] if changed else None


def db_now() -> Op[datetime]:
    (row,) = yield SQL["db_now"], {}
    now: datetime = row["now"]
    return now


def schedule_of(row: dict[str, Any]) -> Schedule:
    """A schedules row as a Schedule (its input parsed when it came as text)."""
    value = row["input"]
    return Schedule(**{**row, "input": json.loads(value) if isinstance(value, str) else value})
