"""Published contracts: signal schemas, queries, updates, the interface, boundary validation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from shardq.client.client import Client
from shardq.core.errors import (
    ExecutionNotFound,
    PayloadInvalid,
    QueryFailed,
    UnknownHandler,
    UnknownWorkflow,
    UpdateFailed,
    UpdateRefused,
    UpdateRejected,
    UpdateTimedOut,
)
from shardq.core.models import SignalRequest, State
from shardq.shards.config import ShardMap
from shardq.worker.worker import Worker
from shardq.workflow.context import WorkflowContext
from shardq.workflow.contracts import SignalSpec, query, update
from shardq.workflow.registry import Registry

from ..support import wait_until

StartWorker = Callable[..., Worker]
registry = Registry()

ITEMS = {"type": "object", "required": ["items"], "properties": {
    "items": {"type": "array", "items": {"type": "string"}}}}
PAID = {"type": "object", "required": ["amount"], "properties": {
    "amount": {"type": "number", "exclusiveMinimum": 0}}}
ADDRESS = {"type": "object", "required": ["street"], "additionalProperties": False,
           "properties": {"street": {"type": "string", "minLength": 1}}}


def no_duplicates(order: Order, item: str) -> None:
    if item in order.items:
        raise ValueError(f"{item} is already in the order")


@registry.workflow_class("order", input_schema=ITEMS, signals=[
    SignalSpec("paid", schema=PAID, description="The gateway confirmed the payment"),
    SignalSpec("note"),
])
class Order:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.address: dict[str, str] | None = None
        self.status = "new"
        self.paid: float | None = None

    def run(self, ctx: WorkflowContext) -> Any:
        self.items = list(ctx.input["items"])
        self.status = "awaiting_payment"
        self.paid = ctx.wait_for_signal("paid")["amount"]
        self.status = "awaiting_address"
        ctx.wait_until(lambda: self.address is not None, on={"note": lambda s: None},
                       name="address")
        self.status = "shipping"
        street = (self.address or {})["street"]
        shipped = ctx.step("ship", lambda: f"shipped to {street}")
        self.status = "done"
        return {"items": self.items, "paid": self.paid, "shipped": shipped}

    @query("status", response_schema={"type": "object"}, description="Where the order is")
    def status_of(self, argument: Any) -> dict[str, Any]:
        return {"status": self.status, "items": self.items, "paid": self.paid}

    @query("item")
    def item(self, index: int) -> str:
        return self.items[index]

    @update("add_item", schema={"type": "string", "minLength": 1},
            response_schema={"type": "integer"}, validator=no_duplicates,
            description="Add an item before shipping")
    def add_item(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)

    @update("set_address", schema=ADDRESS)
    def set_address(self, address: dict[str, str]) -> dict[str, bool]:
        self.address = address
        return {"ok": True}

    @update("explode")
    def explode(self, argument: Any) -> None:
        raise RuntimeError("the handler broke")


@registry.workflow_class("napper")
class Napper:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def run(self, ctx: WorkflowContext) -> Any:
        ctx.sleep("nap", 3600)
        return self.notes

    @update("note")
    def note(self, text: str) -> list[str]:
        self.notes.append(text)
        return list(self.notes)


def count(shard_map: ShardMap, table: str) -> int:
    total = 0
    for shard in shard_map.shards:
        with psycopg.connect(shard.url) as conn:
            row = conn.execute(f"SELECT count(*) FROM shardq.{table}").fetchone()
            total += row[0] if row else 0
    return total


def test_the_interface_lists_what_the_workflow_publishes(client: Client) -> None:
    assert client.interface("order") == {
        "signals": [
            {"name": "note"},
            {"name": "paid", "description": "The gateway confirmed the payment",
             "schema": PAID},
        ],
        "queries": [
            {"name": "item"},
            {"name": "status", "description": "Where the order is",
             "response_schema": {"type": "object"}},
        ],
        "updates": [
            {"name": "add_item", "description": "Add an item before shipping",
             "schema": {"type": "string", "minLength": 1},
             "response_schema": {"type": "integer"}},
            {"name": "explode"},
            {"name": "set_address", "schema": ADDRESS},
        ],
    }
    assert client.interface("napper") == {"signals": [], "queries": [],
                                          "updates": [{"name": "note"}]}
    with pytest.raises(UnknownWorkflow):
        client.interface("nope")


def test_queries_and_updates_through_a_run_s_life(
    client: Client, shard_map: ShardMap, start_worker: StartWorker
) -> None:
    run = client.start("order", "o-1", {"items": ["book"]}).execution_id
    # No worker has run it: the query replays its (empty) history to the first wait.
    assert client.query(run, "status") == {"status": "awaiting_payment", "items": ["book"],
                                           "paid": None}
    assert client.query(run, "item", 0) == "book"
    with pytest.raises(QueryFailed, match="IndexError"):
        client.query(run, "item", 5)
    with pytest.raises(UnknownHandler, match="no query named 'nope'"):
        client.query(run, "nope")
    start_worker(registry, poll_interval_s=60.0)
    wait_until(lambda: client.get(run).state is State.WAITING, what="parked on paid")

    assert client.update(run, "add_item", "pen").response == 2
    keyed = client.update(run, "add_item", "ink", idempotency_key="add-ink")
    assert (keyed.response, keyed.accepted) == (3, True)
    again = client.update(run, "add_item", "ink", idempotency_key="add-ink")
    assert (again.response, again.accepted, again.update_id) == (3, False, keyed.update_id)
    with pytest.raises(UpdateRejected, match="ink is already in the order"):
        client.update(run, "add_item", "ink")
    with pytest.raises(UpdateFailed, match="RuntimeError: the handler broke"):
        client.update(run, "explode")
    assert client.query(run, "status")["items"] == ["book", "pen", "ink"]

    client.signal(run, "paid", {"amount": 12.5})
    wait_until(lambda: client.query(run, "status")["status"] == "awaiting_address",
               what="paid")
    assert client.update(run, "set_address", {"street": "Main St 1"}).response == {"ok": True}
    done = client.wait(run, timeout=10)
    assert done.output == {"items": ["book", "pen", "ink"], "paid": 12.5,
                           "shipped": "shipped to Main St 1"}
    # A finished run answers queries from its history, and keyed repeats from the record.
    assert client.query(run, "status")["status"] == "done"
    assert client.update(run, "add_item", "ink", idempotency_key="add-ink").response == 3
    with pytest.raises(UpdateRefused) as refused:
        client.update(run, "add_item", "cup")
    assert refused.value.reason_code == "run_finished"
    kinds = [e.kind for e in client.history(run) if e.kind == "update.completed"]
    assert len(kinds) == 4  # pen, ink, explode, address: a keyed repeat adds nothing


def test_an_update_wakes_a_sleeping_run_and_leaves_it_sleeping(
    client: Client, start_worker: StartWorker
) -> None:
    run = client.start("napper", "n-1").execution_id
    with pytest.raises(UpdateTimedOut) as late:  # no worker yet: stored, not handled
        client.update(run, "note", "first", idempotency_key="k1", wait=0.2)
    start_worker(registry, poll_interval_s=60.0)
    assert client.update(run, "note", "first", idempotency_key="k1").update_id == (
        late.value.update_id)
    assert client.update(run, "note", "second").response == ["first", "second"]
    wait_until(lambda: client.get(run).state is State.WAITING, what="asleep again")
    wait, _ = client.waiting(run)
    assert wait is not None and wait.kind == "timer"
    # A new worker replays both updates at the sleep and handles a third one after them.
    assert client.update(run, "note", "third").response == ["first", "second", "third"]


def test_update_with_start_starts_the_run_once(
    client: Client, start_worker: StartWorker
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    first = client.update_with_start("napper", "n-2", None, "note", "hello",
                                     idempotency_key="u-1")
    assert (first.created, first.response, first.accepted) == (True, ["hello"], True)
    repeat = client.update_with_start("napper", "n-2", None, "note", "hello",
                                      idempotency_key="u-1")
    assert (repeat.created, repeat.response, repeat.accepted) == (False, ["hello"], False)
    assert repeat.execution_id == first.execution_id
    other = client.update_with_start("napper", "n-2", None, "note", "again")
    assert other.response == ["hello", "again"]


def test_every_entry_point_refuses_a_payload_that_breaks_its_schema(
    client: Client, shard_map: ShardMap
) -> None:
    def violations(call: Callable[[], object]) -> list[dict[str, str]]:
        with pytest.raises(PayloadInvalid) as caught:
            call()
        return caught.value.violations

    assert violations(lambda: client.start("order", "bad", {"items": "book"})) == [
        {"message": "'book' is not of type 'array'", "field_path": "/items"}]
    assert violations(lambda: client.start("order", "bad", {})) == [
        {"message": "'items' is a required property", "field_path": "/items"}]
    assert count(shard_map, "executions") == 0
    run = client.start("order", "o-2", {"items": []}).execution_id
    assert violations(lambda: client.signal(run, "paid", {"amount": 0})) == [
        {"message": "0 is less than or equal to the minimum of 0", "field_path": "/amount"}]
    results = client.signal_many([SignalRequest(run, "paid", {}),
                                  SignalRequest(run, "note", "anything goes"),
                                  SignalRequest(run, "paid", {"amount": 1})])
    assert isinstance(results[0].error, PayloadInvalid)
    assert [r.delivered for r in results] == [False, True, True]
    assert violations(lambda: client.signal_with_start(
        "order", "o-2", {"items": []}, "paid", {"amount": "ten"}))[0]["field_path"] == "/amount"
    assert violations(lambda: client.update(run, "set_address", {"street": ""}))[0][
        "field_path"] == "/street"
    assert violations(lambda: client.update(run, "set_address", {"street": "x", "zip": 1}))[
        0]["message"].startswith("Additional properties are not allowed")
    assert violations(lambda: client.update_with_start(
        "order", "o-3", {"items": 3}, "add_item", "pen"))[0]["field_path"] == "/items"
    assert violations(lambda: client.update_with_start(
        "order", "o-3", {"items": []}, "add_item", ""))[0]["field_path"] == ""
    # Nothing of the refused calls is stored: two signals landed, no update, no o-3.
    assert count(shard_map, "signals") == 2
    assert count(shard_map, "executions") == 1
    with pytest.raises(ExecutionNotFound):
        client.query(run, "status", tenant="other")


@registry.workflow("snoop")
def snoop(ctx: WorkflowContext) -> Any:
    """Tries to take updates as plain signals: the reserved names are refused in code too."""
    if ctx.input == "wait_until":
        return ctx.wait_until(lambda: False, on={"shardq:update:note": lambda s: None})
    return ctx.receive("shardq:update:note")


@pytest.mark.parametrize("how", ["receive", "wait_until"])
def test_workflow_code_cannot_receive_updates_as_signals(
    client: Client, start_worker: StartWorker, how: str
) -> None:
    start_worker(registry, poll_interval_s=60.0)
    run = client.start("snoop", f"snoop-{how}", how).execution_id
    failed = client.wait(run, timeout=10)
    assert failed.state is State.FAILED
    assert failed.error is not None and "is reserved" in failed.error["message"]
