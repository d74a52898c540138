"""ctx.set_attributes: the search attributes a run sets about itself (core/attributes.py).

The call takes a position, as every call does, and records an `attributes.set`
event there; the commit that carries the event writes the values where clients
list, count and act on runs by them (schema/0030). On replay the recorded event
stands and nothing is written again. Adding the call to a workflow whose runs
are parked is a change of their history like any new call: behind `ctx.patched`
(docs/versioning.md).
"""

from __future__ import annotations

from typing import Any

from shardq.core.attributes import encoded
from shardq.core.errors import InvalidArgument, UnknownWorkflow
from shardq.core.models import Claim, Event, NewEvent
from shardq.core.rules import check_name
from shardq.workflow.children import Definitions
from shardq.workflow.journal import Journal
from shardq.workflow.replay import Replay


class AttributeCalls:
    """set_attributes for WorkflowContext, on the state the context keeps."""

    _claim: Claim
    _replay: Replay
    _journal: Journal
    _registry: Definitions | None

    def _guard(self) -> None:
        raise NotImplementedError

    def set_attributes(self, **values: Any) -> None:
        """Set the run's search attributes (None removes one), each of a name and type its
        workflow declares (`attributes={"region": str, ...}`): committed with the turn,
        after which `list_runs(where=...)`, `count_runs` and the bulk actions find the
        run by them."""
        if not values:
            raise InvalidArgument("set_attributes needs at least one NAME=value")
        self._guard()
        position, recorded = self._replay.next("attributes", "set")
        if recorded and not self._replay.strict:
            return  # what was recorded stands; a query's replay may know no declarations
        stored = self._attributes_checked(values)
        if recorded:
            self._replay.argument(position, "attributes", "values",
                                  recorded[0].payload["values"], stored)
            return
        self._journal.events.append(
            NewEvent(position, Event.ATTRIBUTES_SET, "set", {"values": stored}))

    def _attributes_checked(self, values: dict[str, Any]) -> dict[str, Any]:
        """`values` as stored, each checked against its declaration."""
        declared = self._declared()
        stored: dict[str, Any] = {}
        for name, value in values.items():
            check_name(name, "attribute")
            if name not in declared:
                raise InvalidArgument(
                    f"workflow {self._claim.workflow_name} declares no attribute {name!r}"
                    + (f" (it declares {', '.join(sorted(declared))})" if declared else ""))
            stored[name] = encoded(name, value, declared[name])
        return stored

    def _declared(self) -> dict[str, str]:
        if self._registry is None:
            return {}
        try:
            definition = self._registry.get(self._claim.workflow_name,
                                            self._claim.workflow_version)
        except UnknownWorkflow:
            return {}
        return definition.attribute_types()
