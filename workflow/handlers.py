"""The workflow-state callbacks a wait runs: predicates, signal handlers, update handlers.

They run again on every replay, so they must depend on workflow state alone:
while one runs, `running` is set and the context refuses every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardq.core.models import Signal
from shardq.workflow.contracts import UpdateSpec
from shardq.workflow.recorded import json_round_trip
from shardq.workflow.steps import error_payload


class StateHandlers:
    def __init__(self, state: object | None, updates: Sequence[UpdateSpec]) -> None:
        self.state = state
        self.running = False
        self._updates = {u.name: u for u in updates}

    def holds(self, predicate: Callable[[], object]) -> bool:
        self.running = True
        try:
            return bool(predicate())
        finally:
            self.running = False

    def handle(self, handler: Callable[[Signal], object], signal: Signal) -> None:
        self.running = True
        try:
            handler(signal)
        finally:
            self.running = False

    def apply_update(self, name: str, argument: Any) -> dict[str, Any]:
        """Run update `name`'s handler on the state: {"response": ...} or {"error": ...}."""
        spec = self._updates.get(name)
        if spec is None:
            return {"error": {"type": "UnknownHandler", "message":
                              f"this version of the workflow has no update named {name!r}"}}
        self.running = True
        try:
            return {"response": json_round_trip(spec.handler(self.state, argument))}
        except Exception as exc:  # the handler's failure is its caller's answer
            return {"error": error_payload(exc)}
        finally:
            self.running = False
