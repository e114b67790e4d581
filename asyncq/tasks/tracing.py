"""OpenTelemetry for tasks (extra ``asyncq[otel]``): a ``PRODUCER`` span per deferral and a ``CONSUMER`` span per
attempt, the attempt's a child of the deferral's through the W3C trace context carried in the job's body
(``"trace"``); an attempt's error is recorded on its span. Without ``opentelemetry-api`` installed, or with no
tracer provider configured, nothing is recorded and bodies carry nothing.

A deferral with a ``key`` carries no trace context: the same key and arguments must give the same body (a no-op,
not a ``Conflict``), and two deferrals' trace contexts differ. Its attempts' spans start a trace of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed: tracing is off
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

#: The body's member that carries the deferral's trace context.
TRACE_KEY = "trace"


class Tracing:
    """The spans of one ``App`` (its ``tracer_provider``, or OpenTelemetry's global one)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.tracer = None if trace is None else trace.get_tracer("asyncq", tracer_provider=tracer_provider)

    @contextmanager
    def deferring(self, task: str, queue: str, body: dict[str, Any], carry: bool) -> Iterator[Any]:
        """The deferral's span around the enqueue; with ``carry``, its context goes into ``body``."""
        if self.tracer is None:
            yield None
            return
        attributes = {"messaging.system": "asyncq", "messaging.destination.name": queue, "asyncq.task": task}
        kind = trace.SpanKind.PRODUCER
        with self.tracer.start_as_current_span(f"defer {task}", kind=kind, attributes=attributes) as span:
            if carry:
                carrier: dict[str, str] = {}
                propagate.inject(carrier)
                if carrier:
                    body[TRACE_KEY] = carrier
            yield span

    def attempt(self, task: str, body: dict[str, Any], job_id: str, queue: str, attempt: int) -> Any:
        """The attempt's span (a context manager), a child of the deferral's when the body carries its context.
        Exceptions raised inside are recorded on it and set its status to error."""
        if self.tracer is None:
            return nullcontext(None)
        carrier = body.get(TRACE_KEY)
        parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
        attributes: dict[str, str | int] = {
            "messaging.system": "asyncq",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "asyncq.task": task,
            "asyncq.attempt": attempt,
        }
        kind = trace.SpanKind.CONSUMER
        return self.tracer.start_as_current_span(f"run {task}", context=parent, kind=kind, attributes=attributes)
