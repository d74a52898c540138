"""OpenTelemetry: one trace from a webhook's signal into a run on one shard, through its
cross-shard signal and the outbox relay (restarted in between), into the woken run on
the other shard; logs carry the trace's ids (core/tracing.py, schema/0025).

Spans go to the SDK's in-memory exporter through a tracer provider of the test's own
(tracing.use_provider): the global one can be set once per process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shardq.bin.web.app import create_app
from shardq.bin.web.tokens import hash_token, new_token
from shardq.client.async_client import AsyncClient
from shardq.client.client import Client
from shardq.core import tracing
from shardq.core.models import State
from shardq.shards.async_pools import AsyncShardPools
from shardq.shards.config import ShardMap
from shardq.store.async_store import AsyncStore
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.registry import Registry

from ..support import key_on, rows, wait_until

registry = Registry()
StartWorker = Callable[..., Worker]
log = logging.getLogger("shardq.tests.tracing")


@registry.workflow("forwarder")
def forwarder(ctx: WorkflowContext) -> Any:
    """Waits for a webhook's `hook`, then signals the run it names (on another shard)."""
    hook = ctx.wait_for_signal("hook")
    ctx.signal_external(hook["target"], "go", {"from": ctx.workflow_id})
    return "forwarded"


@registry.workflow("receiver")
def receiver(ctx: WorkflowContext) -> Any:
    got = ctx.wait_for_signal("go")
    return ctx.step("handle", _handle, got)


@registry.workflow("fanout")
def fanout(ctx: WorkflowContext) -> Any:
    """Starts a `leaf` child on each shard (ids from its input) and waits for both."""
    ended = ctx.wait_children([ctx.start_child("leaf", key) for key in ctx.input["keys"]])
    return [o.result() for o in ended if o is not None]


@registry.workflow("leaf")
def leaf(ctx: WorkflowContext) -> Any:
    return ctx.step("work", lambda: "done")


@registry.workflow("failing")
def failing(ctx: WorkflowContext) -> Any:
    """One step that raises, not retried: the run fails."""
    return ctx.step("explode", _explode, retry=1)


def _explode() -> None:
    raise ValueError("no such order")


def _handle(got: Any) -> Any:
    log.warning("handling the forwarded signal")
    return got


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def _parked(client: Client, run: Any) -> None:
    wait_until(lambda: client.get(run).state is State.WAITING, timeout=30, what="parked")


def _one(found: list[ReadableSpan], name: str, **attributes: Any) -> ReadableSpan:
    matching = [s for s in found if s.name == name and all(
        (s.attributes or {}).get(k) == v for k, v in attributes.items())]
    assert len(matching) == 1, (name, attributes, [(s.name, s.attributes) for s in found])
    return matching[0]


def _committed(spans: InMemorySpanExporter, run: Any) -> list[ReadableSpan] | None:
    """The finished spans once a commit span links to `run`'s second turn, else None."""
    found = list(spans.get_finished_spans())
    turns = {s.context.span_id for s in found if s.name == "shardq.turn"
             and (s.attributes or {}).get("shardq.execution_id") == str(run)
             and (s.attributes or {}).get("shardq.claims") == 2}
    linked = any(link.context.span_id in turns for s in found if s.name == "shardq.commit"
                 for link in s.links)
    return found if linked else None


def _parent(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None, child.name
    assert child.parent.span_id == parent.context.span_id, (child.name, parent.name)
    assert child.context.trace_id == parent.context.trace_id


def test_one_trace_follows_a_signal_across_shards_and_a_relay_restart(
    client: Client, start_worker: StartWorker, relay: Callable[..., Any],
    shard_map: ShardMap, spans: InMemorySpanExporter,
) -> None:
    captured = Captured()
    captured.addFilter(tracing.TraceIds())
    log.addHandler(captured)
    try:
        start_worker(registry, poll_interval_s=0.2)
        first_relay = relay()
        target = client.start("receiver", key_on(shard_map, 1, "receiver", "r")).execution_id
        source = client.start("forwarder", key_on(shard_map, 0, "forwarder", "f")).execution_id
        for run in (source, target):
            _parked(client, run)
        first_relay.stop()  # the cross-shard signal waits in the outbox meanwhile
        tracer = trace.get_tracer("webhook", tracer_provider=tracing._provider)
        with tracer.start_as_current_span("webhook") as webhook:
            client.signal(source, "hook", {"target": str(target)})
        assert client.wait(source, timeout=30).state is State.COMPLETED
        outbox = rows(shard_map.shards[0].url, "SELECT trace FROM shardq.outbox")
        assert len(outbox) == 1 and outbox[0][0] is not None, outbox
        relay()  # a new relay process, as after a restart: the row's trace goes on
        assert client.wait(target, timeout=30).state is State.COMPLETED
    finally:
        log.removeHandler(captured)

    # A batch commit links to the turns it wrote. Its span ends just after the commit,
    # which the client may see first: waited for, not read at once.
    found = wait_until(lambda: _committed(spans, target), timeout=10,
                       what="the span of the commit that ended the target")
    sent = _one(found, "shardq.signal", **{"shardq.signal": "hook"})
    _parent(sent, webhook)  # type: ignore[arg-type]
    woken = _one(found, "shardq.turn", **{"shardq.execution_id": str(source),
                                          "shardq.claims": 2})
    _parent(woken, sent)
    delivered = _one(found, "shardq.outbox.deliver", **{"shardq.signal": "go"})
    _parent(delivered, woken)
    resumed = _one(found, "shardq.turn", **{"shardq.execution_id": str(target),
                                            "shardq.claims": 2})
    _parent(resumed, delivered)
    step = _one(found, "shardq.step", **{"shardq.step": "handle"})
    _parent(step, resumed)
    # The receiver's first turn continued its start's trace.
    started = [s for s in found if s.name == "shardq.start"]
    first = _one(found, "shardq.turn", **{"shardq.execution_id": str(target),
                                          "shardq.claims": 1})
    assert first.parent is not None and first.parent.span_id in {
        s.context.span_id for s in started}
    (record,) = [r for r in captured.records if r.getMessage().startswith("handling")]
    assert record.trace_id == format(step.context.trace_id, "032x")  # type: ignore[attr-defined]
    assert record.span_id == format(step.context.span_id, "016x")  # type: ignore[attr-defined]


def test_a_fan_out_s_children_continue_the_starting_turn_s_trace(
    client: Client, start_worker: StartWorker, relay: Callable[..., Any],
    shard_map: ShardMap, spans: InMemorySpanExporter,
) -> None:
    """A child on the parent's shard (started in the parent's commit) and one on the
    other shard (through the outbox and the relay): each child's first turn is a child
    span of the parent's turn that started it."""
    start_worker(registry, poll_interval_s=0.2)
    relay()
    keys = [key_on(shard_map, i, "leaf", f"leaf{i}") for i in (0, 1)]
    parent = client.start("fanout", key_on(shard_map, 0, "fanout", "p"),
                          {"keys": keys}).execution_id
    assert client.wait(parent, timeout=30).state is State.COMPLETED
    found = list(spans.get_finished_spans())
    starting = _one(found, "shardq.turn", **{"shardq.execution_id": str(parent),
                                             "shardq.claims": 1})
    children = [s for s in found if s.name == "shardq.turn"
                and (s.attributes or {}).get("shardq.workflow") == "leaf"]
    assert len(children) == 2, [(s.name, s.attributes) for s in found]
    for child in children:  # the one on shard 1 through the outbox row's trace
        _parent(child, starting)


def test_a_failing_step_s_span_records_the_error_and_ends(
    client: Client, start_worker: StartWorker, spans: InMemorySpanExporter,
) -> None:
    """The step's span is ended whatever the step did, and carries what the step raised
    to the workflow (StepFailed, naming the step's own error) and an error status; the
    turn's span ends without one: the run's failure is its outcome, not the turn's."""
    start_worker(registry, poll_interval_s=0.2)
    run = client.start("failing", "f-1").execution_id
    assert client.wait(run, timeout=30).state is State.FAILED
    found = list(spans.get_finished_spans())
    step = _one(found, "shardq.step", **{"shardq.step": "explode"})
    turn = _one(found, "shardq.turn", **{"shardq.execution_id": str(run)})
    _parent(step, turn)
    assert step.status.status_code is trace.StatusCode.ERROR
    assert step.status.description == (
        "StepFailed: step 'explode' failed after 1 attempt(s): ValueError: no such order")
    (event,) = [e for e in step.events if e.name == "exception"]
    assert (event.attributes or {}).get("exception.type") == "shardq.core.errors.StepFailed"
    assert turn.status.status_code is not trace.StatusCode.ERROR
    times = (turn.start_time, step.start_time, step.end_time, turn.end_time)
    assert None not in times and sorted(times) == list(times), times  # type: ignore[type-var]


def test_a_webhook_request_continues_its_callers_trace(
    shard_map: ShardMap, client: Client, spans: InMemorySpanExporter,
) -> None:
    """`shardq serve` reads a request's traceparent: the signal it stores carries a span of
    the caller's trace (its signal may share a statement with other requests')."""
    run = client.start("receiver", "r-http").execution_id
    token = new_token()
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def call() -> httpx.Response:
        pools = AsyncShardPools(shard_map).open()
        try:
            app = create_app(AsyncClient(AsyncStore(pools), registry),
                             [("default", hash_token(token))])
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://shardq") as http:
                return await http.post(
                    f"/api/shardq/workflows/{run}/signal/go", content=b"1",
                    headers={"Authorization": f"Bearer {token}", "traceparent": caller})
        finally:
            await pools.close()

    answer = asyncio.run(call())
    assert answer.status_code == 202, answer.text
    (stored,) = rows(shard_map.for_execution(run).url,
                     "SELECT trace FROM shardq.signals WHERE execution_id = %s", run)
    assert stored[0] is not None and stored[0].split("-")[1] == caller.split("-")[1]
    request = _one(list(spans.get_finished_spans()), "HTTP POST")
    assert format(request.context.trace_id, "032x") == caller.split("-")[1]


def test_with_the_api_and_no_sdk_nothing_is_traced_or_stored(
    client: Client, shard_map: ShardMap,
) -> None:
    """The API installed, no provider set (the default): no span is made, no trace
    context written."""
    assert tracing.ENABLED and not tracing.active()
    run = client.start("receiver", "r-untraced").execution_id
    client.signal(run, "go", 1)
    url = shard_map.for_execution(run).url
    assert rows(url, "SELECT trace FROM shardq.executions WHERE id = %s", run) == [(None,)]
    assert rows(url, "SELECT trace FROM shardq.signals WHERE execution_id = %s", run) == [
        (None,)]
