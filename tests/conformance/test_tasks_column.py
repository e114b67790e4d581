"""A job's ``task`` column through the port: set at enqueue from a task's body (``{"task": name, "args": {…}}``,
``core.jobs.task_of``), ``None`` for every other body; read back by ``get`` and listings (``Job.task``); the same
id and body again is ``False`` (the column is derived, never compared), also for a row stored without it. The
migration from the previous version keeps its rows (``task`` ``None``) on each store's own test below."""

from __future__ import annotations

from typing import Any

import pytest

from asyncq import App, JobSpec, Queue
from asyncq.core.jobs import task_of
from asyncq.store.port.queue import JobFilter, QueueStore

from .support import T0, claim, dump, expect, new, outcome, stored

pytestmark = pytest.mark.timeout(30)

#: Bodies and the task each names.
BODIES: list[tuple[Any, str | None]] = [
    ({"task": "send", "args": {"to": "a@b"}}, "send"),
    ({"task": "reports.daily", "args": {}}, "reports.daily"),
    ({"task": "é-送信 x", "args": {"n": 1}}, "é-送信 x"),
    ({"task": "x" * 200, "args": {}}, "x" * 200),
    ({"task": "x" * 201, "args": {}}, None),  # longer than a task name
    ({"task": " send", "args": {}}, None),  # leading whitespace: not a task name
    ({"task": "line\nbreak", "args": {}}, None),
    ({"task": "", "args": {}}, None),
    ({"task": 7, "args": {}}, None),
    ({"task": "send", "args": [1]}, None),  # args not an object
    ({"task": "send"}, None),  # no args
    ({"task": "send", "args": {}, "trace": {"traceparent": "00-ab-cd-01"}}, "send"),  # a traced deferral's
    ({"name": "send", "args": {}}, None),
    (["send", {}], None),
    ("send", None),
    (None, None),
]


def test_task_of_names_the_task_of_a_tasks_body_only() -> None:
    assert [task_of(body) for body, _ in BODIES] == [name for _, name in BODIES]


async def test_a_tasks_body_sets_the_jobs_task_and_any_other_body_none(store: QueueStore) -> None:
    rows = [new(f"j{n}", body=body) for n, (body, _) in enumerate(BODIES)]
    before = await dump(store)
    assert await store.enqueue(rows) == [True] * len(rows)
    after = await dump(store)
    expect(before, after, {row.id: stored(row, after.jobs[row.id].seq) for row in rows})
    assert [after.jobs[row.id].task for row in rows] == [name for _, name in BODIES]
    listed = await store.list_jobs(JobFilter(limit=100, newest=True, body=False))
    assert {job.id: job.task for job in listed} == {row.id: name for row, (_, name) in zip(rows, BODIES, strict=True)}


async def test_the_task_stays_through_the_lifecycle_and_the_same_body_again_is_the_same_job(store: QueueStore) -> None:
    body = {"task": "send", "args": {"to": "a@b"}}
    await store.enqueue([new("t", body=body), new("other", body={"task": "send", "args": {"to": "c@d"}})])
    [ticket, _] = await claim(store, "w1", T0, n=2)
    assert await store.finish([outcome(ticket, "retry", 10)], T0 + 1) == ["pending"]
    before = await dump(store)
    assert await store.enqueue([new("t", T0 + 5, body=body)]) == [False]
    expect(before, await dump(store))
    job = await store.get("t")
    assert job is not None and (job.status, job.task) == ("pending", "send")


async def test_a_deferred_task_and_a_facade_enqueue_store_the_task(store: QueueStore) -> None:
    app = App()

    @app.task(queue="mail", name="mail.send")
    async def send(to: str) -> None: ...

    queue = Queue(store, clock=lambda: T0)
    handle = await send.defer(queue, to="a@b")
    await queue.enqueue("plain", {"n": 1})
    await queue.enqueue_many([JobSpec("spec", {"task": "mail.send", "args": {"to": "x"}}, "mail")])
    found = [await store.get(job_id) for job_id in (handle.id, "plain", "spec")]
    assert [job.task if job else "missing" for job in found] == ["mail.send", None, "mail.send"]
