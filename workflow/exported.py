"""A run's recorded history as one JSON document: `shardq history export` writes it,
`shardq replay --file` and `shardq.workflow.replayer` read it.

The document is what a replay needs and what a reader of a test fixture wants to
see, nothing of a shard's layout: format version, the run's identity, its state,
input and (once ended) output or error, and its events in order:

    {"shardq_history": 1, "execution_id": "...", "tenant": "default",
     "workflow": "order", "workflow_version": 1, "workflow_id": "o-1",
     "state": "completed", "input": {...}, "output": 42, "error": null,
     "events": [{"seq": 1, "position": 0, "kind": "step.completed", "name": "charge",
                 "payload": {"result": "ch_1"}, "recorded_at": "2026-12-06T10:00:00+00:00"},
                ...]}

Reading one checks every field (a kept file may be edited by hand): a bad one is an
ExportError naming the field, never a replay of half a run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shardq.core.models import Event, Execution, HistoryEvent

FORMAT = 1


class ExportError(ValueError):
    """A document that is no exported history this version of shardq reads."""


@dataclass(frozen=True)
class RecordedRun:
    """A run as its history recorded it: what a replay check needs."""

    execution_id: uuid.UUID
    tenant: str
    workflow_name: str
    workflow_version: int
    workflow_id: str
    state: str
    input: Any
    history: tuple[HistoryEvent, ...]
    output: Any = None
    error: dict[str, Any] | None = None
    created_at: datetime | None = field(default=None, compare=False)
    finished_at: datetime | None = field(default=None, compare=False)

    @classmethod
    def of(cls, execution: Execution, history: tuple[HistoryEvent, ...]) -> RecordedRun:
        return cls(execution.id, execution.tenant, execution.workflow_name,
                   execution.workflow_version, execution.workflow_id, str(execution.state),
                   execution.input, history, execution.output, execution.error,
                   execution.created_at, execution.finished_at)


def to_document(run: RecordedRun) -> dict[str, Any]:
    return {
        "shardq_history": FORMAT,
        "execution_id": str(run.execution_id), "tenant": run.tenant,
        "workflow": run.workflow_name, "workflow_version": run.workflow_version,
        "workflow_id": run.workflow_id, "state": run.state, "input": run.input,
        "output": run.output, "error": run.error,
        "created_at": _iso(run.created_at), "finished_at": _iso(run.finished_at),
        "events": [{"seq": e.seq, "position": e.position, "kind": e.kind, "name": e.name,
                    "payload": e.payload, "recorded_at": _iso(e.recorded_at)}
                   for e in run.history],
    }


def dumps(run: RecordedRun) -> str:
    return json.dumps(to_document(run), indent=1, ensure_ascii=False) + "\n"


def loads(text: str) -> RecordedRun:
    """The run a document describes; ExportError when it is not one."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except ExportError:
        raise
    except ValueError as exc:
        raise ExportError(f"not JSON: {exc}") from None
    return from_document(doc)


def from_document(doc: Any) -> RecordedRun:
    if not isinstance(doc, Mapping):
        raise ExportError("an exported history is a JSON object")
    if doc.get("shardq_history") != FORMAT:
        raise ExportError(f"shardq_history must be {FORMAT} (the format this version reads), "
                          f"got {doc.get('shardq_history')!r}")
    events = doc.get("events")
    if not isinstance(events, list):
        raise ExportError("events must be a list")
    error = doc.get("error")
    if error is not None and not isinstance(error, Mapping):
        raise ExportError("error must be an object or null")
    return RecordedRun(
        _uuid(doc, "execution_id"), _text(doc, "tenant"), _text(doc, "workflow"),
        _int(doc, "workflow_version"), _text(doc, "workflow_id"), _text(doc, "state"),
        doc.get("input"), tuple(_event(e, i) for i, e in enumerate(events)),
        doc.get("output"), dict(error) if error is not None else None,
        _time(doc, "created_at"), _time(doc, "finished_at"))


def _event(doc: Any, index: int) -> HistoryEvent:
    if not isinstance(doc, Mapping):
        raise ExportError(f"events[{index}] must be an object")
    where = f"events[{index}]."
    position = doc.get("position")
    if position is not None and (isinstance(position, bool) or not isinstance(position, int)
                                 or position < 0):
        raise ExportError(f"{where}position must be a whole number >= 0 or null")
    payload = doc.get("payload")
    if not isinstance(payload, Mapping):
        raise ExportError(f"{where}payload must be an object")
    kind = _text(doc, "kind", where)
    if kind == Event.CHILDREN_STARTED:
        _batch_of_starts(payload, position, where)
    return HistoryEvent(_int(doc, "seq", where), position, kind,
                        _text(doc, "name", where), dict(payload), _time(doc, "recorded_at", where))


def _batch_of_starts(payload: Mapping[str, Any], position: int | None, where: str) -> None:
    """A `children.started` is read back a start per child (workflow/replay.py): a
    position, and four lists of as many non-empty strings."""
    if position is None:
        raise ExportError(f"{where}position must be set for children.started")
    lists = [payload.get(key) for key in ("child", "workflow", "workflow_id", "policy")]
    texts = all(isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
                for v in lists)
    if not texts or len({len(v) for v in lists}) != 1:  # type: ignore[arg-type]
        raise ExportError(f"{where}payload of children.started must hold child, workflow, "
                          "workflow_id and policy: lists of as many non-empty strings")


def _text(doc: Mapping[str, Any], key: str, where: str = "") -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ExportError(f"{where}{key} must be a non-empty string without NUL")
    return value


def _int(doc: Mapping[str, Any], key: str, where: str = "") -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExportError(f"{where}{key} must be a whole number >= 0")
    return value


def _uuid(doc: Mapping[str, Any], key: str) -> uuid.UUID:
    try:
        return uuid.UUID(_text(doc, key))
    except ValueError:
        raise ExportError(f"{key} must be a UUID") from None


def _time(doc: Mapping[str, Any], key: str, where: str = "") -> datetime | None:
    value = doc.get(key)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ExportError(f"{where}{key} must be an ISO 8601 time with its offset, or null")
    return parsed


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _no_constant(name: str) -> None:
    raise ExportError(f"not JSON: {name} is no JSON value")
