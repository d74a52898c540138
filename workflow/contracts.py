"""Published interaction contracts: the signals, queries and updates a workflow accepts.

A contract is what a caller that has not read the workflow's source needs: a
name, an optional description, a JSON Schema (Draft 2020-12) for the argument
and, for queries and updates, one for the response. `Client.interface` and
`GET /workflows/registered/{name}/interface` publish them; every entry point
validates against them before anything is stored.

Queries and updates need the run's state. They are methods of a class-based
workflow (`Registry.workflow_class`): the run's `run(ctx)` keeps its state in
the instance's attributes, so the state is whatever replaying the run's
history rebuilds, deterministically.

- A **query** replays the run's committed history in the caller's process (no
  worker needed, parked and finished runs alike), stops at the first call
  history has not recorded, and calls the handler on the instance. It changes
  nothing: the replay writes nothing and the instance is thrown away.
- An **update** is stored as a signal of the reserved name
  `shardq:update:<name>` and wakes the run whatever it waits on. The run
  handles it at its next wait (a `sleep`, `receive`, `wait_until` or
  `interrupt` it reaches or is parked at): the handler mutates the instance
  and its response is recorded in history (`update.completed`) at that call's
  position, so replay applies the same updates at the same point. A run that
  never waits again finishes without handling it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shardq.core.errors import InvalidArgument
from shardq.core.rules import check_name, check_schema, check_signal_name

UPDATE_PREFIX = "shardq:update:"
"""Signals that carry updates: a reserved name, so no sender can forge one."""
MAX_DESCRIPTION = 2000
_QUERY_MARK = "__shardq_query__"
_UPDATE_MARK = "__shardq_update__"

Handler = Callable[[Any, Any], Any]
"""A query or update handler: a method, called as handler(instance, argument)."""


@dataclass(frozen=True)
class SignalSpec:
    """A signal a workflow publishes: its name, what it means, what its payload must be."""

    name: str
    schema: dict[str, Any] | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        check_signal_name(self.name)
        _check_common(f"signal {self.name!r}", self.schema, None, self.description)


@dataclass(frozen=True)
class QuerySpec:
    name: str
    handler: Handler
    schema: dict[str, Any] | None = None
    response_schema: dict[str, Any] | None = None
    description: str | None = None


@dataclass(frozen=True)
class UpdateSpec:
    name: str
    handler: Handler
    schema: dict[str, Any] | None = None
    response_schema: dict[str, Any] | None = None
    description: str | None = None
    validator: Handler | None = None
    """Called as validator(instance, argument) on the run's replayed state before the
    update is stored; raising refuses it (UpdateRejected, the exception's text)."""

    @property
    def signal_name(self) -> str:
        return UPDATE_PREFIX + self.name


def query(
    name: str | None = None, *, schema: dict[str, Any] | None = None,
    response_schema: dict[str, Any] | None = None, description: str | None = None,
) -> Callable[[Handler], Handler]:
    """Mark a method of a class-based workflow as a query handler `(self, arg) -> response`."""

    def mark(fn: Handler) -> Handler:
        spec_name = name or fn.__name__
        check_name(spec_name, "query")
        _check_common(f"query {spec_name!r}", schema, response_schema, description)
        setattr(fn, _QUERY_MARK, QuerySpec(spec_name, fn, schema, response_schema, description))
        return fn

    return mark


def update(
    name: str | None = None, *, schema: dict[str, Any] | None = None,
    response_schema: dict[str, Any] | None = None, description: str | None = None,
    validator: Handler | None = None,
) -> Callable[[Handler], Handler]:
    """Mark a method of a class-based workflow as an update handler `(self, arg) -> response`.

    The handler may change the instance's state; it must not call ctx (it runs
    inside a wait, and again on replay). `validator(self, arg)` runs first, in
    the caller's process on the replayed state, and refuses by raising.
    """

    def mark(fn: Handler) -> Handler:
        spec_name = name or fn.__name__
        check_name(spec_name, "update")
        _check_common(f"update {spec_name!r}", schema, response_schema, description)
        if validator is not None and not callable(validator):
            raise InvalidArgument(f"update {spec_name!r}: the validator is not callable")
        setattr(fn, _UPDATE_MARK, UpdateSpec(spec_name, fn, schema, response_schema,
                                             description, validator))
        return fn

    return mark


def handlers_of(cls: type) -> tuple[tuple[QuerySpec, ...], tuple[UpdateSpec, ...]]:
    """The query and update handlers a class marks, each name once."""
    queries: dict[str, QuerySpec] = {}
    updates: dict[str, UpdateSpec] = {}
    for klass in reversed(cls.__mro__):
        for attr in vars(klass).values():
            found = getattr(attr, _QUERY_MARK, None)
            if isinstance(found, QuerySpec):
                queries[found.name] = found
            found = getattr(attr, _UPDATE_MARK, None)
            if isinstance(found, UpdateSpec):
                updates[found.name] = found
    return tuple(sorted(queries.values(), key=_name)), tuple(sorted(updates.values(), key=_name))


def check_signals(signals: Iterable[SignalSpec], workflow: str) -> tuple[SignalSpec, ...]:
    found = tuple(signals)
    for spec in found:
        if not isinstance(spec, SignalSpec):
            raise InvalidArgument(f"workflow {workflow}: signals takes SignalSpec values, got "
                                  f"{type(spec).__name__}")
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"workflow {workflow}: a signal is published twice")
    return tuple(sorted(found, key=_name))


def interface(
    signals: Iterable[SignalSpec], queries: Iterable[QuerySpec], updates: Iterable[UpdateSpec]
) -> dict[str, list[dict[str, Any]]]:
    """The published contract: each list sorted by name, absent fields left out."""

    def entry(spec: SignalSpec | QuerySpec | UpdateSpec) -> dict[str, Any]:
        out: dict[str, Any] = {"name": spec.name}
        if spec.description is not None:
            out["description"] = spec.description
        if spec.schema is not None:
            out["schema"] = spec.schema
        response = getattr(spec, "response_schema", None)
        if response is not None:
            out["response_schema"] = response
        return out

    return {"signals": [entry(s) for s in sorted(signals, key=_name)],
            "queries": [entry(q) for q in sorted(queries, key=_name)],
            "updates": [entry(u) for u in sorted(updates, key=_name)]}


def _name(spec: SignalSpec | QuerySpec | UpdateSpec) -> str:
    return spec.name


def _check_common(
    what: str, schema: object, response_schema: object, description: object
) -> None:
    if schema is not None:
        check_schema(schema, what)
    if response_schema is not None:
        check_schema(response_schema, f"{what} response")
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION
    ):
        raise InvalidArgument(f"{what}: a description must be a string of at most "
                              f"{MAX_DESCRIPTION} characters")
