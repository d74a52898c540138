"""The blocking and the asyncio halves of each pair keep one shape.

Client/AsyncClient, Store/AsyncStore, ShardPools/AsyncShardPools and the two
fan-outs are written by hand on each side, over shared sans-I/O parts
(client/requests.py, store/statements.py, shards/follow.py's Rerouting). What
keeps them from drifting apart is this test: a method on one side only, or the
same method with other parameters, fails it unless the tables below say why.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shardq.client.async_client import AsyncClient
from shardq.client.client import Client
from shardq.shards import async_fanout, async_pools, fanout, follow, pools
from shardq.store.async_store import AsyncStore
from shardq.store.store import Store

PAIRS: list[tuple[type, type, dict[str, str], dict[str, str]]] = [
    (Client, AsyncClient, {
        "set_workflow_build": "operators' calls (shardq workflow set-build)",
        "workflow_builds": "operators' calls (shardq workflow builds)",
        "migrate_build": "operators' calls (shardq workflow migrate-build)",
    }, {
        "open": "the async pools open on the event loop; Client.connect opens its own",
    }),
    (Store, AsyncStore, {
        # The asyncio store serves the clients; the worker, the relay and the
        # exporter are threads over the blocking one.
        "claim": "worker", "commit_turns": "worker", "extend_leases": "worker",
        "release_leases": "worker", "landed_commits": "worker",
        "purge_batch": "worker's retention", "purge_count": "worker's retention",
        "purge_idle_keys": "worker's retention", "fold_run_counts": "worker's count fold",
        "take_rate_slot": "worker's steps", "declare_rate_limiters": "worker",
        "health": "exporter", "stale_waits": "exporter",
        "takes_writes": "relay", "transaction": "relay and mover",
        "claim_schedules": "worker's ticker", "next_schedule_in": "worker's ticker",
        "run_states": "worker's ticker", "read_histories": "shardq replay",
        "workflow_builds": "operators", "set_workflow_build": "operators",
        "pinned_runs": "operators", "migrate_build": "operators",
    }, {}),
    (pools.ShardPools, async_pools.AsyncShardPools, {
        "fatal": "daemons stop on a map or schema mismatch; serve answers 503 instead",
    }, {
        "pool": "tests read an async pool's stats",
    }),
]


def public(cls: type) -> dict[str, Any]:
    """The public methods of `cls` and of the shardq classes it is made of (mixins such
    as client/flow.py's), the class's own first."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass.__module__.startswith("shardq."):
            for name, value in vars(klass).items():
                if not name.startswith("_"):
                    found.setdefault(name, value)
    return found


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


class _Awaitless(ast.NodeTransformer):
    """An async function read as the blocking one it mirrors: `async def`, `await`,
    `async with` and `async for` become their blocking forms."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        plain = ast.FunctionDef(**{f: getattr(node, f) for f in node._fields if hasattr(node, f)})
        return ast.copy_location(plain, node)

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)  # type: ignore[no-any-return]

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        return ast.copy_location(ast.With(items=node.items, body=node.body), node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        return ast.copy_location(
            ast.For(target=node.target, iter=node.iter, body=node.body, orelse=node.orelse), node)


def _bodies(path: Path) -> dict[str, list[str]]:
    """Each function and method of a module as code alone: no docstring, no comment,
    one formatting (ast.unparse), `AsyncX` read as `X`."""
    tree = _Awaitless().visit(ast.parse(path.read_text()))
    for node in ast.walk(tree):
        if (isinstance(node, ast.FunctionDef | ast.ClassDef) and node.body
                and isinstance(node.body[0], ast.Expr)
                and isinstance(node.body[0].value, ast.Constant)
                and isinstance(node.body[0].value.value, str)):
            node.body = node.body[1:] or [ast.Pass()]
    found: dict[str, list[str]] = {}
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for member in members:
            if isinstance(member, ast.FunctionDef):
                found[member.name] = re.sub(r"\bAsync(\w+)", r"\1",
                                            ast.unparse(member)).splitlines()
    return found


ROOT = Path(__file__).resolve().parents[2]
CODE_DIFF_BUDGET = {
    ("client/client.py", "client/async_client.py"): 60,
    ("store/store.py", "store/async_store.py"): 60,
    ("shards/fanout.py", "shards/async_fanout.py"): 30,
    # Not one design written twice: the async pools route by a blocking ShardPools
    # (the follower) that keeps the map, the probes and the liveness bookkeeping, and
    # hold only the asyncio connection pools themselves. This budget only shrinks.
    ("shards/pools.py", "shards/async_pools.py"): 180,
}
"""Lines in which the functions both halves define differ as code (the diff, after
the async keywords, docstrings, comments and formatting are taken out): the part
of a pair written twice by hand. A screenful; a pair that grows past it has
started to drift."""


@pytest.mark.parametrize(("pair", "budget"), CODE_DIFF_BUDGET.items(),
                         ids=[a for a, _ in CODE_DIFF_BUDGET])
def test_the_two_halves_of_a_pair_differ_by_a_screenful_of_code(
    pair: tuple[str, str], budget: int,
) -> None:
    blocking, asynchronous = (_bodies(ROOT / p) for p in pair)
    differing = sum(
        1 for name in set(blocking) & set(asynchronous)
        for line in difflib.unified_diff(blocking[name], asynchronous[name], lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---")))
    assert differing <= budget, f"{pair}: {differing} lines of code differ (budget {budget})"
