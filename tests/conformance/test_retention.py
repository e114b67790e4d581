"""Retention per terminal state on each driver (docs/flow-control.md, "Retention"): a queue's stored windows for
done, cancelled and other dead jobs, audited like a pause; the step that removes what is past them in bounded
batches, with the jobs' errors and results (audit rows stay), and never a row something still needs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from asyncq.core.flow import QueueSettings
from asyncq.core.jobs import StoredResult
from asyncq.core.retention import Removed
from asyncq.queue import Queue
from asyncq.store.port.queue import QueueStore

from .support import BOOM, T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(60)

DAY = 86_400_000


class Clock:
    """The facade's injected clock: tests move it."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


async def end(store: QueueStore, queue: str, job_id: str, how: str, now: int, **options: Any) -> None:
    """Enqueue ``job_id`` on ``queue`` (with no other job ready) and finish an attempt at ``now``: ``ok`` (done),
    ``permanent`` (dead), ``retry`` (pending again) or ``cancelled`` (dead, by ``Queue.cancel``)."""
    await enqueue(store, new(job_id, now, queue=queue))
    if how == "cancelled":
        assert (await Queue(store, clock=lambda: now).cancel(job_id, "customer left")).state == "cancelled"
        return
    [ticket] = await claim(store, "w1", now, queue=queue)
    finish = outcome(ticket, how, error=BOOM if how in ("permanent", "retry") else None)
    status = {"ok": "done", "retry": "pending"}.get(how, "dead")
    assert await store.finish([finish._replace(**options)], now) == [status]


async def test_each_state_keeps_its_own_window_and_none_keeps_for_ever(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    for result in ("ok", "permanent", "cancelled"):
        await end(store, "mail", f"old-{result}", result, T0)
        await end(store, "mail", f"new-{result}", result, T0 + 2 * DAY)
        await end(store, "other", f"elsewhere-{result}", result, T0)  # no retention on that queue
    await queue.set_retention("mail", done=86_400, cancelled=timedelta(days=3))  # dead: kept for ever
    clock.now = T0 + 3 * DAY - 1
    before = await dump(store, clock.now)
    report = await queue.apply_retention()
    assert report.removed == (Removed("mail", "done", 1),) and report.complete and report.total == 1
    assert report.by_state() == {"done": 1, "cancelled": 0, "dead": 0}
    expect(before, await dump(store, clock.now), {"old-ok": None})
    clock.now = T0 + 3 * DAY + 1
    report = await queue.apply_retention()
    assert report.removed == (Removed("mail", "done", 1), Removed("mail", "cancelled", 1))
    left = set((await dump(store, clock.now)).jobs)
    assert left == {"old-permanent", "new-permanent", "new-cancelled"} | {
        f"elsewhere-{r}" for r in ("ok", "permanent", "cancelled")
    }
    assert await store.history("old-cancelled") != []  # audit rows stay (as prune keeps them)


async def test_dead_jobs_are_kept_by_default_and_a_queue_never_set_keeps_everything(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await end(store, "mail", "dead-1", "permanent", T0)
    await end(store, "plain", "done-1", "ok", T0)
    entry = await queue.set_retention("mail", done=0)
    assert entry.retention == (0, None, None)
    clock.now = T0 + 3650 * DAY
    assert (await queue.apply_retention()).removed == ()
    assert set((await dump(store, clock.now)).jobs) == {"dead-1", "done-1"}


async def test_a_step_is_bounded_and_a_run_takes_several(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    rows = [new(f"j{i:02}", queue="mail") for i in range(25)]
    await enqueue(store, *rows)
    tickets = await claim(store, "w1", T0, queue="mail", n=25)
    assert await store.finish([outcome(t, "ok") for t in tickets], T0) == ["done"] * 25
    await queue.set_retention("mail", done=60)
    clock.now = T0 + 61_000
    assert await store.remove_expired("mail", "done", T0 + 1, clock.now, 10) == 10  # one step: at most its batch
    first = await queue.apply_retention(batch=4, max_batches=2)
    assert (first.removed, first.batches, first.complete) == ((Removed("mail", "done", 8),), 2, False)
    rest = await queue.apply_retention(batch=4)
    assert (rest.removed, rest.batches, rest.complete) == ((Removed("mail", "done", 7),), 2, True)
    assert (await dump(store, clock.now)).jobs == {}


async def test_active_rows_and_kept_results_are_never_removed(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await enqueue(store, new("held", queue="mail", ttl_ms=DAY))
    await claim(store, "w1", T0, queue="mail", lease_ms=DAY)
    await end(store, "mail", "answered", "ok", T0, result=StoredResult('"hello"', 2 * DAY))
    await end(store, "mail", "failed", "permanent", T0)
    await end(store, "mail", "retried", "retry", T0)  # pending again, with an error
    await enqueue(store, new("waiting", queue="mail"))
    await queue.set_retention("mail", done=0, dead=0, cancelled=0)
    clock.now = T0 + DAY
    before = await dump(store, clock.now, deep=False)  # a job's record carries its result, its listing does not
    report = await queue.apply_retention()
    assert report.removed == (Removed("mail", "dead", 1),)
    expect(before, await dump(store, clock.now, deep=False), {"failed": None})
    assert (await store.get("answered")) is not None and (await store.get("retried")) is not None
    clock.now = T0 + 2 * DAY + 1  # the result has expired: its job goes, with it
    assert (await queue.apply_retention()).removed == (Removed("mail", "done", 1),)
    left = await dump(store, clock.now)  # the errors and the result went with their jobs
    assert {job_id: job.status for job_id, job in left.jobs.items()} == {
        "waiting": "pending",
        "held": "leased",
        "retried": "pending",
    }


async def test_a_redriven_job_is_not_removed(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await end(store, "mail", "failed", "permanent", T0)
    await queue.set_retention("mail", dead=0)
    await queue.redrive("failed", "fixed the template")
    clock.now = T0 + DAY
    assert (await queue.apply_retention()).removed == ()
    assert (await store.get("failed")) is not None


async def test_set_retention_is_stored_and_audited(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    await queue.set_max_wait("mail", 60)
    before = await dump(store)
    entry = await queue.set_retention("mail", done=7 * 86_400, cancelled=86_400, note="GDPR: a week", by="ops")
    assert (entry.queue, entry.action, entry.at_ms, entry.actor, entry.note) == (
        "mail",
        "retention",
        T0,
        "ops",
        "GDPR: a week",
    )
    assert entry.retention == (7 * DAY, None, DAY)
    settings = QueueSettings("mail", None, None, None, 60_000, 7 * DAY, None, DAY)
    expect(before, await dump(store), queues=[settings], queue_audit=[entry])
    cleared = await queue.set_retention("mail")
    assert (
        cleared.retention == (None, None, None)
        and cleared.note == "retention done forever, cancelled forever, dead forever"
    )
    assert [move.action for move in await queue.queue_audit("mail")] == ["retention", "retention", "max_wait"]
    assert (await queue.queue_settings())[0].retention == (None, None, None)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"done": "7d"}, ValueError),
        ({"done": True}, ValueError),
        ({"dead": -1}, ValueError),
        ({"cancelled": float("nan")}, ValueError),
        ({"done": 3651 * 86_400}, ValueError),
        ({"note": ""}, ValueError),
        ({"by": "two\nlines"}, ValueError),
    ],
)
async def test_a_refused_set_retention_changes_nothing(
    store: QueueStore, arguments: dict[str, Any], error: type[Exception]
) -> None:
    queue = Queue(store, clock=lambda: T0)
    await end(store, "mail", "done-1", "ok", T0)
    before = await dump(store)
    with pytest.raises(error):
        await queue.set_retention("mail", **arguments)
    with pytest.raises(ValueError):
        await queue.set_retention("not a name", done=1)
    with pytest.raises(ValueError):
        await queue.apply_retention(batch=0)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_a_job_the_sweep_parked_is_dated_by_its_deadline(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await enqueue(store, new("late", queue="mail", ttl_ms=10_000))
    assert await claim(store, "w1", T0 + 20_000, queue="mail") == []  # swept: dead, reason deadline, at T0 + 10 s
    parked = await store.get("late")
    assert parked is not None and (parked.status, parked.reason) == ("dead", "deadline")
    await queue.set_retention("mail", dead=60)
    clock.now = T0 + 70_000  # 70 s after it became ready, 60 s after its deadline: not yet past its window
    assert (await queue.apply_retention()).removed == ()
    clock.now = T0 + 70_001
    assert (await queue.apply_retention()).removed == (Removed("mail", "dead", 1),)
