"""Workflow definitions, shared by the worker (to run them) and the client (to start them)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from shardq.core.attributes import check_declared
from shardq.core.errors import InvalidArgument, UnknownHandler, UnknownWorkflow
from shardq.core.flow import RateLimit
from shardq.core.rules import (
    Limits,
    check_concurrency,
    check_name,
    check_priority,
    check_rate_limit,
    check_schema,
    to_json,
    validate,
)
from shardq.workflow.contracts import (
    QuerySpec,
    SignalSpec,
    UpdateSpec,
    check_signals,
    handlers_of,
    interface,
)

if TYPE_CHECKING:
    from shardq.workflow.context import WorkflowContext

WorkflowFn = Callable[["WorkflowContext"], Any]
Concurrency = tuple[str, int] | Callable[[Any], tuple[str, int] | None]
"""A workflow's concurrency: (key, limit) for every run, or a function of the input."""


@dataclass(frozen=True)
class WorkflowDef:
    name: str
    version: int
    fn: WorkflowFn
    gates: tuple[str, ...] = ()
    """Signal names a run takes once (a declarative workflow's gates; see workflow/builder.py)."""
    max_history: int = 10_000
    """Calls (steps, waits, signals ...) one run may record; past it the run fails."""
    max_wait_s: float = 2 * 366 * 86400.0
    """The longest one wait (a timer, a wait's timeout, a retry backoff) may last."""
    retention_s: float | None = None
    """How long a finished run is kept before `shardq purge` or a worker's housekeeping
    deletes it; None: the purger's default (DEFAULT_RETENTION_S)."""
    input_schema: dict[str, Any] | None = None
    """JSON Schema a start's input must match (checked before anything is stored)."""
    signals: tuple[SignalSpec, ...] = ()
    """The signals the workflow publishes (shardq.workflow.contracts)."""
    queries: tuple[QuerySpec, ...] = ()
    updates: tuple[UpdateSpec, ...] = ()
    state_class: type | None = None
    """A class-based workflow's class: each run of its code gets a new instance."""
    priority: int = 0
    """The priority of a start that names none (0-9, higher claimed first)."""
    concurrency: Concurrency | None = None
    """A concurrency key and its limit for every run, or a function of a run's input
    returning one (or None: that run is not limited); docs/flow-control.md."""
    attributes: dict[str, Any] | None = None
    """The search attributes its runs may set (ctx.set_attributes): name -> type (str,
    int, float, bool or datetime); docs/operations.md, "Search attributes"."""

    def __post_init__(self) -> None:
        if isinstance(self.max_history, bool) or not isinstance(self.max_history, int) or (
            self.max_history < 1
        ):
            raise InvalidArgument(f"workflow {self.name}: max_history must be an integer >= 1")
        for field_name in ("max_wait_s", "retention_s"):
            value = getattr(self, field_name)
            if value is not None and not 0 < value < float("inf"):
                raise InvalidArgument(f"workflow {self.name}: {field_name} must be a positive "
                                      "number of seconds")
        try:
            check_priority(self.priority)
            if self.concurrency is not None and not callable(self.concurrency):
                check_concurrency(self.concurrency)
        except InvalidArgument as exc:
            raise InvalidArgument(f"workflow {self.name}: {exc}") from None
        if self.input_schema is not None:
            check_schema(self.input_schema, f"workflow {self.name} input")
        check_signals(self.signals, self.name)
        if self.attributes is not None:
            check_declared(self.attributes, self.name)

    def attribute_types(self) -> dict[str, str]:
        """Its declared search attributes: name -> type name (core/attributes.py)."""
        return {} if self.attributes is None else check_declared(self.attributes, self.name)

    def checked_input(self, workflow_id: str, value: Any, limits: Limits) -> str:
        """A run's input as JSON, within the bound and matching the input schema."""
        what = f"input of {self.name} {workflow_id!r}"
        encoded = limits.check_input(to_json(value, what), what)
        if self.input_schema is not None:
            validate(json.loads(encoded), self.input_schema, what, "input validation failed")
        return encoded

    def concurrency_of(self, value: Any) -> tuple[str, int] | None:
        """The concurrency key and limit of a run started with input `value`, checked."""
        declared = self.concurrency
        if declared is None:
            return None
        if not callable(declared):
            return check_concurrency(declared)
        try:
            chosen = declared(value)
        except Exception as exc:  # the user's function: its failure refuses the start
            raise InvalidArgument(f"workflow {self.name}: its concurrency function raised "
                                  f"{type(exc).__name__}: {exc}") from None
        if chosen is None:
            return None
        try:
            return check_concurrency(chosen)
        except InvalidArgument as exc:
            raise InvalidArgument(f"workflow {self.name}: its concurrency function: "
                                  f"{exc}") from None

    def signal(self, name: str) -> SignalSpec | None:
        """The published contract of signal `name`, if the workflow publishes one."""
        return next((s for s in self.signals if s.name == name), None)

    def query(self, name: str) -> QuerySpec:
        found = next((q for q in self.queries if q.name == name), None)
        if found is None:
            raise UnknownHandler("query", name, self.name)
        return found

    def update(self, name: str) -> UpdateSpec:
        found = next((u for u in self.updates if u.name == name), None)
        if found is None:
            raise UnknownHandler("update", name, self.name)
        return found

    def interface(self) -> dict[str, list[dict[str, Any]]]:
        return interface(self.signals, self.queries, self.updates)

    def new_state(self) -> object | None:
        """A fresh instance of a class-based workflow's class; None for a function."""
        return None if self.state_class is None else self.state_class()


_SETTINGS = frozenset({"max_history", "max_wait_s", "retention_s", "input_schema", "signals",
                       "priority", "concurrency", "attributes"})
T = TypeVar("T")


def _check_version(name: str, version: object) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgument(f"workflow {name}: version must be an integer >= 1")
    return version


def _settings(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """A definition's settings, checked: only known ones, signals as a sorted tuple."""
    unknown = set(settings) - _SETTINGS
    if unknown:
        raise InvalidArgument(f"workflow {name}: unknown setting {', '.join(sorted(unknown))}")
    if "signals" in settings:
        settings = {**settings, "signals": check_signals(settings["signals"], name)}
    return settings


def _run_state(ctx: WorkflowContext) -> Any:
    """The function of every class-based workflow: its instance's run()."""
    return ctx.state.run(ctx)


DEFAULT_RETENTION_S = 30 * 86400.0
"""Finished runs are kept 30 days unless their definition says otherwise."""


class Registry:
    """Workflows by name and version. Several versions of one workflow may live side by side
    so runs started on an old version finish on its code while new runs take the newest."""

    def __init__(self) -> None:
        self._defs: dict[tuple[str, int], WorkflowDef] = {}
        self.schema_signals: frozenset[str] = frozenset()
        """Signal names some registered workflow publishes a schema for: a sender looks
        its target's workflow up (to validate) only for these names."""
        self.rate_limits: dict[str, RateLimit] = {}
        """The rate limiters steps may name (`ctx.step(..., rate_limit=name)`)."""

    def rate_limiter(self, name: str, rate: int, *, per: float = 1.0, burst: int = 1) -> None:
        """Declare rate limiter `name`: `rate` step starts per `per` seconds across every
        worker and shard, evenly spaced, `burst` at once after a quiet spell
        (docs/flow-control.md). Steps of any workflow name it."""
        check_name(name, "rate limiter")
        limit = check_rate_limit(rate, per, burst)
        if self.rate_limits.get(name, limit) != limit:
            raise InvalidArgument(f"rate limiter {name} is already declared as "
                                  f"{self.rate_limits[name]}")
        self.rate_limits[name] = limit

    def workflow(
        self, name: str | None = None, *, version: int = 1, **limits: Any
    ) -> Callable[[WorkflowFn], WorkflowFn]:
        """Decorator: `@registry.workflow("checkout", version=2)` on `def checkout(ctx): ...`.

        `limits`: max_history, max_wait_s, retention_s, priority, concurrency, and the published
        contract's input_schema and signals (see WorkflowDef)."""

        def register(fn: WorkflowFn) -> WorkflowFn:
            self.register(fn, name=name or fn.__name__, version=version, **limits)
            return fn

        return register

    def register(
        self, fn: WorkflowFn, *, name: str, version: int = 1, **limits: Any
    ) -> WorkflowDef:
        check_name(name, "workflow")
        _check_version(name, version)
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) != 1:
            raise InvalidArgument(
                f"workflow {name}: the function must take exactly one argument, the context"
            )
        key = (name, version)
        if key in self._defs and self._defs[key].fn is not fn:
            raise InvalidArgument(f"workflow {name} version {version} is already registered")
        definition = WorkflowDef(name, version, fn, **_settings(name, limits))
        self._add(definition)
        return definition

    def workflow_class(
        self, name: str | None = None, *, version: int = 1, **settings: Any
    ) -> Callable[[type[T]], type[T]]:
        """Decorator for a class-based workflow: a class made with no arguments, whose
        `run(self, ctx)` is the workflow and whose `@query` / `@update` methods are its
        handlers (shardq.workflow.contracts). Each run of the code gets a new instance, so
        its attributes are the run's state, rebuilt by replay. `settings` as for
        `workflow`."""

        def register(cls: type[T]) -> type[T]:
            run = getattr(cls, "run", None)
            if not callable(run):
                raise InvalidArgument(f"workflow class {cls.__name__} has no run(self, ctx)")
            try:
                inspect.signature(cls).bind()
            except TypeError:
                raise InvalidArgument(f"workflow class {cls.__name__} must be constructible "
                                      "with no arguments (read ctx.input in run)") from None
            queries, updates = handlers_of(cls)
            workflow = check_name(name or cls.__name__, "workflow")
            self.register_definition(WorkflowDef(
                workflow, _check_version(workflow, version), _run_state, queries=queries,
                updates=updates, state_class=cls, **_settings(workflow, settings)))
            return cls

        return register

    def register_definition(self, definition: WorkflowDef) -> WorkflowDef:
        """Register a built definition (workflow/builder.py's `Workflow(...).build()`)."""
        if not isinstance(definition, WorkflowDef):
            raise InvalidArgument("register_definition takes what Workflow(...).build() "
                                  f"returns, got {type(definition).__name__}")
        key = (definition.name, definition.version)
        if key in self._defs and self._defs[key] is not definition:
            raise InvalidArgument(f"workflow {definition.name} version {definition.version} "
                                  "is already registered")
        self._add(definition)
        return definition

    def _add(self, definition: WorkflowDef) -> None:
        self._defs[(definition.name, definition.version)] = definition
        self.schema_signals |= {s.name for s in definition.signals if s.schema is not None}

    def get(self, name: str, version: int | None = None) -> WorkflowDef:
        """The definition of `name` at `version`, or its newest version when None."""
        if version is not None:
            found = self._defs.get((name, version))
            if found is None:
                have = sorted(v for n, v in self._defs if n == name)
                detail = f"registered versions: {have}" if have else "no version is registered"
                raise UnknownWorkflow(f"workflow {name!r} version {version} is unknown ({detail})")
            return found
        versions = [d for (n, _), d in self._defs.items() if n == name]
        if not versions:
            known = ", ".join(sorted({n for n, _ in self._defs})) or "none"
            raise UnknownWorkflow(f"unknown workflow {name!r} (registered: {known})")
        return max(versions, key=lambda d: d.version)

    def names(self) -> list[str]:
        return sorted({n for n, _ in self._defs})

    def definitions(self) -> list[WorkflowDef]:
        return list(self._defs.values())
