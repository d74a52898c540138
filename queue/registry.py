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


class Registry:
    """Workflows by name and version. Several versions of one workflow may live side by side
    so runs started on an old version finish on its code while new runs take the newest."""

    def __init__(self) -> None:
        self._defs: dict[tuple[str, int], WorkflowDef] = {}

    def workflow(
        self, name: str | None = None, *, version: int = 1
    ) -> Callable[[WorkflowFn], WorkflowFn]:
        """Decorator: `@registry.workflow("checkout", version=2)` on `def checkout(ctx): ...`."""

        def register(fn: WorkflowFn) -> WorkflowFn:
            self.register(fn, name=name or fn.__name__, version=version)
            return fn

        return register

    def register(self, fn: WorkflowFn, *, name: str, version: int = 1) -> WorkflowDef:
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
        definition = WorkflowDef(name, version, fn)
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
