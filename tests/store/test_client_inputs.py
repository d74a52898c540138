"""Values PostgreSQL cannot store are refused by the client, naming the field, before any
statement runs: deep nesting, NUL characters and lone surrogates, on every entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardq.client.client import Client
from shardq.core.errors import InvalidArgument
from shardq.core.models import SignalRequest
from shardq.core.rules import Limits
from shardq.shards.config import ShardMap

from ..app import registry
from ..support import all_rows


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def _counts(shard_map: ShardMap) -> list[int]:
    return [sum(n for (n,) in all_rows(shard_map, f"SELECT count(*) FROM shardq.{t}"))
            for t in ("executions", "signals", "history")]


Call = Callable[[Client, str], object]
CALLS: list[tuple[str, Call, str]] = [
    ("deep-input", lambda c, run: c.start("checkout", "k", nested(5000)), "nested too deeply"),
    ("deep-payload", lambda c, run: c.signal(run, "go", nested(5000)), "nested too deeply"),
    ("nul-input-value", lambda c, run: c.start("checkout", "k", {"a": ["x\x00"]}),
     "the string at $.a[0] contains a NUL character"),
    ("nul-input-key", lambda c, run: c.start("checkout", "k", {"a\x00": 1}),
     "a key at $ contains a NUL character"),
    ("surrogate-input", lambda c, run: c.start("checkout", "k", {"odd key": "\ud800"}),
     'the string at $["odd key"] contains a lone surrogate'),
    ("nul-workflow-id", lambda c, run: c.start("checkout", "k\x00"),
     "workflow_id contains a NUL character (\\u0000) at position 1"),
    ("surrogate-workflow-id", lambda c, run: c.start("checkout", "\udcff"),
     "workflow_id contains a lone surrogate"),
    ("nul-tenant", lambda c, run: c.start("checkout", "k", tenant="t\x00"), "tenant name"),
    ("nul-workflow-name", lambda c, run: c.start("check\x00out", "k"), "workflow name"),
    ("nul-payload", lambda c, run: c.signal(run, "go", "\x00"), "NUL character"),
    ("nul-signal-name", lambda c, run: c.signal(run, "g\x00"), "signal name"),
    ("nul-key", lambda c, run: c.signal(run, "go", idempotency_key="k\x00"),
     "idempotency_key contains a NUL character"),
    ("nul-list-filter", lambda c, run: c.list_runs(workflow="x\x00"), "workflow name"),
    ("nul-cancel-tenant", lambda c, run: c.cancel(run, tenant="\x00"), "tenant name"),
    ("10-MB-input", lambda c, run: c.start("checkout", "k", "x" * 10_000_000),
     "input of checkout 'k' is 10,000,002 bytes of JSON; at most 1,048,576"),
    ("10-MB-payload", lambda c, run: c.signal(run, "go", {"blob": "x" * 10_000_000}),
     "payload of signal 'go' is 10,000,012 bytes of JSON; at most 262,144"),
    ("3000-char-key", lambda c, run: c.signal(run, "go", idempotency_key="k" * 3000),
     "idempotency_key is 3000 characters long; at most 255"),
    ("twice-workflow-id", lambda c, run: c.start_many("checkout", [
        ("k", {"order_id": 1, "items": []}), ("k", {"order_id": 1, "items": []})]),
     "workflow_id 'k' appears twice in one call"),
    ("list-workflow-id", lambda c, run: c.start_many("checkout", [(["k"], None)]),  # type: ignore[list-item]
     "workflow_id must be a 1..512 character string"),
    ("list-workflow-id-with-start", lambda c, run: c.signal_with_start(
        "checkout", ["k"], None, "go"),  # type: ignore[arg-type]
     "workflow_id must be a 1..512 character string"),
]


def test_unstorable_values_are_refused_naming_the_field(
    client: Client, shard_map: ShardMap
) -> None:
    run = str(client.start("park", "target").execution_id)
    before = _counts(shard_map)
    for label, call, message in CALLS:
        with pytest.raises(InvalidArgument) as info:
            call(client, run)
        assert message in str(info.value), label
        assert "\n" not in str(info.value), label
    assert _counts(shard_map) == before


def test_nesting_json_can_hold_still_goes_through(client: Client) -> None:
    started = client.start("checkout", "k", {"deep": nested(200), "emoji": "\U0001f600"})
    assert client.get(started.execution_id).input == {"deep": nested(200), "emoji": "\U0001f600"}


def test_limits_are_the_application_s_to_set(shard_map: ShardMap) -> None:
    small = Limits(max_input_bytes=20, max_payload_bytes=10, max_idempotency_key=3)
    with Client.connect(shard_map, registry, limits=small) as client:
        run = client.start("park", "small", {"n": 1})  # 8 bytes of JSON
        before = _counts(shard_map)
        with pytest.raises(InvalidArgument, match="at most 20"):
            client.start("park", "large", {"text": "too long for twenty"})
        with pytest.raises(InvalidArgument, match="at most 10"):
            client.signal(run.execution_id, "go", "eleven chars")
        with pytest.raises(InvalidArgument, match="at most 3"):
            client.signal(run.execution_id, "go", idempotency_key="four")
        assert _counts(shard_map) == before
        assert client.signal(run.execution_id, "go", 1, idempotency_key="abc").delivered
    with pytest.raises(InvalidArgument, match="max_payload_bytes must be a positive integer"):
        Limits(max_payload_bytes=0)


def test_a_batch_refuses_only_its_bad_items(client: Client, shard_map: ShardMap) -> None:
    run = str(client.start("park", "batch-target").execution_id)
    bad = [
        (SignalRequest(run, "go", nested(5000)), "nested too deeply"),
        (SignalRequest(run, "go", None, "\udcff"), "idempotency_key contains a lone surrogate"),
        (SignalRequest(run, "go", "x" * 300_000), "at most 262,144 (Limits.max_payload_bytes)"),
        (SignalRequest(run, "g\x00"), "signal name"),
    ]
    results = client.signal_many([SignalRequest(run, "go", 1, "ok"), *(r for r, _ in bad),
                                  SignalRequest(run, "go", 2)])
    assert [r.delivered for r in results] == [True, False, False, False, False, True]
    for result, (_, message) in zip(results[1:5], bad, strict=True):
        assert isinstance(result.error, InvalidArgument) and message in str(result.error)
    assert all_rows(shard_map, "SELECT payload FROM shardq.signals ORDER BY id") == [(1,), (2,)]
