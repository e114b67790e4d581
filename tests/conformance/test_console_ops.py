"""The console's actions through the port (``ConsoleStore.select``/``operate``) on every driver: each action moves
exactly its previewed set by the lifecycle's rules, fenced where a job is leased, with a job audit row per member
naming one operator audit entry (actor, role, note, filter, count, ids); a set that changed since its preview, a
unique key held, a job that moved are refused with nothing changed; the operator audit searched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from asyncq.core.jobs import AuditEntry
from asyncq.core.operations import (
    ADMIN,
    OPERATOR,
    AuditQuery,
    Operation,
    OperationEntry,
    queue_set,
    set_digest,
)
from asyncq.core.search import JobQuery
from asyncq.errors import SetChanged, UniqueConflict
from asyncq.store.port.queue import QueueStore

from .support import BOOM, T0, assert_no_transaction_left, claim, dump, enqueue, expect, new, outcome

pytestmark = pytest.mark.timeout(30)


async def preview(store: QueueStore, action: str, query: JobQuery) -> tuple[int, str, list[str]]:
    """What the console's preview finds: the count, the digest and the ids."""
    jobs = (await store.console().select(action, query, T0)).jobs
    members = [(job.seq, job.id, job.status, job.token) for job in jobs]
    return len(jobs), set_digest(action, members), [job.id for job in jobs]


def operation(action: str, query: JobQuery, count: int, digest: str, **more: object) -> Operation:
    return Operation(action, count, digest, "ada", more.pop("role", ADMIN), "bad-deploy", query, **more)  # type: ignore[arg-type]


async def mixed(store: QueueStore) -> None:
    """p1, p2 pending (mail); l1 leased (mail, live lease); d1 done; x1, x2 dead (permanent, with errors); w1 pending
    (web)."""
    await enqueue(store, *(new(job_id, queue="mail") for job_id in ("l1", "d1", "x1", "x2", "p1", "p2")))
    await enqueue(store, new("w1", queue="web"))
    _l1, d1, x1, x2 = await claim(store, "w9", T0, queue="mail", n=4, lease_ms=60_000)
    finishes = [outcome(d1, "ok"), outcome(x1, "permanent", error=BOOM), outcome(x2, "permanent", error=BOOM)]
    assert await store.finish(finishes, T0 + 1) == ["done", "dead", "dead"]


def audited(
    entry: OperationEntry, job_id: str, action: str, token: int, seq: int, reason: str | None = None
) -> AuditEntry:
    return AuditEntry(seq, job_id, action, token, entry.at_ms, "bad-deploy", reason, entry.seq)


async def test_a_bulk_redrive_moves_exactly_the_previewed_dead_jobs_and_audits_each(store: QueueStore) -> None:
    await mixed(store)
    before = await dump(store)
    count, digest, ids = await preview(store, "redrive", JobQuery(queue="mail"))
    assert (count, ids) == (2, ["x1", "x2"])
    entry = await store.console().operate(operation("redrive", JobQuery(queue="mail"), count, digest), T0 + 5)
    assert (entry.actor, entry.role, entry.action, entry.note, entry.count, entry.ids) == (
        "ada", ADMIN, "redrive", "bad-deploy", 2, ("x1", "x2"))  # fmt: skip
    assert (entry.filter, entry.digest, entry.outcome, entry.at_ms) == (
        {"queue": "mail"},
        digest,
        {"redriven": 2},
        T0 + 5,
    )
    after = await dump(store)
    rows = after.audit[len(before.audit) :]
    assert rows == [audited(entry, "x1", "redrive", 1, rows[0].seq), audited(entry, "x2", "redrive", 1, rows[1].seq)]
    moved = {
        job_id: replace(before.jobs[job_id], status="pending", attempts=0, available_at=T0 + 5,
                        deadline=T0 + 5 + 86_400_000, reason=None, redrives=1)
        for job_id in ("x1", "x2")
    }  # fmt: skip
    expect(before, after, moved, rows)
    assert await store.console().operations_by_seq([entry.seq]) == {entry.seq: entry}


async def test_a_set_that_changed_since_its_preview_is_refused_with_nothing_changed(store: QueueStore) -> None:
    await mixed(store)
    count, digest, _ids = await preview(store, "redrive", JobQuery())
    await store.redrive("x2", T0 + 2, T0 + 60_000, "someone-else")  # the set shrinks
    before = await dump(store)
    with pytest.raises(SetChanged, match="2 confirmed, 1 now"):
        await store.console().operate(operation("redrive", JobQuery(), count, digest), T0 + 5)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)
    count, digest, _ids = await preview(store, "cancel", JobQuery(queue="mail"))
    await claim(store, "w2", T0 + 3, queue="mail", n=1)  # p1 is leased now: same count, another state
    before = await dump(store)
    with pytest.raises(SetChanged, match="same count"):
        await store.console().operate(operation("cancel", JobQuery(queue="mail"), count, digest), T0 + 5)
    expect(before, await dump(store))


async def test_a_bulk_cancel_ends_pending_jobs_and_asks_the_holder_of_a_live_lease(store: QueueStore) -> None:
    await mixed(store)
    before = await dump(store)
    count, digest, ids = await preview(store, "cancel", JobQuery(queue="mail"))
    assert ids == ["l1", "p1", "p2"]
    entry = await store.console().operate(operation("cancel", JobQuery(queue="mail"), count, digest), T0 + 5)
    assert entry.outcome == {"cancelled": 2, "requested": 1, "requested before": 0}
    after = await dump(store)
    rows = after.audit[len(before.audit) :]
    assert [(row.id, row.action, row.op_seq) for row in rows] == [
        ("l1", "cancel_request", entry.seq), ("p1", "cancel", entry.seq), ("p2", "cancel", entry.seq)]  # fmt: skip
    assert after.jobs["l1"].status == "leased" and after.jobs["l1"].cancel_requested_at == T0 + 5  # fenced: asked
    assert {after.jobs[j].status for j in ("p1", "p2")} == {"dead"}


async def test_a_delete_removes_its_set_but_never_a_leased_job(store: QueueStore) -> None:
    await mixed(store)
    before = await dump(store)
    count, digest, ids = await preview(store, "delete", JobQuery(queue="mail"))
    assert ids == ["d1", "x1", "x2", "p1", "p2"]  # l1 is held by a worker: not in the set
    entry = await store.console().operate(operation("delete", JobQuery(queue="mail"), count, digest), T0 + 5)
    after = await dump(store)
    rows = after.audit[len(before.audit) :]
    assert rows == [
        audited(entry, job_id, "delete", before.jobs[job_id].token, row.seq)
        for job_id, row in zip(ids, rows, strict=True)
    ]
    expect(before, after, dict.fromkeys(ids), rows)
    assert (await store.get("x1")) is None and await store.history("x1") == [rows[1]]  # the audit row stays
    with pytest.raises(ValueError, match="role operator may not delete"):
        operation("delete", JobQuery(), 1, digest, role=OPERATOR).checked()


async def test_a_new_priority_is_given_to_pending_jobs_only(store: QueueStore) -> None:
    await mixed(store)
    before = await dump(store)
    query = JobQuery(status="pending")
    count, digest, ids = await preview(store, "priority", query)
    assert ids == ["p1", "p2", "w1"]
    entry = await store.console().operate(operation("priority", query, count, digest, priority=7), T0 + 5)
    assert entry.outcome == {"changed": 3}
    after = await dump(store)
    rows = after.audit[len(before.audit) :]
    changed = {job_id: replace(before.jobs[job_id], priority=7) for job_id in ids}
    expect(before, after, changed, rows)
    assert [(row.id, row.action) for row in rows] == [(job_id, "priority") for job_id in ids]
    [ticket] = await claim(store, "w2", T0 + 6, queue="web")
    assert ticket.priority == 7


async def test_a_bulk_redrive_meeting_a_held_unique_key_changes_nothing(store: QueueStore) -> None:
    await enqueue(store, new("k1", unique_key="nightly"))
    [ticket] = await claim(store, "w1", T0)
    assert await store.finish([outcome(ticket, "permanent")], T0 + 1) == ["dead"]
    await enqueue(store, new("k2", T0 + 2, unique_key="nightly"))  # holds the key now
    count, digest, _ids = await preview(store, "redrive", JobQuery())
    before = await dump(store)
    with pytest.raises(UniqueConflict):
        await store.console().operate(operation("redrive", JobQuery(), count, digest), T0 + 5)
    expect(before, await dump(store))
    await assert_no_transaction_left(store)


async def test_queues_pause_and_resume_in_bulk_each_with_its_queue_audit_row(store: QueueStore) -> None:
    console = store.console()
    await store.set_paused("web", True, T0, "earlier", "bob")
    states = await console.queue_states(["mail", "web", "jobs"])
    assert states == {"mail": None, "web": T0, "jobs": None}
    members = queue_set("pause", states)
    assert members == [("jobs", None), ("mail", None)]
    op = Operation(
        "pause", 2, set_digest("pause", members), "ada", OPERATOR, "incident-7", queues=("mail", "web", "jobs")
    )
    entry = await console.operate(op, T0 + 5)
    assert (entry.ids, entry.outcome, entry.filter) == (
        ("jobs", "mail"),
        {"paused": 2},
        {"queues": ["mail", "web", "jobs"]},
    )
    paused = {settings.queue: settings.paused_by for settings in await store.queue_settings() if settings.paused}
    assert paused == {"jobs": "ada", "mail": "ada", "web": "bob"}
    moves = await store.queue_audit(None, 10)
    assert [(move.queue, move.action, move.actor, move.note) for move in moves[:2]] == [
        ("mail", "pause", "ada", "incident-7"), ("jobs", "pause", "ada", "incident-7")]  # fmt: skip
    with pytest.raises(SetChanged):  # web is paused now by someone else: the resume set changed
        resume = queue_set("resume", {"web": T0 + 1})
        await console.operate(replace(op, action="resume", digest=set_digest("resume", resume), count=1,
                                      queues=("web",)), T0 + 6)  # fmt: skip


async def test_the_operator_audit_is_searched_by_actor_action_subject_and_note(store: QueueStore) -> None:
    await mixed(store)
    console = store.console()
    entries = []
    for n, (action, query) in enumerate([("redrive", JobQuery(ids=("x1",))), ("cancel", JobQuery(ids=("p1",))),
                                         ("redrive", JobQuery(ids=("x2",)))]):  # fmt: skip
        count, digest, _ids = await preview(store, action, query)
        op = Operation(action, count, digest, ("ada", "bob")[n % 2], OPERATOR, f"step {n} of the fix", query)
        entries.append(await console.operate(op, T0 + 10 + n))
    found, more = await console.operations(AuditQuery())
    assert found == entries[::-1] and more is None
    assert (await console.operations(AuditQuery(actor="ada")))[0] == [entries[2], entries[0]]
    assert (await console.operations(AuditQuery(action="cancel")))[0] == [entries[1]]
    assert (await console.operations(AuditQuery(subject="x2")))[0] == [entries[2]]
    assert (await console.operations(AuditQuery(text="step 1")))[0] == [entries[1]]
    assert (await console.operations(AuditQuery(text="STEP 1")))[0] == []
    page, more = await console.operations(AuditQuery(limit=1))
    assert page == [entries[2]] and more == entries[2].seq
    older, more = await console.operations(AuditQuery(actor="bob", before=entries[2].seq, limit=1, scan=1))
    assert older == [entries[1]] and more == entries[1].seq
    capped, more = await console.operations(AuditQuery(actor="ada", limit=5, scan=2))
    assert capped == [entries[2]] and more == entries[1].seq  # two looked at, the oldest not reached
    assert all(AuditQuery().matches(entry) for entry in entries)
