"""Retention per terminal state on each driver (docs/flow-control.md, "Retention"): a queue's stored windows for
done, cancelled and other dead jobs, audited like a pause; the step that removes what is past them in bounded
batches, with the jobs' errors and results (audit rows stay), and never a row something still needs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from asyncq.core.flow import QueueSettings
from asyncq.core.jobs import StoredResult
from asyncq.core.retention import Removed, RetentionRule, Windows
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
    assert await store.remove_expired("mail", None, "done", T0 + 1, clock.now, 10) == 10  # one step: its batch
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
    rule = RetentionRule("mail", None, Windows(7 * DAY, None, DAY))
    expect(before, await dump(store), queues=[settings], queue_audit=[entry], retention=[rule])
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


# -- rules per task, per queue and one default ------------------------------------------------------------


def task_body(task: str) -> dict[str, Any]:
    return {"task": task, "args": {}}


async def end_task(store: QueueStore, queue: str, job_id: str, task: str | None, how: str, now: int) -> None:
    """``end`` for a job whose body names ``task`` (``None``: a plain body)."""
    body = task_body(task) if task is not None else {"id": job_id}
    await enqueue(store, new(job_id, now, queue=queue, body=body))
    [ticket] = await claim(store, "w1", now, queue=queue)
    assert await store.finish([outcome(ticket, how, error=BOOM if how == "permanent" else None)], now) == [
        "done" if how == "ok" else "dead"
    ]


async def test_the_narrowest_rule_applies_a_tasks_then_its_queues_then_the_default(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    jobs = [  # (queue, id, task, how)
        ("mail", "m-send", "send", "ok"),
        ("mail", "m-send-dead", "send", "permanent"),
        ("mail", "m-digest", "digest", "ok"),
        ("mail", "m-plain", None, "ok"),
        ("other", "o-send", "send", "ok"),
        ("other", "o-plain", None, "ok"),
        ("other", "o-dead", None, "permanent"),
    ]
    for name, job_id, task, how in jobs:
        await end_task(store, name, job_id, task, how, T0)
    await queue.set_default_retention(done=4 * 86_400, dead=4 * 86_400)  # other: none of its own
    await queue.set_retention("mail", done=2 * 86_400)  # mail's dead: kept for ever, the default replaced whole
    await queue.set_retention("mail", task="send", done=86_400, dead=86_400)
    clock.now = T0 + DAY + 1
    report = await queue.apply_retention()
    assert set(report.removed) == {Removed("mail", "done", 1, "send"), Removed("mail", "dead", 1, "send")}
    clock.now = T0 + 2 * DAY + 1
    report = await queue.apply_retention()
    assert set(report.removed) == {Removed("mail", "done", 1, None), Removed("mail", "done", 1, "digest")}
    clock.now = T0 + 4 * DAY + 1
    report = await queue.apply_retention()
    assert set(report.removed) == {
        Removed("other", "done", 1, None),
        Removed("other", "dead", 1, None),
        Removed("other", "done", 1, "send"),  # a task with no rule of its own in that queue: its queue's (default)
    }
    assert (await dump(store, clock.now)).jobs == {}


async def test_a_tasks_rule_that_keeps_for_ever_keeps_its_jobs_where_its_queue_removes_them(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    for n in range(3):
        await end_task(store, "mail", f"kept-{n}", "invoice", "ok", T0)
        await end_task(store, "mail", f"gone-{n}", "send", "ok", T0)
    await queue.set_retention("mail", done=0)
    await queue.set_retention("mail", task="invoice")  # every state kept for ever
    clock.now = T0 + 3650 * DAY
    assert (await queue.apply_retention()).removed == (Removed("mail", "done", 3, "send"),)
    assert set((await dump(store, clock.now)).jobs) == {f"kept-{n}" for n in range(3)}


async def test_rules_are_stored_and_audited_and_cleared_back_to_the_wider_rule(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await end_task(store, "mail", "sent", "send", "ok", T0)
    before = await dump(store)
    default = await queue.set_default_retention(done=30 * 86_400, note="keep a month", by="ops")
    task = await queue.set_retention("mail", task="send", done=60, by="ops")
    assert (default.queue, default.task, default.action, default.retention) == (
        "*",
        None,
        "retention",
        (30 * DAY, None, None),
    )
    assert (task.queue, task.task, task.action, task.note) == (
        "mail",
        "send",
        "retention",
        "retention done 1m, cancelled forever, dead forever",
    )
    rules = [RetentionRule(None, None, Windows(30 * DAY)), RetentionRule("mail", "send", Windows(60_000))]
    mail = QueueSettings("mail", None, None, None, None)  # a task's rule gives its queue a settings row
    expect(before, await dump(store), queues=[mail], queue_audit=[default, task], retention=rules)
    assert await queue.retention_rules() == rules
    assert await queue.queue_audit("*") == [default]
    clock.now = T0 + 61_000
    cleared = await queue.clear_retention("mail", task="send", note="back to the default", by="ops")
    assert (cleared.queue, cleared.task, cleared.action, cleared.retention) == (
        "mail",
        "send",
        "retention_clear",
        (None, None, None),
    )
    assert (await queue.apply_retention()).removed == ()  # the default's month applies again
    clock.now = T0 + 30 * DAY + 1
    assert (await queue.apply_retention()).removed == (Removed("mail", "done", 1, "send"),)
    gone = await queue.clear_default_retention(by="ops")
    assert (gone.queue, gone.action, gone.note) == ("*", "retention_clear", "retention cleared")
    assert await queue.retention_rules() == []


async def test_clearing_a_rule_that_is_not_there_is_refused_and_changes_nothing(store: QueueStore) -> None:
    queue = Queue(store, clock=lambda: T0)
    await queue.set_retention("mail", done=60)
    before = await dump(store)
    with pytest.raises(ValueError, match="task send in queue mail has no retention rule of its own"):
        await queue.clear_retention("mail", task="send")
    with pytest.raises(ValueError, match="every queue has no retention rule of its own"):
        await queue.clear_default_retention()
    with pytest.raises(ValueError, match="queue other has no retention rule"):
        await queue.clear_retention("other")
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q: q.set_retention("mail", task=7, done=1), TypeError),
        (lambda q: q.set_retention("mail", task="", done=1), ValueError),
        (lambda q: q.set_retention("mail", task=" send", done=1), ValueError),
        (lambda q: q.set_retention("mail", task="x" * 201, done=1), ValueError),
        (lambda q: q.set_retention("mail", task="send", done="1d"), ValueError),
        (lambda q: q.set_default_retention(dead=-1), ValueError),
        (lambda q: q.set_default_retention(done=1, note="two\nlines"), ValueError),
        (lambda q: q.clear_retention("not a name"), ValueError),
        (lambda q: q.clear_retention("mail", task=None, by=""), ValueError),
        (lambda q: q.clear_retention("mail", task=b"send"), TypeError),
        (lambda q: q.clear_default_retention(note=""), ValueError),
        (lambda q: q.queue_audit("*x"), ValueError),
    ],
)
async def test_bad_rules_are_refused_before_any_statement(store: QueueStore, call: Any, error: type[Exception]) -> None:
    queue = Queue(store, clock=lambda: T0)
    await queue.set_retention("mail", done=60)
    await end_task(store, "mail", "sent", "send", "ok", T0)
    before = await dump(store)
    with pytest.raises(error):
        await call(queue)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_the_groups_of_ended_jobs_and_a_step_of_one_group(store: QueueStore) -> None:
    """``ended_groups`` finds each queue's groups of done and dead jobs by task (none first), and only those;
    ``remove_expired`` removes one group's jobs only, at most its batch."""
    for n in range(4):
        await end_task(store, "mail", f"s{n}", "send", "ok", T0)
    await end_task(store, "mail", "p", None, "permanent", T0)
    await end_task(store, "mail", "d", "digest", "ok", T0)
    await end_task(store, "other", "o", "send", "ok", T0)
    await enqueue(store, new("waiting", queue="idle", body=task_body("send")))  # pending: no group
    expected = [("mail", None), ("mail", "digest"), ("mail", "send"), ("other", "send")]
    assert await store.ended_groups(None) == expected
    assert await store.ended_groups(["other", "idle", "none"]) == [("other", "send")]
    before = await dump(store)
    assert await store.remove_expired("mail", "send", "done", T0 + 1, T0 + 1, 3) == 3
    after = await dump(store)
    assert (
        sorted(set(before.jobs) - set(after.jobs)) == ["s0", "s1", "s2"][:3]
        or len(set(before.jobs) - set(after.jobs)) == 3
    )
    assert {job.task for job_id, job in before.jobs.items() if job_id not in after.jobs} == {"send"}
    assert await store.remove_expired("mail", None, "dead", T0 + 1, T0 + 1, 10) == 1
    assert await store.remove_expired("mail", None, "done", T0 + 1, T0 + 1, 10) == 0  # the plain group has no done
    assert await store.ended_groups(["mail"]) == [("mail", "digest"), ("mail", "send")]


async def test_a_queue_without_rules_is_not_looked_at_unless_a_default_exists(store: QueueStore) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    await end_task(store, "mail", "m", "send", "ok", T0)
    await end_task(store, "other", "o", None, "ok", T0)
    await queue.set_retention("mail", task="send", done=0)
    clock.now = T0 + DAY
    assert (await queue.apply_retention()).removed == (Removed("mail", "done", 1, "send"),)
    assert set((await dump(store, clock.now)).jobs) == {"o"}  # other: no rule, kept
    await queue.set_default_retention(done=0)
    assert (await queue.apply_retention()).removed == (Removed("other", "done", 1, None),)
