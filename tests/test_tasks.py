"""The task layer (``asyncq.App``, ``@app.task``, ``defer``) on a real temporary store, through ``asyncq.testing``:
routing by name, keys, delays, transactions, ``defer_sync``, validation at defer and again in the worker."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from drivers import DRIVERS, Driver
from pydantic import BaseModel

import asyncq
from asyncq.tasks import current
from asyncq.testing import (
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued,
    queue_clock,
    temporary_queue,
)

pytestmark = pytest.mark.timeout(30)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Order(BaseModel):
    id: uuid.UUID
    total: decimal.Decimal
    placed: datetime.datetime
    lines: list[Point]


app = asyncq.App()
calls: list[tuple[str, Any]] = []


@app.task(queue="emails", max_attempts=5)
async def send_email(to: str, subject: str, *, urgent: bool = False) -> str:
    calls.append(("send_email", (to, subject, urgent)))
    return f"sent {subject} to {to}"


@app.task(queue="emails")
async def send_digest(to: str) -> int:
    calls.append(("send_digest", to))
    await send_email.defer(current().queue, to=to, subject="digest")
    return 1


@app.task(queue="orders")
async def record(order: Order, color: Color, point: Point, when: datetime.date, data: dict[str, list[int]]) -> None:
    calls.append(("record", (order, color, point, when, data)))


@app.task(queue="orders", max_attempts=2)
async def flaky(n: int) -> None:
    raise RuntimeError(f"flaky {n}")


ORDER = Order(
    id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    total=decimal.Decimal("10.25"),
    placed=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    lines=[Point(1, 2), Point(3, 4)],
)


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    """Each driver of the registry (PostgreSQL's tests skip, or fail under CI, when the server does not answer)."""
    return DRIVERS[request.param].prepare(request)


@pytest.fixture
async def queue(driver: Driver, tmp_path: Path) -> AsyncIterator[asyncq.Queue]:
    """A temporary queue of the driver: a SQLite file, or a fresh PostgreSQL schema dropped after the test."""
    calls.clear()
    async with driver.target(tmp_path, "queue") as where, temporary_queue(where) as opened:
        yield opened


async def rows(queue: asyncq.Queue) -> list[tuple[str, Any, str]]:
    return [(job.id, job.body, job.status) for job in await queue.list_jobs(limit=1000)]


async def test_many_tasks_share_a_queue_and_each_job_runs_its_own_task(queue: asyncq.Queue) -> None:
    first = await send_email.defer(queue, to="a@b.example", subject="hi")
    second = await send_digest.defer(queue, "c@d.example")
    assert first.added and second.added and first.id != second.id
    ran = await drain(app, queue)
    # the digest's own deferral ran too, in the same drain
    assert sorted((r.task, r.value) for r in ran) == [
        ("send_digest", 1),
        ("send_email", "sent digest to c@d.example"),
        ("send_email", "sent hi to a@b.example"),
    ]
    assert {job.status for job in await queue.list_jobs()} == {"done"}


async def test_a_name_registered_twice_is_an_error_and_the_first_stays() -> None:
    other = asyncq.App()

    @other.task
    async def ping() -> None: ...

    with pytest.raises(ValueError, match="'ping' is registered already"):

        @other.task(queue="elsewhere")
        async def ping() -> None: ...  # the point of the test

    assert list(other.tasks) == ["ping"] and other.tasks["ping"].queue == "default"


def test_a_task_must_be_async_and_take_named_arguments() -> None:
    other = asyncq.App()
    with pytest.raises(TypeError, match="async function"):
        other.task(lambda: None)  # type: ignore[arg-type, return-value]

    async def variadic(*args: int) -> None: ...

    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs"):
        other.task(variadic)
    assert other.tasks == {}


async def test_models_dataclasses_dates_uuids_decimals_enums_and_json_round_trip(queue: asyncq.Queue) -> None:
    data = {"a": [1, 2], "b": []}
    when = datetime.date(2026, 3, 4)
    await record.defer(queue, ORDER, Color.BLUE, Point(5, 6), when, data)
    job = await assert_enqueued(queue, record, color=Color.BLUE, point=Point(5, 6))
    assert job.body["args"]["order"]["total"] == "10.25"  # JSON, in pydantic's JSON mode
    ran = await drain(app, queue)
    assert [r.ok for r in ran] == [True]
    assert calls == [("record", (ORDER, Color.BLUE, Point(5, 6), when, data))]
    kinds = calls[0][1]
    assert type(kinds[0].total) is decimal.Decimal and type(kinds[0].id) is uuid.UUID
    assert kinds[0].placed.tzinfo is not None and type(kinds[2]) is Point


BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("str-for-int", (), {"to": 5, "subject": "x"}, "to: Input should be a valid string"),
    ("missing", (), {"to": "a@b.example"}, "missing a required argument: 'subject'"),
    ("unknown", (), {"to": "a", "subject": "b", "cc": "c"}, "unexpected keyword argument 'cc'"),
    ("bool-field", (), {"to": "a", "subject": "b", "urgent": "maybe"}, "urgent: Input should be a valid boolean"),
    ("too-many", ("a", "b", "c"), {}, "too many positional arguments"),
]


@pytest.mark.parametrize(("label", "args", "kwargs", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
async def test_a_bad_argument_raises_at_defer_naming_the_field_and_writes_nothing(
    queue: asyncq.Queue, label: str, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    await send_email.defer(queue, to="x@y.example", subject="before")
    before = await rows(queue)
    with pytest.raises(asyncq.InvalidArguments, match=message) as caught:
        await send_email.defer(queue, *args, **kwargs)
    assert isinstance(caught.value, ValueError) and caught.value.task == "send_email"
    assert await rows(queue) == before


async def test_a_bad_nested_field_is_named_by_its_path(queue: asyncq.Queue) -> None:
    bad = ORDER.model_dump() | {"lines": [{"x": 1, "y": "two"}]}
    with pytest.raises(asyncq.InvalidArguments) as caught:
        await record.defer(queue, bad, "green", Point(1, 1), datetime.date(2026, 1, 1), {})  # type: ignore[arg-type]
    fields = [field for field, _message in caught.value.problems]
    assert fields == ["order.lines.0.y", "color"]
    assert await rows(queue) == []


async def test_a_bad_argument_inside_a_transaction_rolls_back_the_apps_rows_too(queue: asyncq.Queue) -> None:
    async with queue.transaction() as tx:
        await tx.execute("CREATE TABLE signups (email TEXT)")
    with pytest.raises(asyncq.InvalidArguments):
        async with queue.transaction() as tx:
            await tx.execute("INSERT INTO signups VALUES ('a@b.example')")
            await send_email.defer(tx, to=None, subject="welcome")  # type: ignore[arg-type]
    async with queue.transaction() as tx:
        assert await tx.execute("SELECT count(*) FROM signups") == [(0,)]
    assert await rows(queue) == []


async def test_same_key_same_arguments_is_a_no_op_other_arguments_a_conflict(queue: asyncq.Queue) -> None:
    first = await send_email.using(key="welcome-42").defer(queue, to="a@b.example", subject="hi")
    # the default written out is the same call
    again = await send_email.using(key="welcome-42").defer(queue, "a@b.example", "hi", urgent=False)
    assert first.id == again.id == "welcome-42" and first.added and not again.added
    before = await rows(queue)
    with pytest.raises(asyncq.Conflict):
        await send_email.using(key="welcome-42").defer(queue, to="a@b.example", subject="other")
    assert await rows(queue) == before and len(before) == 1


async def test_without_a_key_every_deferral_is_its_own_job(queue: asyncq.Queue) -> None:
    jobs = [await send_email.defer(queue, to="a@b.example", subject="hi") for _ in range(3)]
    assert len({job.id for job in jobs}) == 3 and all(job.added for job in jobs)
    assert len(await enqueued(queue, send_email, to="a@b.example", subject="hi")) == 3


async def test_a_delay_is_honoured_and_the_movable_clock_makes_it_ready(queue: asyncq.Queue) -> None:
    await send_email.using(delay=60.0).defer(queue, to="later@b.example", subject="hi")
    assert await drain(app, queue) == []
    await assert_enqueued(queue, send_email, to="later@b.example")
    queue_clock(queue).advance(60)
    assert [r.task for r in await drain(app, queue)] == ["send_email"]
    await assert_not_enqueued(queue, send_email, to="later@b.example")


async def test_a_failing_task_is_retried_after_its_backoff_and_ends_dead_with_its_error(queue: asyncq.Queue) -> None:
    job = await flaky.defer(queue, 7)
    first = await drain(app, queue)
    assert [(r.attempt, str(r.error)) for r in first] == [(1, "flaky 7")]
    assert await drain(app, queue) == []  # its retry waits for its backoff
    queue_clock(queue).advance(3600)
    assert [r.attempt for r in await drain(app, queue)] == [2]
    stored = await job.get()
    assert stored is not None and stored.status == "dead" and stored.reason == "exhausted"
    assert stored.last_error is not None and stored.last_error.message == "flaky 7"


async def test_a_job_that_no_longer_fits_its_task_is_refused_as_permanent_with_the_reason(queue: asyncq.Queue) -> None:
    # written by an older version of send_email: another parameter, and no subject
    await queue.enqueue("old", {"task": "send_email", "args": {"to": "a@b.example", "cc": 1}}, queue="emails")
    await queue.enqueue("gone", {"task": "no_such_task", "args": {}}, queue="emails")
    ran = await drain(app, queue)
    assert calls == [] and sorted((r.job_id, r.task, r.ok) for r in ran) == [
        ("gone", "no_such_task", False),
        ("old", "send_email", False),
    ]
    old, gone = await queue.get("old"), await queue.get("gone")
    assert old is not None and old.status == "dead" and old.reason == "permanent" and old.attempts == 1
    assert old.last_error is not None and "cc: unexpected argument" in old.last_error.message
    assert "subject: missing" in old.last_error.message
    assert gone is not None and gone.reason == "permanent" and gone.last_error is not None
    assert "no task named 'no_such_task'" in gone.last_error.message


async def test_defer_sync_joins_the_callers_sqlite_transaction(tmp_path: Any) -> None:
    path = tmp_path / "app.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE signups (email TEXT)")
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO signups VALUES ('a@b.example')")
    job_id = send_email.defer_sync(con, to="a@b.example", subject="hi")
    con.execute("ROLLBACK")  # the job goes with the app's row
    with pytest.raises(asyncq.InvalidArguments, match="subject"):
        send_email.defer_sync(con, to="a@b.example")  # type: ignore[call-arg]
    kept = send_email.using(key="sync-1").defer_sync(con, to="a@b.example", subject="hi")
    con.close()
    async with asyncq.open(path) as queue:
        assert await queue.get(job_id) is None
        assert [job.id for job in await queue.list_jobs()] == [kept] == ["sync-1"]
        assert [r.value for r in await drain(app, queue)] == ["sent hi to a@b.example"]


async def test_defer_refuses_a_target_that_is_not_a_queue(queue: asyncq.Queue) -> None:
    with pytest.raises(TypeError, match="Queue or a queue's Transaction"):
        await send_email.defer("app.db", to="a", subject="b")  # type: ignore[arg-type]
    assert await rows(queue) == []


def test_using_checks_its_options_before_anything() -> None:
    with pytest.raises(ValueError, match="key"):
        send_email.using(key="no spaces allowed")
    with pytest.raises(ValueError, match="max_attempts"):
        send_email.using(max_attempts=0)


async def test_open_is_one_async_with_and_closes_the_queue(tmp_path: Any) -> None:
    async with asyncq.open(tmp_path / "q.db") as queue:
        await send_email.defer(queue, to="a", subject="b")
    with pytest.raises(Exception):  # noqa: B017 - closed: any use fails
        await queue.stats()
    async with asyncq.open(tmp_path / "q.db") as queue:
        assert (await queue.stats()).by_status.get("pending") == 1


def test_the_labs_and_a_bare_import_load_no_pydantic() -> None:
    """``import asyncq.lab.lease`` stays standard-library only, and ``import asyncq`` loads the task layer (and
    pydantic, opentelemetry) only when a task name is first used."""
    import subprocess
    import sys

    probe = (
        "import sys, asyncq.lab.lease, asyncq; assert 'pydantic' not in sys.modules, 'lab';"
        " assert 'asyncq.tasks' not in sys.modules, 'bare'; asyncq.App; assert 'pydantic' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["", " send", "x" * 201, "a\tb"])
def test_a_task_whose_name_no_job_could_store_is_refused_when_declared(name: str) -> None:
    """A task's name is what its jobs' ``task`` column holds (``core.values.check_task_name``)."""
    other = asyncq.App()

    async def send() -> None: ...

    with pytest.raises(ValueError, match="task's name must be 1-200 printable characters"):
        other.task(name=name)(send)
    with pytest.raises(TypeError, match="task's name must be a str"):
        other.task(name=7)(send)  # type: ignore[arg-type]
    assert other.tasks == {}
