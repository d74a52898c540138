"""The blocking and the asyncio halves of each pair keep one shape.

Client/AsyncClient, Store/AsyncStore, ShardPools/AsyncShardPools and the two
fan-outs are written by hand on each side, over shared sans-I/O parts
(client/requests.py, store/statements.py, shards/follow.py's Rerouting). What
keeps them from drifting apart is this test: a method on one side only, or the
same method with other parameters, fails it unless the tables below say why.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import pytest

from shardq.client.async_client import AsyncClient
from shardq.client.client import Client
from shardq.shards import async_fanout, async_pools, fanout, follow, pools
from shardq.store.async_store import AsyncStore
from shardq.store.store import Store

PAIRS: list[tuple[type, type, dict[str, str], dict[str, str]]] = [
    (Client, AsyncClient, {}, {
        "open": "the async pools open on the event loop; Client.connect opens its own",
    }),
    (Store, AsyncStore, {
        # The asyncio store serves the clients; the worker, the relay and the
        # exporter are threads over the blocking one.
        "claim": "worker", "commit_turns": "worker", "extend_leases": "worker",
        "release_leases": "worker", "landed_commits": "worker",
        "purge_batch": "worker's retention", "purge_count": "worker's retention",
        "health": "exporter", "stale_waits": "exporter",
        "takes_writes": "relay", "transaction": "relay and mover",
    }, {}),
    (pools.ShardPools, async_pools.AsyncShardPools, {
        "fatal": "daemons stop on a map or schema mismatch; serve answers 503 instead",
    }, {
        "pool": "tests read an async pool's stats",
    }),
]


def public(cls: type) -> dict[str, Any]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def shape(function: Any) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults: what a caller writes, either side."""
    function = getattr(function, "__func__", function)  # classmethod, staticmethod
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def is_async(function: Any) -> bool:
    function = getattr(function, "__func__", function)
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


@pytest.mark.parametrize(("blocking", "asynchronous", "sync_only", "async_only"), PAIRS,
                         ids=[pair[0].__name__ for pair in PAIRS])
def test_each_method_exists_on_both_sides_with_the_same_parameters(
    blocking: type, asynchronous: type, sync_only: dict[str, str], async_only: dict[str, str],
) -> None:
    sync_side, async_side = public(blocking), public(asynchronous)
    assert sorted(set(sync_side) - set(async_side)) == sorted(sync_only), \
        f"on {blocking.__name__} only: add it to {asynchronous.__name__} or say why above"
    assert sorted(set(async_side) - set(sync_side)) == sorted(async_only), \
        f"on {asynchronous.__name__} only: add it to {blocking.__name__} or say why above"
    for name in sorted(set(sync_side) & set(async_side)):
        one, other = sync_side[name], async_side[name]
        if isinstance(one, property) or isinstance(other, property):
            assert isinstance(one, property) and isinstance(other, property), name
            continue
        assert shape(one) == shape(other), f"{name}: the two sides take other parameters"
        assert not is_async(one), f"{blocking.__name__}.{name} must not be a coroutine"


@pytest.mark.parametrize(("blocking", "asynchronous"), [
    (Client, AsyncClient), (Store, AsyncStore),
])
def test_what_does_io_is_a_coroutine_on_the_async_side(blocking: type, asynchronous: type) -> None:
    """Methods that touch no connection (interface(), map) stay plain on both sides."""
    plain = {"interface", "connect", "map", "pools", "registry", "limits"}
    for name, value in public(asynchronous).items():
        if name in plain or isinstance(value, property) or not callable(value):
            continue
        assert is_async(value) or name == "connection", f"{asynchronous.__name__}.{name}"


FUNCTIONS: list[tuple[ModuleType, ModuleType, str]] = [
    (fanout, async_fanout, "fan_out"),
    (fanout, async_fanout, "each_shard"),
    (follow, async_fanout, "rerouted"),
]


@pytest.mark.parametrize(("sync_module", "async_module", "name"), FUNCTIONS,
                         ids=[f[2] for f in FUNCTIONS])
def test_the_fan_outs_take_the_same_parameters(
    sync_module: ModuleType, async_module: ModuleType, name: str,
) -> None:
    blocking, asynchronous = getattr(sync_module, name), getattr(async_module, name)
    assert shape(blocking) == shape(asynchronous)
    assert is_async(asynchronous) and not is_async(blocking)


def test_the_async_fan_out_module_has_no_function_the_sync_side_lacks() -> None:
    sync_names = {n for m in (fanout, follow) for n, v in vars(m).items()
                  if inspect.isfunction(v) and not n.startswith("_")}
    async_names = {n for n, v in vars(async_fanout).items()
                   if inspect.isfunction(v) and not n.startswith("_") and
                   v.__module__ == async_fanout.__name__}
    assert async_names <= sync_names
