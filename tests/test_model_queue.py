"""The product ``Queue`` against a plain-Python model (``queue_model``), one Hypothesis state machine.

Rules: enqueue (one job and batches) with the same and other bodies, claims by several owners on two queues,
finishes with fresh, stale and forged tickets (one and many), extend, release, redrive, cancel, the clock jumping
forward and backward by powers of 4 ms up to 262 s, an app transaction that enqueues and then raises (nothing
of it lands) or commits, close and reopen. After every step every column of every row of ``asyncq_jobs``,
``asyncq_audit`` and the app's table, read through a fresh ``sqlite3`` connection, must equal the model, and no
write lock may be held. The queue runs on a real file (WAL, ``durability="normal"``: the lifecycle is the same at
every level, and no fsync per step keeps the run short). A new row's ``seq`` is taken from the file once (above
every earlier one, in insertion order: ``Model.adopt``) and compared exactly from then on.

The queue is async and the rules are sync: each machine drives it with its own event loop. The size is
``ASYNCQ_MODEL_EXAMPLES`` examples of ``ASYNCQ_MODEL_STEPS`` steps (CI: 150 × 40); a failure prints the
``@reproduce_failure`` blob.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import astuple, replace
from typing import Any

import pytest
from conformance.sqlite_files import assert_counts_kept
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from queue_model import Model, Row, Spec, canonical

from asyncq import Conflict, JobSpec, Queue, Ticket

T0 = 1_700_000_000_000
IDS = ("a", "b", "c", "d", "e", "f", "g", "h")
HOME = {job_id: "q2" if job_id in "gh" else "default" for job_id in IDS}
QUEUES = ("default", "default", "default", "q2")  # claims: repeats weight the draw
OWNERS = ("w1", "w2", "w3")
NOTES = ("ops", "fixed")
OUTCOMES = ("ok", "retry", "permanent")
# How an enqueue's payload relates to its id's usual one: the same, the same with its keys in another order (the
# same body), another body (Conflict; 1 and 1.0 differ) or another queue (Conflict too).
VARIANTS = ("same",) * 8 + ("reordered", "other-body", "other-queue")
OTHER_BODIES = (1, 1.0, "text", {"tags": [2, 1]})
# ±4 ms … ±262144 ms; forward twice as often, so that leases and deadlines run out.
JUMPS = (0, 1, *(4**k for k in range(1, 10)), *(4**k for k in range(1, 10)), *(-(4**k) for k in range(1, 10)))
LEASES = (1, 4, 16, 64, 256, 1024, 4096, 65536, 65536, 262144, 3_600_000)
# Repeats weight the draw: most jobs live long enough to be claimed and finished, most are due at once.
TTLS = (4, 64, 1024, 16384, 262144, 262144, 86_400_000, 86_400_000, 86_400_000)
DELAYS = (0,) * 7 + (16, 1024, 65536)  # over the ttl: ValueError, nothing changes
FORGERIES = ("token", "owner", "attempt", "lease_until", "deadline", "seq")
JOB_COLUMNS = (
    "seq, id, queue, body, status, attempts, max_attempts, token, available_at, deadline, owner, lease_until, reason,"
    " cancel_requested_at, priority, unique_key, task, limit_key"
)
AUDIT_COLUMNS = "seq, id, token, at_ms, note, action, reason"


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    """A job to enqueue; mostly its id's usual payload, so that most jobs get claimed, sometimes a conflicting one."""
    job_id, variant = draw(st.sampled_from(IDS)), draw(st.sampled_from(VARIANTS))
    queue = HOME[job_id] if variant != "other-queue" else ("q2" if HOME[job_id] == "default" else "default")
    body: Any = {"id": job_id, "tags": [1, 2]} if variant != "reordered" else {"tags": [1, 2], "id": job_id}
    if variant == "other-body":
        body = draw(st.sampled_from(OTHER_BODIES))
    return Spec(
        job_id, queue, body, draw(st.integers(1, 3)), draw(st.sampled_from(TTLS)), draw(st.sampled_from(DELAYS))
    )


# A fixed delay, or ("to-deadline", offset): the one that ends ``offset`` ms after the ticket's deadline.
delays = st.one_of(st.sampled_from(DELAYS), st.tuples(st.just("to-deadline"), st.sampled_from((-1, 0, 1))))
# Before a ticket's operation: leave the clock, or set it to the ticket's lease end or deadline, or 1 ms either side
# (where every ``<`` and ``<=`` of the lifecycle is decided).
moments = st.one_of(st.none(), st.tuples(st.sampled_from(("lease_until", "deadline")), st.sampled_from((-1, 0, 1))))
picks = st.one_of(st.just(0), st.integers(0, 63))  # 0: the newest ticket; k: the k-th newest (often stale)
forgeries = st.one_of(
    st.none(), st.none(), st.sampled_from(("token", "owner", "attempt", "lease_until", "deadline", "seq"))
)


def job_spec(spec: Spec) -> JobSpec:
    """The facade's job of the model's (whose durations are milliseconds)."""
    return JobSpec(
        spec.id, spec.body, spec.queue, spec.max_attempts, ttl=spec.ttl_ms / 1000, delay=spec.delay_ms / 1000
    )


class Boom(Exception):
    """The app's own failure inside its transaction."""


ERRORS = (Conflict, ValueError, Boom)


def ticket_view(ticket: Ticket) -> tuple[Any, ...]:
    """Everything a ticket carries, comparable with ``row_view``."""
    fence = ticket.fence
    return (ticket.id, ticket.queue, ticket.body_json, fence.owner, fence.token, fence.attempt, fence.lease_until,
            ticket.deadline, ticket.max_attempts, ticket.seq)  # fmt: skip


def row_view(row: Row) -> tuple[Any, ...]:
    """The ticket the model expects a claim of ``row`` to hand out."""
    return (row.id, row.queue, row.body, row.owner, row.token, row.attempts, row.lease_until, row.deadline,
            row.max_attempts, row.seq)  # fmt: skip


def forge(ticket: Ticket, field: str) -> Ticket:
    """``ticket`` with one field changed: a ticket nobody was issued."""
    fence = ticket.fence
    if field == "owner":
        return replace(ticket, fence=fence._replace(owner="w9"))
    if field in ("deadline", "seq"):
        return replace(ticket, **{field: getattr(ticket, field) + 1})
    return replace(ticket, fence=fence._replace(**{field: getattr(fence, field) + 1}))


def read_tables(path: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the three tables through a fresh connection, which must also get the write lock at once."""
    con = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        tables = {
            "jobs": con.execute(f"SELECT {JOB_COLUMNS} FROM asyncq_jobs ORDER BY seq").fetchall(),
            "audit": con.execute(f"SELECT {AUDIT_COLUMNS} FROM asyncq_audit ORDER BY seq").fetchall(),
            "app": con.execute("SELECT seq, value FROM app_rows ORDER BY seq").fetchall(),
        }
        con.execute("BEGIN IMMEDIATE")  # SQLITE_BUSY here: a transaction was left open
        con.execute("ROLLBACK")
        return tables
    finally:
        con.close()


class QueueMachine(RuleBasedStateMachine):
    """One queue file, its model, and every ticket handed out so far (the model decides which are stale)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="asyncq-model-")
        self.path = os.path.join(self.dir, "queue.db")
        self.clock = [T0]
        self.loop = asyncio.new_event_loop()
        self.queue = self.run(self.open())
        self.run(self.create_app_table())
        self.model = Model()
        self.tickets: list[Ticket] = []

    def run(self, awaitable: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(awaitable)

    async def open(self) -> Queue:
        # WAL + NORMAL: the rows' logic is the same at every level, and no fsync per step keeps the run short.
        return await Queue.open(self.path, clock=lambda: self.clock[0], durability="normal")

    async def create_app_table(self) -> None:
        async with self.queue.transaction() as tx:
            await tx.execute("CREATE TABLE app_rows (seq INTEGER PRIMARY KEY AUTOINCREMENT, value INTEGER NOT NULL)")

    def teardown(self) -> None:
        try:
            self.run(self.queue.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def step(
        self,
        name: str,
        product: Callable[[], Awaitable[Any]],
        model: Callable[[Model], Any],
        view: Callable[[Any], Any] = lambda value: value,
    ) -> Any:
        """Run one operation on both: the same value or the same error type; the queue's raw answer."""
        changed = self.model
        try:
            changed, result = self.model.trial(model)
            expected: tuple[str, Any] = ("returned", result)
        except ERRORS as error:
            expected = ("raised", type(error).__name__)
        raw = None
        try:
            raw = self.run(product())
            actual: tuple[str, Any] = ("returned", view(raw))
        except ERRORS as error:
            actual = ("raised", type(error).__name__)
        assert actual == expected, f"{name} at t0{self.clock[0] - T0:+}: queue {actual} != model {expected}"
        self.model = changed
        return raw

    def ticket(self, pick: int, moment: tuple[str, int] | None) -> Ticket:
        """The ``pick``-th newest ticket, after moving the clock to ``moment`` of it."""
        ticket = self.tickets[-1 - pick % len(self.tickets)]
        if moment is not None:
            self.clock[0] = getattr(ticket, moment[0]) + moment[1]
        return ticket

    # -- producers ----------------------------------------------------------------------------------------------

    @initialize(batch=st.lists(specs(), min_size=2, max_size=8))
    def fill(self, batch: list[Spec]) -> None:
        for spec in batch:
            self.enqueue(spec)

    @rule(spec=specs())
    def enqueue(self, spec: Spec) -> None:
        now, options = self.clock[0], {"queue": spec.queue, "max_attempts": spec.max_attempts}
        options |= {"ttl": spec.ttl_ms / 1000, "delay": spec.delay_ms / 1000}
        self.step(f"enqueue {spec}", lambda: self.queue.enqueue(spec.id, spec.body, **options),
                  lambda m: m.enqueue(spec, now))  # fmt: skip

    @rule(batch=st.lists(specs(), min_size=1, max_size=4))
    def enqueue_many(self, batch: list[Spec]) -> None:
        now, jobs = self.clock[0], [job_spec(spec) for spec in batch]
        self.step(f"enqueue_many {batch}", lambda: self.queue.enqueue_many(jobs), lambda m: m.enqueue_many(batch, now))

    @rule(batch=st.lists(specs(), max_size=3), value=st.integers(0, 99), fail=st.booleans())
    def transaction(self, batch: list[Spec], value: int, fail: bool) -> None:
        """The app's row and its jobs commit together; nothing of them lands when the block raises."""
        now = self.clock[0]

        async def product() -> list[bool]:
            async with self.queue.transaction() as tx:
                await tx.execute("INSERT INTO app_rows (value) VALUES (?)", (value,))
                added = [await tx.enqueue(s.id, s.body, queue=s.queue, max_attempts=s.max_attempts,
                                          ttl=s.ttl_ms / 1000, delay=s.delay_ms / 1000) for s in batch]  # fmt: skip
                if fail:
                    raise Boom("the app fails after its writes")
            return added

        def model(m: Model) -> list[bool]:
            m.app.append((len(m.app) + 1, value))
            added = [m.enqueue(spec, now) for spec in batch]
            if fail:
                raise Boom
            return added

        self.step(f"transaction {batch} fail={fail}", product, model)

    # -- workers ------------------------------------------------------------------------------------------------

    @rule(owner=st.sampled_from(OWNERS), queue=st.sampled_from(QUEUES), limit=st.integers(1, 3),
          lease_ms=st.sampled_from(LEASES))  # fmt: skip
    def claim(self, owner: str, queue: str, limit: int, lease_ms: int) -> None:
        now = self.clock[0]
        tickets = self.step(
            f"claim {owner} {queue} {limit} {lease_ms}",
            lambda: self.queue.claim(owner, queue=queue, limit=limit, lease=lease_ms / 1000),
            lambda m: [row_view(row) for row in m.claim(owner, queue, limit, lease_ms, now)],
            lambda found: [ticket_view(ticket) for ticket in found],
        )
        self.tickets.extend(tickets)

    @rule(owner=st.sampled_from(OWNERS), queue=st.sampled_from(QUEUES), limit=st.integers(1, 3),
          lease_ms=st.sampled_from(LEASES), moment=st.one_of(st.sampled_from(JUMPS), moments.filter(bool)),
          renew=st.one_of(st.none(), st.sampled_from(LEASES)), outcome=st.sampled_from(OUTCOMES),
          delay=delays)  # fmt: skip
    def work(self, owner: str, queue: str, limit: int, lease_ms: int, moment: Any, renew: int | None, outcome: str,
             delay: int | tuple[str, int]) -> None:  # fmt: skip
        """A worker's round: claim, the clock jumps (or lands on the lease's end or the deadline, ± 1 ms),
        perhaps an extend, then one outcome for every claimed job in one commit."""
        before = len(self.tickets)
        self.claim(owner, queue, limit, lease_ms)
        if len(self.tickets) == before:
            return
        if isinstance(moment, int):
            self.clock[0] += moment
        else:
            self.ticket(0, moment)
        if renew is not None:
            self.extend(0, None, renew)
        claimed = self.tickets[before:]
        now = self.clock[0]
        results = [(ticket, outcome, self.delay(ticket, delay)) for ticket in claimed]
        self.step(f"work: finish_many {results}", lambda: self.queue.finish_many(results),
                  lambda m: [m.finish(t, o, d, now) for t, o, d in results])  # fmt: skip

    def delay(self, ticket: Ticket, delay: int | tuple[str, int]) -> int:
        """A fixed delay, or one ending ``delay[1]`` ms after the ticket's deadline (a retry at the boundary)."""
        return delay if isinstance(delay, int) else max(0, ticket.deadline - self.clock[0] + delay[1])

    @precondition(lambda self: self.tickets)
    @rule(pick=picks, moment=moments, outcome=st.sampled_from(OUTCOMES), delay=delays, forgery=forgeries)
    def finish(self, pick: int, moment: Any, outcome: str, delay: int | tuple[str, int], forgery: str | None) -> None:
        """One outcome, with a fresh, stale or forged (one field changed) ticket."""
        ticket = self.ticket(pick, moment)
        ticket, now = ticket if forgery is None else forge(ticket, forgery), self.clock[0]
        wait = self.delay(ticket, delay)
        self.step(f"finish {ticket} {outcome} {wait}", lambda: self.queue.finish(ticket, outcome, delay=wait / 1000),
                  lambda m: m.finish(ticket, outcome, wait, now))  # fmt: skip

    @precondition(lambda self: self.tickets)
    @rule(chosen=st.lists(st.tuples(picks, st.sampled_from(OUTCOMES), st.sampled_from(DELAYS)), min_size=1,
                          max_size=4), moment=moments)  # fmt: skip
    def finish_many(self, chosen: list[tuple[int, str, int]], moment: Any) -> None:
        """Several outcomes in one commit; a ticket may come twice (the second is stale then)."""
        self.ticket(chosen[0][0], moment)
        results = [(self.ticket(pick, None), outcome, delay) for pick, outcome, delay in chosen]
        now = self.clock[0]
        self.step(f"finish_many {results}", lambda: self.queue.finish_many(results),
                  lambda m: [m.finish(t, o, d, now) for t, o, d in results])  # fmt: skip

    @precondition(lambda self: self.tickets)
    @rule(pick=picks, moment=moments, lease_ms=st.sampled_from(LEASES))
    def extend(self, pick: int, moment: Any, lease_ms: int) -> None:
        ticket = self.ticket(pick, moment)
        now = self.clock[0]

        def model(m: Model) -> tuple[Any, ...] | None:
            lease_until = m.extend(ticket, lease_ms, now)
            if lease_until is None:
                return None
            return ticket_view(replace(ticket, fence=ticket.fence._replace(lease_until=lease_until)))

        renewed = self.step(f"extend {ticket} {lease_ms}", lambda: self.queue.extend(ticket, lease=lease_ms / 1000),
                            model,
                            lambda found: None if found is None else ticket_view(found))  # fmt: skip
        if renewed is not None:
            self.tickets.append(renewed)

    @precondition(lambda self: self.tickets)
    @rule(chosen=st.lists(picks, min_size=1, max_size=3), moment=moments)
    def release_many(self, chosen: list[int], moment: Any) -> None:
        self.ticket(chosen[0], moment)
        tickets, now = [self.ticket(pick, None) for pick in chosen], self.clock[0]
        self.step(f"release_many {tickets}", lambda: self.queue.release_many(tickets),
                  lambda m: [m.release(ticket, now) for ticket in tickets])  # fmt: skip

    # -- operators, time, the file ------------------------------------------------------------------------------

    @rule(action=st.sampled_from(("redrive", "cancel")), job_id=st.sampled_from(IDS), note=st.sampled_from(NOTES),
          ttl_ms=st.sampled_from(TTLS))  # fmt: skip
    def operate(self, action: str, job_id: str, note: str, ttl_ms: int) -> None:
        """Redrive (dead only; anything else is ValueError and changes nothing) or cancel (its outcome's state)."""
        now = self.clock[0]
        if action == "redrive":
            self.step(f"redrive {job_id}", lambda: _audited(self.queue.redrive(job_id, note, ttl=ttl_ms / 1000)),
                      lambda m: m.redrive(job_id, note, ttl_ms, now))  # fmt: skip
        else:
            self.step(
                f"cancel {job_id}",
                lambda: _cancel_state(self.queue.cancel(job_id, note)),
                lambda m: m.cancel(job_id, note, now),
            )

    @rule(jump=st.sampled_from(JUMPS), job_id=st.sampled_from(IDS), offset=st.sampled_from((-1, 0, 1)),
          to=st.one_of(st.none(), st.sampled_from(("available_at", "deadline"))))  # fmt: skip
    def tick(self, jump: int, job_id: str, to: str | None, offset: int) -> None:
        """Move the clock by ``jump``, or to a row's ``available_at`` or ``deadline`` (± 1 ms)."""
        row = self.model.rows.get(job_id)
        if to is None or row is None:
            self.clock[0] += jump
        else:
            self.clock[0] = getattr(row, to) + offset

    @rule()
    def reopen(self) -> None:
        self.run(self.queue.close())
        self.queue = self.run(self.open())

    @rule(job_id=st.sampled_from(IDS))
    def get(self, job_id: str) -> None:
        found, row = self.run(self.queue.get(job_id)), self.model.rows.get(job_id)
        if found is None or row is None:
            assert found is None and row is None, f"get {job_id}: queue {found}, model {row}"
            return
        stored = (found.seq, found.id, found.queue, canonical(found.body), found.status, found.attempts,
                  found.max_attempts, found.token, found.available_at, found.deadline, found.owner,
                  found.lease_until, found.reason, found.cancel_requested_at, found.priority,
                  found.unique_key, found.task, found.limit_key)  # fmt: skip
        assert stored == astuple(row)

    @invariant()
    def file_matches_the_model(self) -> None:
        tables = read_tables(self.path)
        self.model.adopt({row[1]: row[0] for row in tables["jobs"]})
        assert tables["jobs"] == self.model.job_rows()
        assert tables["audit"] == self.model.audit
        assert tables["app"] == self.model.app
        assert_counts_kept(self.path)  # the counts behind stats(), kept by triggers, are the rows' count


# A passing run takes ~30 s; a failing one shrinks its example for up to Hypothesis's own five minutes, and a
# pytest timeout inside that (raised into the running example) would end it with a FlakyFailure instead.
@pytest.mark.timeout(420)
def test_queue_matches_its_model() -> None:
    examples = int(os.environ.get("ASYNCQ_MODEL_EXAMPLES", "150"))
    steps = int(os.environ.get("ASYNCQ_MODEL_STEPS", "40"))
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


async def _cancel_state(call: Any) -> str:
    """A cancel's outcome as the model says it: its state (the audit row is checked against the file)."""
    outcome = await call
    assert (outcome.audit is None) == (outcome.state == "too_late") or outcome.state == "requested", outcome
    return str(outcome.state)


async def _audited(call: Any) -> bool:
    """A redrive or cancel returns the audit row it wrote (checked against the file by the machine): ``True``."""
    entry = await call
    assert entry.seq > 0 and entry.action in ("redrive", "cancel"), entry
    return True
