"""Workflow definitions, shared by the worker (to run them) and the client (to start them)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardq.queue.errors import InvalidArgument, UnknownWorkflow
from shardq.queue.names import check_name

if TYPE_CHECKING:
    from shardq.queue.context import WorkflowContext

WorkflowFn = Callable[["WorkflowContext"], Any]


@dataclass(frozen=True)
class WorkflowDef:
    name: str
    version: int
    fn: WorkflowFn
    gates: tuple[str, ...] = ()
    """Signal names a run takes once (a declarative workflow's gates; see queue/builder.py)."""
    max_history: int = 10_000
    """Calls (steps, waits, signals ...) one run may record; past it the run fails."""
    max_wait_s: float = 2 * 366 * 86400.0
    """The longest one wait (a timer, a wait's timeout, a retry backoff) may last."""
    retention_s: float | None = None
    """How long a finished run is kept before `shardq purge` or a worker's housekeeping
    deletes it; None: the purger's default (DEFAULT_RETENTION_S)."""

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


DEFAULT_RETENTION_S = 30 * 86400.0
"""Finished runs are kept 30 days unless their definition says otherwise."""


class Registry:
    """Workflows by name and version. Several versions of one workflow may live side by side
    so runs started on an old version finish on its code while new runs take the newest."""

    def __init__(self) -> None:
        self._defs: dict[tuple[str, int], WorkflowDef] = {}

    def workflow(
        self, name: str | None = None, *, version: int = 1, **limits: Any
    ) -> Callable[[WorkflowFn], WorkflowFn]:
        """Decorator: `@registry.workflow("checkout", version=2)` on `def checkout(ctx): ...`.

        `limits`: max_history, max_wait_s, retention_s (see WorkflowDef)."""

        def register(fn: WorkflowFn) -> WorkflowFn:
            self.register(fn, name=name or fn.__name__, version=version, **limits)
            return fn

        return register

    def register(
        self, fn: WorkflowFn, *, name: str, version: int = 1, **limits: Any
    ) -> WorkflowDef:
        check_name(name, "workflow")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise InvalidArgument(f"workflow {name}: version must be an integer >= 1")
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
        unknown = set(limits) - {"max_history", "max_wait_s", "retention_s"}
        if unknown:
            raise InvalidArgument(f"workflow {name}: unknown setting {', '.join(sorted(unknown))}")
        definition = WorkflowDef(name, version, fn, **limits)
        self._defs[key] = definition
        return definition

    def register_definition(self, definition: WorkflowDef) -> WorkflowDef:
        """Register a built definition (queue/builder.py's `Workflow(...).build()`)."""
        if not isinstance(definition, WorkflowDef):
            raise InvalidArgument("register_definition takes what Workflow(...).build() "
                                  f"returns, got {type(definition).__name__}")
        key = (definition.name, definition.version)
        if key in self._defs and self._defs[key] is not definition:
            raise InvalidArgument(f"workflow {definition.name} version {definition.version} "
                                  "is already registered")
        self._defs[key] = definition
        return definition

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
