"""ctx.continue_as_new: a run that loops for years with a bounded history.

The run's turn ends, and its commit starts the next generation in place: the
same execution id and workflow id, the new input, its history emptied but for a
`run.continued` marker (and a child's `child.of`), its unconsumed signals kept
for the new generation, its consumed ones dropped (docs/composition.md).
"""

from __future__ import annotations

from typing import Any, NoReturn

from shardq.core.models import Claim
from shardq.core.rules import Limits, to_json
from shardq.workflow.children import Definitions
from shardq.workflow.control import ContinueAsNew


class ContinueCalls:
    """continue_as_new for WorkflowContext, on the state the context keeps."""

    _claim: Claim
    _limits: Limits
    _registry: Definitions | None

    def _guard(self) -> None:
        raise NotImplementedError

    def continue_as_new(
        self, input: Any = None,  # noqa: A002 - the documented API name
    ) -> NoReturn:
        """End this generation of the run and start the next with `input`, atomically.

        Nothing after the call runs. The next generation starts from the top of the
        workflow function with an empty history, under the same execution id and
        workflow id, so `client.wait` and every signal sender keep finding it;
        signals buffered and not yet consumed carry over. What the turn did before
        the call (a step's result, a signal sent) is committed with it. Children of
        policy `cancel` still running are asked to cancel, as at the run's end.
        """
        self._guard()
        claim = self._claim
        if self._registry is not None:
            definition = self._registry.get(claim.workflow_name, claim.workflow_version)
            encoded = definition.checked_input(claim.workflow_id, input, self._limits)
        else:
            encoded = self._limits.check_input(to_json(input, "continue_as_new input"),
                                               "continue_as_new input")
        raise ContinueAsNew(encoded)
