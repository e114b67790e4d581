"""Tasks' OpenTelemetry spans (the SDK's in-memory exporter, a provider of the test's own) and structured log
fields, on a real temporary store with a real worker pool."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import asyncq
from asyncq.tasks import TaskLogFilter
from asyncq.testing import drain, queue_clock, temporary_queue

pytestmark = pytest.mark.timeout(30)

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
app = asyncq.App(tracer_provider=provider)
log = logging.getLogger("tests.telemetry")


@app.task(queue="traced", max_attempts=2)
async def greet(name: str) -> str:
    log.warning("greeting %s", name)
    if name == "bad":
        raise RuntimeError("no greeting for bad")
    return f"hello {name}"


@pytest.fixture(autouse=True)
def fresh_spans() -> Iterator[None]:
    exporter.clear()
    yield
    exporter.clear()


async def test_the_attempts_span_is_a_child_of_the_deferrals() -> None:
    async with temporary_queue() as queue:
        job = await greet.defer(queue, "ada")
        stored = await job.get()
        assert stored is not None and "traceparent" in stored.body["trace"]
        assert [r.value for r in await drain(app, queue)] == ["hello ada"]
    defer, run = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
    assert (defer.name, defer.kind, run.name, run.kind) == (
        "defer greet",
        SpanKind.PRODUCER,
        "run greet",
        SpanKind.CONSUMER,
    )
    assert run.parent is not None and defer.context is not None and run.context is not None
    assert run.parent.span_id == defer.context.span_id and run.context.trace_id == defer.context.trace_id
    assert defer.attributes is not None and defer.attributes["messaging.message.id"] == job.id
    assert run.attributes is not None and run.attributes["asyncq.attempt"] == 1
    assert run.attributes["messaging.destination.name"] == "traced"
    assert run.status.status_code is not StatusCode.ERROR


async def test_each_attempts_error_is_recorded_on_its_span() -> None:
    async with temporary_queue() as queue:
        await greet.defer(queue, "bad")
        await drain(app, queue)
        queue_clock(queue).advance(3600)
        await drain(app, queue)
    runs = [span for span in exporter.get_finished_spans() if span.name == "run greet"]
    assert [span.attributes["asyncq.attempt"] for span in runs if span.attributes] == [1, 2]
    for span in runs:
        assert span.status.status_code is StatusCode.ERROR
        [event] = [event for event in span.events if event.name == "exception"]
        assert event.attributes is not None and event.attributes["exception.message"] == "no greeting for bad"


async def test_a_keyed_deferral_carries_no_trace_so_the_same_call_stays_a_no_op() -> None:
    async with temporary_queue() as queue:
        first = await greet.using(key="k1").defer(queue, "ada")
        again = await greet.using(key="k1").defer(queue, "ada")
        assert first.added and not again.added
        stored = await first.get()
        assert stored is not None and "trace" not in stored.body
    assert [span.name for span in exporter.get_finished_spans()] == ["defer greet", "defer greet"]


class JsonLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.addFilter(TaskLogFilter())
        self.setFormatter(logging.Formatter())

    def emit(self, record: logging.LogRecord) -> None:
        names = ("job_id", "task", "queue", "attempt", "outcome")
        self.lines.append(json.dumps({"message": record.getMessage()} | {n: getattr(record, n) for n in names}))


async def test_log_records_carry_the_jobs_fields_for_a_json_formatter() -> None:
    handler = JsonLines()
    for name in ("asyncq.tasks", "tests.telemetry"):
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("asyncq.tasks").setLevel(logging.DEBUG)
    try:
        async with temporary_queue() as queue:
            ok = await greet.defer(queue, "ada")
            bad = await greet.defer(queue, "bad")
            await drain(app, queue)
            log.warning("outside any task")
    finally:
        for name in ("asyncq.tasks", "tests.telemetry"):
            logging.getLogger(name).removeHandler(handler)
        logging.getLogger("asyncq.tasks").setLevel(logging.NOTSET)
    records = [json.loads(line) for line in handler.lines]
    by_job = {(r["job_id"], r["outcome"], r["message"].split(" ")[0]) for r in records}
    assert (ok.id, None, "greeting") in by_job and (ok.id, "ok", "task") in by_job
    assert (bad.id, None, "greeting") in by_job and (bad.id, "error", "task") in by_job
    for record in records[:-1]:
        assert (record["task"], record["queue"], record["attempt"]) == ("greet", "traced", 1)
    assert records[-1] == {"message": "outside any task"} | dict.fromkeys(
        ("job_id", "task", "queue", "attempt", "outcome")
    )
