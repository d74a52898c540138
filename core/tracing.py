"""OpenTelemetry spans, when `opentelemetry-api` is installed; nothing at all otherwise.

shardq emits spans for what a trace of a business process needs: a client's start
and signal, each turn of a run, each step, each batch commit, each outbox
delivery. A trace crosses processes and shards as a W3C `traceparent` kept in
the database beside what it describes: the run's row (its start), the signal's
row, the outbox row. A turn continues the trace of the signal that woke it (the
newest one it finds buffered) or, on its first claim, of its start; a relay's
delivery continues its outbox row's, and the signal it writes carries the
delivery's own. So one trace follows a webhook through a cross-shard signal into
the woken run (docs/operations.md, "Tracing").

Without the package every call here is a constant: `span` yields None and
`traceparent` is None, so nothing is written to the trace columns either. With
the API and no SDK provider set, the same: no span is made (`active`). The
tracer provider is the global one unless `use_provider` names another (tests).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError:  # the optional extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]
    otel_context = None  # type: ignore[assignment]

ENABLED = trace is not None
"""Whether opentelemetry-api is importable (the spans may still be non-recording)."""
_HAS_GLOBAL_SLOT = ENABLED and hasattr(trace, "_TRACER_PROVIDER")

_provider: Any = None

PRODUCER, CONSUMER, INTERNAL = "producer", "consumer", "internal"
CLIENT, SERVER = "client", "server"
_KINDS: dict[str, Any] = {
    PRODUCER: trace.SpanKind.PRODUCER, CONSUMER: trace.SpanKind.CONSUMER,
    CLIENT: trace.SpanKind.CLIENT, SERVER: trace.SpanKind.SERVER,
    INTERNAL: trace.SpanKind.INTERNAL} if ENABLED else {}


_tracers: dict[int, Any] = {}
"""The tracer of each provider used (by id; None's is the global one's proxy, which
follows a global provider set after it was made): getting one costs more than a span."""


def use_provider(provider: Any) -> None:
    """Spans from `provider` instead of the global tracer provider (None: the global one
    again). The global provider can be set once per process; tests need their own."""
    global _provider  # noqa: PLW0603 - one switch for the process, tests only
    _provider = provider
    _tracers.clear()


def active() -> bool:
    """Whether a span made now would record: callers that build attributes ask first."""
    return ENABLED and _configured()


def _configured() -> bool:
    """Whether spans can record: a provider was given (use_provider), or an SDK set the
    global one. With the API alone every span would be a non-recording one, still
    ~17 us a span to make: so none is made (measured, docs/operations.md)."""
    if _provider is not None:
        return True
    if _HAS_GLOBAL_SLOT:  # the API's own global: read without a call (hot path)
        return trace._TRACER_PROVIDER is not None
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _tracer() -> Any:
    tracer = _tracers.get(id(_provider))
    if tracer is None:
        tracer = _tracers[id(_provider)] = trace.get_tracer("shardq", tracer_provider=_provider)
    return tracer


def _kind(kind: str) -> Any:
    return _KINDS.get(kind, _KINDS[INTERNAL])


def _span_context(parent: str) -> Any:
    """The span a W3C traceparent names (`00-<trace>-<span>-<flags>`), or None when it
    names none. Parsed here, not by the API's propagator: a turn reads one for every
    claim, and the propagator's extract costs more than the span it parents."""
    parts = parent.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace.SpanContext(trace_id, span_id, is_remote=True,
                             trace_flags=trace.TraceFlags(flags & 0xFF))


def _context_of(parent: str | None) -> Any:
    if not parent:
        return None
    remote = _span_context(parent)
    return trace.set_span_in_context(trace.NonRecordingSpan(remote)) if remote else None


def span(name: str, *, kind: str = INTERNAL, attributes: dict[str, Any] | None = None,
         parent: str | None = None, links: Sequence[str | None] = ()) -> Any:
    """A span around the block (`with span(...) as s`), current inside it: a child of
    `parent` (a traceparent) when given, else of the current span. `links`:
    traceparents it also follows. An exception leaving the block is recorded on it
    and sets its status to error, as the API's `start_as_current_span` does."""
    if not ENABLED or not _configured():
        return nullcontext()
    return _Current(start_span(name, parent=parent, kind=kind, attributes=attributes,
                               links=links))


class _Current:
    """Makes a started span current for a block, and ends it after. What the API's
    `start_as_current_span` does, without its three layers of generator-based context
    managers: a worker makes two spans a run, and in one process a turn's span took
    22 us with them and 18.5 without (docs/operations.md, "Tracing")."""

    __slots__ = ("_span", "_token")

    def __init__(self, started: Any) -> None:
        self._span = started
        self._token: Any = None

    def __enter__(self) -> Any:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _: object) -> None:
        otel_context.detach(self._token)
        # Exception only, as the API: GeneratorExit and KeyboardInterrupt are no errors.
        if isinstance(error, Exception) and self._span.is_recording():
            self._span.record_exception(error)
            self._span.set_status(trace.Status(trace.StatusCode.ERROR,
                                               f"{type(error).__name__}: {error}"))
        self._span.end()


def start_span(name: str, *, parent: str | None = None, kind: str = INTERNAL,
               attributes: dict[str, Any] | None = None,
               links: Sequence[str | None] = ()) -> Any:
    """A span that is not made current (ended by `end`): for work that starts on one
    thread and ends on another, as a batch commit's. None when tracing is off."""
    if not ENABLED or not _configured():
        return None
    linked = [trace.Link(c) for c in map(_span_context, filter(None, links)) if c is not None]
    return _tracer().start_span(
        name, context=_context_of(parent), kind=_kind(kind),
        attributes={k: v for k, v in attributes.items() if v is not None} if attributes else None,
        links=linked)


def end(started: Any, error: BaseException | None = None) -> None:
    if started is None:
        return
    if error is not None:
        started.record_exception(error)
        started.set_status(trace.Status(trace.StatusCode.ERROR, str(error)[:200]))
    started.end()


def current_traceparent() -> str | None:
    """The current span's traceparent (traceparent's), None outside a recording one."""
    return traceparent(trace.get_current_span()) if ENABLED else None


def traceparent(of: Any) -> str | None:
    """The W3C traceparent of span `of`; None when there is no span (tracing off: `span`
    yielded None) or it is not recording: nothing worth keeping in the database."""
    if not ENABLED or of is None:
        return None
    span_context = of.get_span_context()
    if not span_context.is_valid or not of.is_recording():
        return None
    return (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{span_context.trace_flags:02x}")


class TraceIds(logging.Filter):
    """Adds `trace_id` and `span_id` to every record logged inside a recording span, so
    a log line and the trace it belongs to find each other."""

    def filter(self, record: logging.LogRecord) -> bool:
        if ENABLED:
            span_context = trace.get_current_span().get_span_context()
            if span_context.is_valid:
                record.trace_id = format(span_context.trace_id, "032x")
                record.span_id = format(span_context.span_id, "016x")
        return True
