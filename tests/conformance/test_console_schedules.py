"""The console's actions on schedules (docs/schedules.md, docs/console.md) on every driver: a pause, resume or run now
of named schedules acts on the set its preview found (the running ones, the paused ones, the ones not retired), each
schedule moved by its own call's rule with its event under the operator's name, and one operator audit entry (the
schedules, the count, the jobs a run now enqueued); a set that changed since its preview is refused with nothing
changed."""

from __future__ import annotations

import pytest

from asyncq.core.operations import OPERATOR, Operation, OperationEntry
from asyncq.core.schedules import ScheduleSpec, run_now_job_id
from asyncq.errors import SetChanged
from asyncq.queue import Queue
from asyncq.queue.console import OperatorConsole, Preview
from asyncq.store.port.queue import QueueStore

from .support import T0, assert_no_transaction_left, dump, expect

pytestmark = pytest.mark.timeout(30)


async def act(console: OperatorConsole, preview: Preview, names: tuple[str, ...]) -> OperationEntry:
    operation = Operation(preview.action, preview.count, preview.digest, "ada", OPERATOR, "maintenance",
                          schedules=names)  # fmt: skip
    return await console.operate(operation)


async def schedules(store: QueueStore) -> tuple[Queue, OperatorConsole]:
    """``beat``, ``nightly`` (paused by bob) and ``gone`` (retired) in queue ``ops``; the console at T0 + 1 s."""
    queue = Queue(store, clock=lambda: T0)
    specs = [ScheduleSpec(name, {"s": name}, every=60, queue="ops") for name in ("beat", "nightly", "gone")]
    await queue.declare_schedules(specs, scope=["ops"])
    await queue.declare_schedules(specs[:2], scope=["ops"])  # gone is retired
    await queue.pause_schedule("nightly", note="backup window", by="bob")
    return queue, OperatorConsole(Queue(store, clock=lambda: T0 + 1000))


async def test_schedules_pause_and_resume_in_bulk_on_the_previewed_set(store: QueueStore) -> None:
    queue, console = await schedules(store)
    named = ("beat", "nightly", "gone", "missing")
    found = await console.preview("pause_schedule", schedules=named)
    assert (found.count, found.schedules) == (1, ("beat",))  # nightly is paused, gone retired, missing missing
    entry = await act(console, found, named)
    assert (entry.action, entry.ids, entry.count, entry.outcome, entry.filter) == (
        "pause_schedule", ("beat",), 1, {"paused": 1}, {"schedules": list(named)})  # fmt: skip
    stored = {schedule.name: schedule for schedule in await queue.schedules()}
    assert (stored["beat"].paused_by, stored["beat"].pause_note, stored["beat"].paused_at) == ("ada", "maintenance",
                                                                                                T0 + 1000)  # fmt: skip
    [event] = await queue.schedule_events("beat", limit=1)
    assert (event.kind, event.actor, event.note) == ("pause", "ada", "maintenance")
    resume = await console.preview("resume_schedule", schedules=named)
    assert resume.schedules == ("beat", "nightly")
    await queue.resume_schedule("nightly", note="done early", by="bob")  # the set changes under the preview
    before = await dump(store)
    events = await queue.schedule_events(limit=100)
    with pytest.raises(SetChanged):
        await act(console, resume, named)
    expect(before, await dump(store))
    assert await queue.schedule_events(limit=100) == events
    await assert_no_transaction_left(store)
    again = await console.preview("resume_schedule", schedules=named)
    assert (await act(console, again, named)).outcome == {"resumed": 1}
    assert not any(schedule.paused for schedule in await queue.schedules())


async def test_run_now_enqueues_a_job_of_each_live_schedule_and_names_them_in_the_audit(store: QueueStore) -> None:
    queue, console = await schedules(store)
    found = await console.preview("run_schedule", schedules=("gone", "nightly", "beat"))
    assert found.schedules == ("beat", "nightly")  # paused runs now too; retired does not
    entry = await act(console, found, ("gone", "nightly", "beat"))
    jobs = [run_now_job_id(name, T0 + 1000) for name in ("beat", "nightly")]
    assert entry.outcome == {"enqueued": 2} and entry.filter["jobs"] == jobs
    for name, job_id in zip(("beat", "nightly"), jobs, strict=True):
        job = await store.get(job_id)
        assert job is not None and (job.status, job.queue, job.body) == ("pending", "ops", {"s": name})
        [event] = await queue.schedule_events(name, limit=1)
        assert (event.kind, event.job_id, event.actor, event.note) == ("run_now", job_id, "ada", "maintenance")
    stored = {schedule.name: schedule for schedule in await queue.schedules()}
    assert stored["beat"].last_job == jobs[0] and stored["beat"].last_tick is None  # its ticks did not move
    assert await console.operations([entry.seq]) == {entry.seq: entry}
