"""The state machine is drawn once (docs/state-machine.md) and written once (``lifecycle.TRANSITIONS``).

These tests keep the two equal, and check that the lab never moves a row in a way the table does not list
for the operation that ran: random histories on a real SQLite file, every row diffed before and after each
operation, plus the invariants the page states.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from asyncq.core.lifecycle import (
    DEAD,
    DEAD_REASONS,
    LEASED,
    PENDING,
    REASON_CANCELLED,
    REASON_RETRY,
    TRANSITIONS,
    WAITING,
)
from asyncq.lab.lease import Conflict, claim, enqueue, finish, open_queue, redrive

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).resolve().parents[1] / "docs" / "state-machine.md"
MOVES = {(t.source, t.target, t.reason, t.actor) for t in TRANSITIONS}
JOB_IDS = ("a", "b", "c", "d")
OWNERS = ("w1", "w2")
NOTES = ("ops", "retry-after-fix")
NULL = "—"


# -- the page and the code agree ----------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")]


def doc_table() -> list[tuple[str, str, str | None, str]]:
    """The rows of the ``from | to | reason | by`` table, ``—`` read as ``None``."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if _cells(line) == ["from", "to", "reason", "by"])
    assert set(lines[start + 1].replace("|", "").split()) == {"---"}, "the header must be followed by |---|"
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        source, target, reason, actor = _cells(line)
        rows.append((source, target, None if reason == NULL else reason, actor))
    return rows


def doc_diagram_edges() -> set[tuple[str, str, str]]:
    """``(source, target, actor)`` of each edge of the mermaid diagram (``[*]`` edges left out)."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"```mermaid\n(.*?)```", text, re.DOTALL)
    assert block is not None and block.group(1).lstrip().startswith("stateDiagram-v2")
    edges = set()
    for source, target, label in re.findall(r"^\s*(\S+) --> (\S+)(?: : (.*))?$", block.group(1), re.MULTILINE):
        if "[*]" not in (source, target):
            edges.add((source, target, label.split()[0]))
    return edges


def test_doc_table_lists_exactly_the_transitions() -> None:
    rows = doc_table()
    assert len(rows) == len(set(rows)), "a transition is listed twice"
    assert set(rows) == MOVES


def test_doc_diagram_draws_every_transition_and_no_other() -> None:
    assert doc_diagram_edges() == {(t.source, t.target, t.actor) for t in TRANSITIONS}


def test_transitions_are_unique_and_use_known_states() -> None:
    assert len(MOVES) == len(TRANSITIONS)
    for move in TRANSITIONS:
        assert {move.source, move.target} <= {PENDING, LEASED, DEAD, "done", WAITING}
        assert (move.target == DEAD) == (move.reason in DEAD_REASONS)


# -- the lab only makes listed moves -------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    qty: int
    status: str
    attempts: int
    max_attempts: int
    token: int
    available_at: int
    deadline: int
    owner: str | None
    lease_until: int | None
    reason: str | None

    def ready(self, now: int) -> bool:
        """What the claim may pick (after the sweep)."""
        if self.status == PENDING:
            return self.available_at <= now
        return self.status == LEASED and self.lease_until is not None and self.lease_until <= now

    def differs_in(self, other: Row) -> set[str]:
        return {f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)}


COLUMNS = ", ".join(f.name for f in fields(Row))


def rows(con: sqlite3.Connection) -> dict[str, Row]:
    return {row[0]: Row(*row) for row in con.execute(f"SELECT {COLUMNS} FROM jobs ORDER BY seq")}


def audit(con: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return con.execute("SELECT id, token, at_ms, note FROM redrives ORDER BY seq").fetchall()


def changed(before: dict[str, Row], after: dict[str, Row]) -> dict[str, tuple[Row, Row]]:
    """Rows that existed before and differ now; no row may vanish."""
    assert set(before) <= set(after), "a job row disappeared"
    return {job_id: (old, after[job_id]) for job_id, old in before.items() if after[job_id] != old}


class LeaseLifecycle(RuleBasedStateMachine):
    """Random enqueue / claim / finish (fresh and stale tickets) / redrive / time steps on one lab file."""

    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="asyncq-sm-")
        self.con = open_queue(Path(self.tmp.name) / "queue.db")
        self.now = 1_000
        self.latest: dict[str, Any] | None = None
        self.tokens: dict[str, int] = {}
        self.seen: set[tuple[str, str, str | None, str]] = set()
        self.points: list[str] = []

    def teardown(self) -> None:
        self.con.close()
        self.tmp.cleanup()

    def hook(self, point: str) -> None:
        self.points.append(point)

    def moved(self, old: Row, new: Row, actor: str) -> None:
        move = (old.status, new.status, new.reason, actor)
        assert move in MOVES, f"{actor} made an unlisted move {move}: {old} -> {new}"
        self.seen.add(move)
        if currently_in_test_context():  # the scripted tour runs the rules outside Hypothesis
            hypothesis.event(f"{actor}: {old.status} -> {new.status} ({new.reason})")

    # -- operations ---------------------------------------------------------------------------------------

    @initialize(
        jobs=st.lists(
            st.tuples(st.sampled_from(JOB_IDS), st.integers(1, 3), st.integers(1, 60_000), st.integers(1, 4)),
            min_size=1,
            max_size=3,
        )
    )
    def start_with_jobs(self, jobs: list[tuple[str, int, int, int]]) -> None:
        for job_id, qty, ttl, max_attempts in jobs:
            self.enqueue(job_id, qty, ttl, max_attempts)

    @rule(
        job_id=st.sampled_from(JOB_IDS),
        qty=st.integers(1, 3),
        ttl=st.integers(1, 60_000),
        max_attempts=st.integers(1, 4),
    )
    def enqueue(self, job_id: str, qty: int, ttl: int, max_attempts: int) -> None:
        before = rows(self.con)
        try:
            added: bool | str = enqueue(self.con, {"id": job_id, "qty": qty}, self.now, ttl, max_attempts)
        except Conflict:
            added = "conflict"
        after = rows(self.con)
        assert changed(before, after) == {}, "enqueue moved an existing row"
        if job_id in before:
            assert added == (False if before[job_id].qty == qty else "conflict")
            assert set(after) == set(before)
            return
        assert added is True and set(after) == {*before, job_id}
        new = after[job_id]
        assert new == Row(job_id, qty, PENDING, 0, max_attempts, 0, self.now, self.now + ttl, None, None, None)

    @rule(target=tickets, owner=st.sampled_from(OWNERS), lease=st.one_of(st.integers(1, 2_000), st.integers(1, 60_000)))
    def claim(self, owner: str, lease: int) -> Any:
        before, self.points = rows(self.con), []
        ticket = claim(self.con, owner, self.now, lease, fault=self.hook)
        after = rows(self.con)
        moves = changed(before, after)
        taken = [job_id for job_id, (old, new) in moves.items() if new.token != old.token]
        for job_id, (old, new) in moves.items():
            if job_id in taken:
                self.check_claimed(old, new, owner, lease)
            else:
                self.check_swept(old, new)
        still_ready = [row for row in after.values() if row.ready(self.now) and row.id not in taken]
        if ticket is None:
            assert taken == [] and self.points == [] and still_ready == []
            return multiple()
        assert taken == [ticket["id"]] and self.points == ["after-claim", "after-commit"]
        new = after[ticket["id"]]
        assert ticket == {
            "id": new.id,
            "qty": new.qty,
            "owner": owner,
            "token": new.token,
            "attempt": new.attempts,
            "lease_until": new.lease_until,
        }
        ids = list(after)
        assert all(ids.index(row.id) > ids.index(new.id) for row in still_ready), "claim skipped an older job"
        self.latest = ticket
        return multiple(ticket)

    def check_claimed(self, old: Row, new: Row, owner: str, lease: int) -> None:
        self.moved(old, new, "claim")
        assert old.ready(self.now), f"claimed a row that was not ready: {old}"
        assert old.deadline > self.now and old.attempts < old.max_attempts, f"claimed a sweepable row: {old}"
        assert new.token == old.token + 1 and new.attempts == old.attempts + 1
        assert new.owner == owner and new.lease_until == min(self.now + lease, old.deadline)
        assert old.differs_in(new) <= {"status", "attempts", "token", "owner", "lease_until", "reason"}

    def check_swept(self, old: Row, new: Row) -> None:
        self.moved(old, new, "sweep")
        if old.status == LEASED:
            assert old.lease_until is not None and old.lease_until <= self.now, "swept a live lease"
        if old.deadline <= self.now:
            assert new.reason == "deadline"
        else:
            assert new.reason == "exhausted" and old.attempts >= old.max_attempts
        assert old.differs_in(new) <= {"status", "reason", "owner", "lease_until"}

    def finish_with(self, ticket: dict[str, Any], outcome: str, delay: int) -> None:
        before, self.points = rows(self.con), []
        given = dict(ticket)
        status = finish(self.con, given, outcome, self.now, delay, fault=self.hook)
        after = rows(self.con)
        assert given == ticket, "finish mutated the ticket"
        moves = changed(before, after)
        old = before.get(ticket["id"])
        current = (
            old is not None
            and old.status == LEASED
            and (old.qty, old.owner, old.token, old.attempts, old.lease_until)
            == (ticket["qty"], ticket["owner"], ticket["token"], ticket["attempt"], ticket["lease_until"])
            and self.now < ticket["lease_until"]
            and self.now < old.deadline
        )
        if not current:
            if currently_in_test_context():
                hypothesis.event("finish: stale ticket refused")
            assert status is False and moves == {} and self.points == []
            return
        assert old is not None and set(moves) == {old.id}, "a current ticket's finish must land on its job only"
        new = after[old.id]
        self.moved(old, new, "finish")
        assert new.status == status and self.points == ["after-finish", "after-commit"]
        assert old.differs_in(new) <= {"status", "reason", "available_at", "owner", "lease_until"}
        assert new.available_at == (self.now + delay if new.status == PENDING else self.now)

    @rule(
        ticket=tickets,
        outcome=st.sampled_from(("ok", "retry", "permanent")),
        delay=st.integers(0, 60_000),
    )
    def finish_any_ticket(self, ticket: dict[str, Any], outcome: str, delay: int) -> None:
        self.finish_with(ticket, outcome, delay)

    @precondition(lambda self: self.latest is not None)
    @rule(outcome=st.sampled_from(("ok", "retry", "permanent")), delay=st.integers(0, 60_000))
    def finish_latest_ticket(self, outcome: str, delay: int) -> None:
        assert self.latest is not None
        self.finish_with(self.latest, outcome, delay)

    @rule(job_id=st.sampled_from(JOB_IDS), ttl=st.integers(1, 60_000), note=st.sampled_from(NOTES))
    def redrive(self, job_id: str, ttl: int, note: str) -> None:
        before, audited, self.points = rows(self.con), audit(self.con), []
        try:
            done = redrive(self.con, job_id, self.now, ttl, note, fault=self.hook)
        except ValueError:
            done = False
        after = rows(self.con)
        moves = changed(before, after)
        if job_id not in before or before[job_id].status != DEAD:
            assert done is False and moves == {} and audit(self.con) == audited and self.points == []
            return
        old, new = before[job_id], after[job_id]
        assert done is True and set(moves) == {job_id}
        self.moved(old, new, "redrive")
        assert audit(self.con) == [*audited, (job_id, old.token, self.now, note)]
        assert self.points == ["after-audit", "after-redrive", "after-commit"]
        assert (new.attempts, new.available_at, new.deadline) == (0, self.now, self.now + ttl)
        assert old.differs_in(new) <= {"status", "reason", "attempts", "available_at", "deadline"}

    @rule(step=st.one_of(st.integers(0, 2_000), st.integers(0, 70_000)))
    def tick(self, step: int) -> None:
        self.now += step

    # -- invariants ---------------------------------------------------------------------------------------

    @invariant()
    def no_transaction_left_open(self) -> None:
        assert not self.con.in_transaction

    @invariant()
    def tokens_never_decrease(self) -> None:
        for job_id, row in rows(self.con).items():
            assert row.token >= self.tokens.get(job_id, 0), f"token of {job_id} went down"
            self.tokens[job_id] = row.token

    @invariant()
    def columns_fit_the_status(self) -> None:
        for row in rows(self.con).values():
            assert (row.owner is not None) == (row.lease_until is not None) == (row.status == LEASED), row
            if row.status == LEASED:
                assert row.lease_until is not None and row.lease_until <= row.deadline, row
                assert 1 <= row.attempts <= row.max_attempts and row.reason is None, row
            elif row.status == PENDING:
                assert row.reason in (None, REASON_RETRY) and row.attempts < row.max_attempts, row
            elif row.status == DEAD:
                assert row.reason in DEAD_REASONS and row.reason != REASON_CANCELLED, row
            else:
                assert row.reason is None, row


TestLeaseLifecycle = LeaseLifecycle.TestCase
TestLeaseLifecycle.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_a_scripted_tour_makes_every_lab_move() -> None:
    """The checker is not vacuous: one history reaches every move the lab can make, each classified."""
    machine = LeaseLifecycle()
    try:
        machine.enqueue("a", 1, 60_000, 2)
        first = machine.claim("w1", 1_000)
        machine.finish_with(first.values[0], "retry", 10)  # leased -> pending (retry)
        machine.tick(10)
        machine.claim("w1", 1_000)
        machine.tick(1_000)
        machine.claim("w2", 1_000)  # the expired lease is swept: attempts used up
        machine.enqueue("b", 1, 60_000, 3)
        held = machine.claim("w1", 100).values[0]
        machine.tick(100)
        machine.claim("w2", 100)  # leased -> leased, a new token
        machine.finish_with(held, "ok", 0)  # stale: refused
        machine.finish_latest_ticket("ok", 0)  # leased -> done
        machine.redrive("a", 60_000, "ops")  # dead -> pending
        machine.claim("w1", 1_000)
        machine.finish_latest_ticket("permanent", 0)
        machine.redrive("a", 60_000, "ops")
        machine.claim("w1", 1_000)
        machine.finish_latest_ticket("retry", 60_000)  # dead (deadline)
        machine.redrive("a", 1, "ops")
        machine.enqueue("c", 1, 5_000, 1)
        machine.tick(1)
        machine.claim("w1", 10_000)  # a is swept (pending, deadline); c is claimed
        machine.finish_latest_ticket("retry", 0)  # dead (exhausted)
        machine.enqueue("d", 1, 5_000, 3)
        machine.claim("w1", 60_000)  # the lease is capped at d's deadline
        machine.tick(5_000)
        machine.claim("w1", 1_000)  # d's lease ran to the deadline: swept (deadline)
        machine.no_transaction_left_open()
        machine.tokens_never_decrease()
        machine.columns_fit_the_status()
    finally:
        machine.teardown()
    unreachable = {(PENDING, DEAD, "exhausted", "sweep")}  # a pending row always has attempts < max_attempts
    product_only = {
        move
        for move in MOVES
        if move[3] in ("extend", "cancel", "release") or move[2] == REASON_CANCELLED or WAITING in move[:2]
    }  # the lab has no cancel, no release and no dependencies
    assert machine.seen == MOVES - unreachable - product_only


def test_the_outcome_names_mypy_checks_are_the_outcomes() -> None:
    from typing import get_args

    from asyncq.core.lifecycle import Outcome, OutcomeName

    assert set(get_args(OutcomeName)) == {outcome.value for outcome in Outcome}
