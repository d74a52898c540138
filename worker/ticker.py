"""The ticker: threads of every worker that start the runs of due schedule ticks.

There is no scheduler process. Each round claims up to `batch` due schedules on
the home shard (SKIP LOCKED: the rounds of a worker's threads and of other
workers share the work), asks core/schedules.py's `plan` what each must start,
starts those runs on their own shards (grouped into one start per workflow and
shard), and moves the rows on, all before the round's home-shard transaction
commits. A tick's run is named by the schedule and the tick's time, so a ticker
killed between the starts and its commit leaves rows that the next round claims
again, and whose runs it finds already there: one run per tick, whatever
crashes (docs/schedules.md).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from shardq.core.errors import UnknownWorkflow
from shardq.core.models import StartResult
from shardq.core.schedules import DueSchedule, Plan, plan, tick_workflow_id
from shardq.shards.config import Shard
from shardq.shards.errors import ShardqError
from shardq.shards.routing import bucket_of
from shardq.store.params import NewRun, StartBatch, placed_run
from shardq.store.protocol import TickerStore
from shardq.workflow.registry import Registry, WorkflowDef

log = logging.getLogger(__name__)

TICK_BATCH = 2_000
"""Schedules one round claims."""
ROUNDS_IN_FLIGHT = 2
"""Ticker threads a worker runs. A round mostly waits on its statements (the claim,
a start per shard, the advance and commit); a second round's Python runs
meanwhile, SKIP LOCKED keeping their schedules apart: 60,000 schedules due at one
second with one worker left, p99 lag 4.8-5.2 s with one thread, 3.0-3.4 s with
two. Three were worse (8.6-9.2 s): rounds holding more of the pool's connections
than the claim loops and completers could spare."""
HELD_PAUSE_S = 0.05
"""A round that found due schedules all held by other rounds waits this long."""
MAX_SLEEP_S = 1.0
"""The longest a ticker sleeps between rounds: a schedule created or triggered
meanwhile is seen within it."""


class Ticker:
    """Runs rounds until `stopping` is set."""

    def __init__(self, store: TickerStore, registry: Registry, stopping: threading.Event,
                 *, batch: int = TICK_BATCH) -> None:
        self.store = store
        self.registry = registry
        self.stopping = stopping
        self.batch = batch
        self._unknown: set[str] = set()  # workflows already logged as not registered

    def loop(self) -> None:
        """One thread's rounds; a worker runs ROUNDS_IN_FLIGHT of them."""
        while not self.stopping.is_set():
            try:
                claimed = self.round()
                full = claimed >= self.batch
                due_in = None if full else self.store.next_schedule_in()
            except ShardqError as exc:  # the home shard away: the next round asks again
                log.warning("schedule round failed", extra={"error": str(exc)})
                claimed, full, due_in = 0, False, None
            if not full:
                if claimed == 0 and due_in is not None and due_in <= 0:
                    due_in = HELD_PAUSE_S  # what is due, another round holds: not a spin
                pause = MAX_SLEEP_S if due_in is None else min(MAX_SLEEP_S, max(0.0, due_in))
                self.stopping.wait(pause)

    def round(self) -> int:
        """One claim of due schedules, their runs started and their rows moved on;
        how many schedules it claimed."""
        with self.store.claim_schedules(self.batch) as (schedules, advance):
            if not schedules:
                return 0
            # Whether the last run still runs matters to skip and buffer_one only.
            live = self._live([s.last_run for s in schedules if s.last_run is not None
                               and (s.overlap != "allow" or s.buffered_at is not None)])
            # A schedule of a workflow this worker lacks is left due: a worker that
            # has it starts its ticks. Asked once a workflow, not once a schedule.
            first = {s.workflow: s for s in reversed(schedules)}
            known = {w for w, s in first.items() if self._knows(s)}
            plans = [(s, plan(s, s.claimed_at, s.last_run in live)) for s in schedules
                     if s.workflow in known]
            started = self._start(plans)
            for schedule, chosen in plans:
                advance(schedule.name, chosen, started.get(schedule.name))
            return len(schedules)

    def _knows(self, schedule: DueSchedule) -> bool:
        try:
            self.registry.get(schedule.workflow)
        except UnknownWorkflow:
            if schedule.workflow not in self._unknown:
                log.error("a schedule's workflow is not registered in this worker",
                          extra={"schedule": schedule.name, "workflow": schedule.workflow})
            self._unknown.add(schedule.workflow)
            return False
        return True

    def _live(self, runs: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Of these runs, those still running (a run not found counts as ended)."""
        by_shard: dict[str, list[uuid.UUID]] = defaultdict(list)
        shards = {}
        for run in runs:
            shard = self.store.map.for_bucket(bucket_of(run))
            shards[shard.name] = shard
            by_shard[shard.name].append(run)
        live: set[uuid.UUID] = set()
        for name, ids in by_shard.items():
            states = self.store.run_states(shards[name], ids)
            live.update(i for i, state in states.items() if not state.terminal)
        return live

    def _start(self, plans: list[tuple[DueSchedule, Plan]]) -> dict[str, uuid.UUID]:
        """Start every planned tick's run: one start per workflow, tenant and shard. The
        run of each schedule's latest tick started, by schedule name."""
        groups: dict[tuple[str, str, str], list[tuple[str, datetime, NewRun]]] = defaultdict(
            list)
        definitions: dict[str, WorkflowDef] = {}
        shard_map = self.store.map  # one map for the round, read once
        shards: dict[str, Shard] = {}
        for schedule, chosen in plans:
            definition = definitions.get(schedule.workflow)
            if definition is None:  # once a workflow per round, not once a schedule
                definition = definitions[schedule.workflow] = self.registry.get(
                    schedule.workflow)
            ticks = [(t, False) for t in chosen.starts]
            if chosen.manual is not None:
                ticks.append((chosen.manual, True))
            # The input is parsed only for a workflow whose concurrency key reads it.
            concurrency = definition.concurrency_of(
                json.loads(schedule.input_json) if callable(definition.concurrency) else None)
            for tick, manual in ticks:
                run = placed_run(schedule.tenant, definition.name,
                                 tick_workflow_id(schedule.name, tick, manual=manual),
                                 schedule.input_json, concurrency)
                shard = shard_map.for_bucket(run.bucket)
                shards[shard.name] = shard
                groups[(schedule.tenant, definition.name, shard.name)].append(
                    (schedule.name, tick, run))
        last: dict[str, tuple[datetime, uuid.UUID]] = {}
        for (tenant, workflow, shard_name), members in groups.items():
            definition = definitions[workflow]
            results: list[StartResult] = self.store.start_executions(shards[shard_name], StartBatch(
                tenant, definition.name, definition.version, [r for _, _, r in members],
                definition.gates, definition.priority))
            for (name, tick, _), result in zip(members, results, strict=True):
                if name not in last or tick >= last[name][0]:
                    last[name] = (tick, result.execution_id)
        return {name: run for name, (_, run) in last.items()}
