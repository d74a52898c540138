"""Child workflows: the ctx calls that start runs and wait for their outcomes.

A start is recorded at a call position of its own (`child.started`, with the
child's id) and made by the turn's next commit: on the parent's shard in that
commit, elsewhere through the outbox (schema/0023). Replay returns the recorded
handle and starts nothing. A child's end comes back as a buffered message;
a wait takes the outcomes it needs at its own position (`children.ended`) and
parks on one row that counts the outcomes still missing, however many children
it waits for (docs/composition.md).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shardq.core.children import (
    CHILD_SIGNAL,
    MAX_CHILDREN_BATCH,
    POLICIES,
    ChildHandle,
    ChildOutcome,
    ChildRequest,
    ChildStart,
)
from shardq.core.errors import InvalidArgument, UnknownWorkflow
from shardq.core.models import (
    BufferedSignal,
    Claim,
    Event,
    HistoryEvent,
    NewEvent,
    OpenWait,
    State,
    TaskAction,
)
from shardq.core.rules import Limits, check_name, check_workflow_id
from shardq.shards.routing import BUCKETS, bucket_for
from shardq.workflow.control import Park
from shardq.workflow.journal import Journal
from shardq.workflow.replay import Replay


class ChildDefinition(Protocol):
    """What a child's start reads of its workflow's definition (registry.ChildDefinition)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def gates(self) -> tuple[str, ...]: ...
    def checked_input(self, workflow_id: str, value: Any, limits: Limits) -> str: ...
    def concurrency_of(self, value: Any) -> tuple[str, int] | None: ...
    def attribute_types(self) -> dict[str, str]: ...


class Definitions(Protocol):
    """Where a child's workflow is found by name (registry.Registry): a protocol, so
    the context does not import the registry, which imports it."""

    def get(self, name: str, version: int | None = None) -> ChildDefinition: ...


class ChildCalls:
    """The child calls of WorkflowContext, on the state the context keeps."""

    _claim: Claim
    _replay: Replay
    _journal: Journal
    _limits: Limits
    _registry: Definitions | None
    _on_this_shard: Callable[[uuid.UUID], bool] | None
    _pending: list[BufferedSignal]
    _outcomes: dict[uuid.UUID, dict[str, Any]]
    """Child id -> the outcome a wait took, from history or this turn."""
    _kept: list[ChildHandle]
    """Children of policy `wait`: a completing run waits for them first."""

    def _guard(self) -> None:
        raise NotImplementedError

    def _replay_updates(self, recorded: Sequence[HistoryEvent]) -> None:
        raise NotImplementedError

    def _take_updates(self, position: int) -> bool:
        raise NotImplementedError

    def start_child(
        self, workflow: str, workflow_id: str,
        input: Any = None,  # noqa: A002 - the documented API name
        *, policy: str = "cancel",
    ) -> ChildHandle:
        """Start a run of `workflow` as this run's child; its handle, to wait for.

        The child is a run like any other (of this run's tenant, placed by its own
        workflow key), started by this turn's next commit, exactly once: replay
        returns the recorded handle. `policy` says what becomes of it when this run
        ends first: `cancel` (the default), `abandon`, or `wait` (this run's
        completion waits for it). A workflow id another run holds makes the child
        end `failed` at once (ChildStartRefused), which its wait reports.
        """
        (handle,) = self.start_children([ChildRequest(workflow, workflow_id, input, policy)])  # type: ignore[arg-type]
        return handle

    def start_children(self, requests: Sequence[ChildRequest]) -> list[ChildHandle]:
        """Start many children in one commit (at most 10,000); handles in the order given.

        Each takes a call position of its own. A bad workflow, id, input or policy
        raises before any is started.
        """
        if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
            raise InvalidArgument("start_children takes a list of ChildRequest")
        if len(requests) > MAX_CHILDREN_BATCH:
            raise InvalidArgument(f"at most {MAX_CHILDREN_BATCH} children in one call, "
                                  f"got {len(requests)}")
        for request in requests:
            if not isinstance(request, ChildRequest):
                raise InvalidArgument(f"start_children takes ChildRequest items, got "
                                      f"{type(request).__name__}")
            check_workflow_id(request.workflow_id)
            check_name(request.workflow, "workflow")
        self._guard()
        calls = [self._replay.next("child", r.workflow_id) for r in requests]
        # Checked only when started: a replay returns what was recorded.
        fresh = [(r, position) for r, (position, recorded) in zip(requests, calls, strict=True)
                 if not recorded]
        starts = self._checked([r for r, _ in fresh])
        seen: set[tuple[str, str]] = set()
        for (request, _), (definition, _) in zip(fresh, starts, strict=True):
            key = (definition.name, request.workflow_id)
            if key in seen:
                raise InvalidArgument(f"child {definition.name} {request.workflow_id!r} "
                                      "appears twice in one call")
            seen.add(key)
        handles = []
        started: list[tuple[int, ChildHandle]] = []
        new = iter(zip(fresh, starts, strict=True))
        for request, (position, recorded) in zip(requests, calls, strict=True):
            if recorded:
                self._replay.argument(position, f"child {request.workflow_id!r}", "workflow",
                                      recorded[0].payload["workflow"], request.workflow)
                handles.append(self._keep(_handle_of(recorded[0].payload)))
                continue
            (fresh_request, _), (definition, input_json) = next(new)
            handle = self._keep(self._start(fresh_request, position, definition, input_json))
            handles.append(handle)
            started.append((position, handle))
        self._record_starts(started)
        return handles

    def wait_child(self, handle: ChildHandle) -> Any:
        """The child's output, parking until it ends; ChildFailed (catchable, with the
        child's reason) when it failed, was cancelled or timed out."""
        (outcome,) = self.wait_children([handle])
        assert outcome is not None
        return outcome.result()

    def wait_children(
        self, handles: Sequence[ChildHandle], count: int | None = None,
    ) -> list[ChildOutcome | None]:
        """Park until `count` of these children ended (default: all); their outcomes in
        the order of `handles`, None for a child still running (a quorum's wait).

        A failed child does not raise here: its outcome's `result()` does. The wait
        is one row whatever the number of children, woken once, when enough ended.
        """
        wanted = _checked_handles(handles)
        mine = {h.execution_id for h in self._kept}
        for handle in wanted:
            if handle.execution_id not in mine:
                raise InvalidArgument(f"wait_children: {handle.workflow_id!r} is not a child "
                                      "this run started")
        need = len(wanted) if count is None else count
        if isinstance(need, bool) or not isinstance(need, int) or not 1 <= need <= len(wanted):
            raise InvalidArgument(f"wait_children: count must be 1..{len(wanted)}, "
                                  f"got {count!r}")
        self._guard()
        position, recorded = self._replay.next("children", "children")
        self._replay_updates(recorded)
        ended = next((e for e in recorded if e.kind == Event.CHILDREN_ENDED), None)
        if ended is not None:
            for child, payload in ended.payload["outcomes"].items():
                self._outcomes[uuid.UUID(child)] = payload
            return self._outcomes_of(wanted)
        self._take_updates(position)
        ids = {h.execution_id for h in wanted}
        outcomes = self._outcomes
        arrived: list[tuple[uuid.UUID, BufferedSignal]] = []
        for signal in self._pending:  # each child id parsed once: a fan-in reads 10,000
            if signal.name == CHILD_SIGNAL:
                child = uuid.UUID(signal.payload["child"])
                if child in ids and child not in outcomes:
                    arrived.append((child, signal))
        have = sum(1 for h in wanted if h.execution_id in outcomes) + len(arrived)
        waiting = any(e.kind == Event.CHILDREN_WAITING for e in recorded)
        journal = self._journal
        if have >= need:
            taken: dict[str, Any] = {}
            for child, signal in arrived:
                taken[signal.payload["child"]] = signal.payload
                outcomes[child] = signal.payload
            self._take_all([signal for _, signal in arrived], position)
            journal.events.append(NewEvent(position, Event.CHILDREN_ENDED, "children",
                                           {"outcomes": taken}))
            journal.close_wait = journal.close_wait or waiting
            return self._outcomes_of(wanted)
        if not waiting:
            journal.events.append(NewEvent(position, Event.CHILDREN_WAITING, "children",
                                           {"count": need, "of": len(wanted)}))
        # `seen`: outcomes newer than what this turn's claim read count in the commit.
        seen = max((s.id for s in self._claim.signals), default=0)
        raise Park(state=State.WAITING, task=TaskAction.DELETE,
                   open_wait=OpenWait(position, "children", "children",
                                      request={"need": need - have, "seen": seen}))

    def _wait_for_kept(self) -> None:
        """Before a run completes: wait for its children of policy `wait` still running."""
        running = [h for h in self._kept if h.policy == "wait"
                   and h.execution_id not in self._outcomes]
        if running:
            self.wait_children(running)

    # -- helpers ---------------------------------------------------------------

    def _keep(self, handle: ChildHandle) -> ChildHandle:
        self._kept.append(handle)
        return handle

    def _take_all(self, arrived: Sequence[BufferedSignal], position: int) -> None:
        """Take these buffered outcomes for the wait at `position`, in one pass over the
        pending signals; the wait's `children.ended` event records their payloads."""
        taken = {signal.id for signal in arrived}
        self._pending[:] = [s for s in self._pending if s.id not in taken]
        self._journal.consumed.extend((signal.id, position) for signal in arrived)

    def _outcomes_of(self, wanted: Sequence[ChildHandle]) -> list[ChildOutcome | None]:
        outcomes = self._outcomes
        return [None if (payload := outcomes.get(h.execution_id)) is None
                else ChildOutcome.of(h, payload) for h in wanted]

    def _checked(self, requests: Sequence[ChildRequest]) -> list[tuple[ChildDefinition, str]]:
        """Each new child's definition and input JSON, checked before any is started."""
        checked = []
        found: dict[str, ChildDefinition] = {}  # a workflow looked up once per call
        for request in requests:
            if request.policy not in POLICIES:
                raise InvalidArgument(f"child {request.workflow_id!r}: policy must be one of "
                                      f"{', '.join(POLICIES)}, got {request.policy!r}")
            if self._registry is None:
                raise InvalidArgument("this context has no registry to start children from")
            definition = found.get(request.workflow)
            if definition is None:
                try:
                    definition = found[request.workflow] = self._registry.get(request.workflow)
                except UnknownWorkflow as exc:
                    raise InvalidArgument(f"child {request.workflow_id!r}: {exc}") from None
            if definition.concurrency_of(request.input) is not None:
                raise InvalidArgument(f"child {request.workflow_id!r}: a child run cannot "
                                      "have a concurrency key (docs/composition.md)")
            checked.append((definition, definition.checked_input(
                request.workflow_id, request.input, self._limits)))
        return checked

    def _start(self, request: ChildRequest, position: int, definition: ChildDefinition,
               input_json: str) -> ChildHandle:
        """The child the call at `position` starts: its handle, and its start for the
        turn's commit."""
        claim = self._claim
        bucket = bucket_for(claim.tenant, definition.name, request.workflow_id)
        child = child_execution_id(claim.execution_id, position, bucket)
        here = self._on_this_shard is not None and self._on_this_shard(child)
        self._journal.start_child(ChildStart(
            position, child, here, definition.name, definition.version, request.workflow_id,
            input_json, definition.priority, request.policy, definition.gates))
        return ChildHandle(child, definition.name, request.workflow_id, request.policy)

    def _record_starts(self, started: Sequence[tuple[int, ChildHandle]]) -> None:
        """The history of the children one call started: a `child.started` for one child,
        else one `children.started` for all of them (one row, not one per child: a
        fan-out of 10,000 wrote 10,000), read back by replay as a `child.started` each.

        Their positions follow each other: the call took consecutive positions, and
        what history recorded of it is a prefix (a recorded start the code no longer
        makes where it did diverges in replay.next before this)."""
        if not started:
            return
        first, handle = started[0]
        if len(started) == 1:
            self._journal.events.append(NewEvent(
                first, Event.CHILD_STARTED, handle.workflow_id,
                {"child": str(handle.execution_id), "workflow": handle.workflow,
                 "workflow_id": handle.workflow_id, "policy": handle.policy}))
            return
        assert all(p == first + i for i, (p, _) in enumerate(started)), started
        self._journal.events.append(NewEvent(first, Event.CHILDREN_STARTED, "children", {
            "child": [str(h.execution_id) for _, h in started],
            "workflow": [h.workflow for _, h in started],
            "workflow_id": [h.workflow_id for _, h in started],
            "policy": [h.policy for _, h in started]}))


def child_execution_id(parent: uuid.UUID, position: int, bucket: int) -> uuid.UUID:
    """The id of the child a parent starts at `position`: the same for every attempt of
    the turn, routed to `bucket` (the layout of shards/routing.py's new_execution_id,
    with the parent's creation time and a hash of (parent, position) as its random
    part)."""
    if not 0 <= bucket < BUCKETS:
        raise ValueError(f"bucket {bucket} is outside 0..{BUCKETS - 1}")
    digest = hashlib.sha256(parent.bytes + position.to_bytes(4, "big")).digest()
    rand = int.from_bytes(digest[:8], "big") & ((1 << 62) - 1)
    ms = parent.int >> 80
    return uuid.UUID(int=ms << 80 | 8 << 76 | bucket << 64 | 0b10 << 62 | rand)


def _handle_of(recorded: dict[str, Any]) -> ChildHandle:
    return ChildHandle(uuid.UUID(recorded["child"]), recorded["workflow"],
                       recorded["workflow_id"], recorded["policy"])


def _checked_handles(handles: Sequence[ChildHandle]) -> list[ChildHandle]:
    if isinstance(handles, (str, bytes)) or not isinstance(handles, Sequence) or not handles:
        raise InvalidArgument("wait_children takes a non-empty list of ChildHandle")
    if len(handles) > MAX_CHILDREN_BATCH:
        raise InvalidArgument(f"wait_children: at most {MAX_CHILDREN_BATCH} children, got "
                              f"{len(handles)}")
    seen: set[uuid.UUID] = set()
    for handle in handles:
        if not isinstance(handle, ChildHandle):
            raise InvalidArgument(f"wait_children takes ChildHandle items (from start_child), "
                                  f"got {type(handle).__name__}")
        if handle.execution_id in seen:
            raise InvalidArgument(f"wait_children: child {handle.workflow_id!r} given twice")
        seen.add(handle.execution_id)
    return list(handles)
