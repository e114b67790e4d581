"""Every fault point of ``claim``, ``finish`` and ``redrive``: a hook that raises, and a child process that
dies there with ``os._exit``. Before COMMIT nothing may remain (the claim's dead-sweep included); after
COMMIT everything does. Hooks run in order, with their exact names, and never on a ``None``/``False`` path.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncq.lab.lease import claim, enqueue, finish, open_queue, redrive

try:
    import lease_children as kids
except ImportError:  # tests/ imported as a package
    from tests import lease_children as kids

pytestmark = pytest.mark.timeout(60)

NOW = 2000
POINTS = {
    "claim": ("after-claim", "after-commit"),
    "finish": ("after-finish", "after-commit"),
    "redrive": ("after-audit", "after-redrive", "after-commit"),
}
CASES = [(op, point) for op, points in POINTS.items() for point in points]


class Boom(Exception):
    pass


class Halt(BaseException):
    """Not an ``Exception``: a rollback must not depend on the error's class."""


def prepare(path: Path, op: str) -> list[Any]:
    """A queue where ``op`` changes something, with a row the claim's sweep kills; ``op``'s arguments."""
    con = open_queue(path)
    try:
        assert enqueue(con, {"id": "late", "qty": 1}, 1000, 500) is True  # deadline 1500: swept at NOW
        assert enqueue(con, {"id": "a", "qty": 4}, 1000, 10_000) is True
        if op == "claim":
            return ["w", NOW, 1000]
        ticket = claim(con, "w", 1000)  # late comes first by seq: make it dead (a redrive target)
        assert ticket is not None and ticket["id"] == "late"
        assert finish(con, ticket, "permanent", 1001) == "dead"
        ticket = claim(con, "w", 1001, 5000)
        assert ticket is not None and ticket["id"] == "a"
        if op == "finish":
            return [ticket, "ok", NOW, 0]
        return ["late", NOW, 1000, "ops-1"]
    finally:
        con.close()


def operation(op: str) -> Callable[..., Any]:
    return {"claim": claim, "finish": finish, "redrive": redrive}[op]


def expected_after(path: Path, op: str, args: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """The state after ``op`` succeeds with no hook, computed on a copy of the file."""
    twin = path.with_name("twin.db")
    shutil.copyfile(path, twin)
    twin_con = open_queue(twin)
    try:
        operation(op)(twin_con, *args)
        return kids.dump(twin_con)
    finally:
        twin_con.close()


@pytest.mark.parametrize("op", POINTS)
def test_operations_change_rows_and_the_claim_sweeps(path: Path, op: str) -> None:
    """Guard for the cases below: each operation changes rows, and the claim also sweeps."""
    args = prepare(path, op)
    before = kids.dump(path)
    after = expected_after(path, op, args)
    assert after != before
    if op == "claim":
        statuses = {r[1]: (r[3], r[11]) for r in after["jobs"]}
        assert statuses == {"late": ("dead", "deadline"), "a": ("leased", None)}


@pytest.mark.parametrize("op", POINTS)
def test_hooks_are_called_in_order_with_their_names(path: Path, op: str) -> None:
    args = prepare(path, op)
    expected = expected_after(path, op, args)
    seen: list[str] = []
    con = open_queue(path)
    try:
        result = operation(op)(con, *args, fault=seen.append)
        assert con.in_transaction is False
    finally:
        con.close()
    assert seen == list(POINTS[op])
    assert result in ({"id": "a", "qty": 4, "owner": "w", "token": 1, "attempt": 1, "lease_until": 3000}, "done", True)
    assert kids.dump(path) == expected


@pytest.mark.parametrize("error_class", [Boom, Halt])
@pytest.mark.parametrize(("op", "point"), CASES)
def test_raising_hook(path: Path, op: str, point: str, error_class: type[BaseException]) -> None:
    args = prepare(path, op)
    before = kids.dump(path)
    after = expected_after(path, op, args)
    error = error_class(point)
    seen: list[str] = []

    def hook(name: str) -> None:
        seen.append(name)
        if name == point:
            raise error

    con = open_queue(path)
    try:
        with pytest.raises(error_class) as raised:
            operation(op)(con, *args, fault=hook)
        assert raised.value is error
        assert con.in_transaction is False
        assert kids.dump(con) == (after if point == "after-commit" else before)
        con.execute("BEGIN IMMEDIATE")  # the connection is still usable and holds no lock
        con.execute("ROLLBACK")
    finally:
        con.close()
    points = POINTS[op]
    assert seen == list(points[: points.index(point) + 1])
    assert kids.dump(path) == (after if point == "after-commit" else before)


def test_claim_that_only_sweeps_calls_no_hook_and_commits_the_sweep(con: sqlite3.Connection) -> None:
    assert enqueue(con, {"id": "late", "qty": 1}, 1000, 500) is True
    assert enqueue(con, {"id": "later", "qty": 1}, 5000, 500) is True  # not yet available
    seen: list[str] = []
    assert claim(con, "w", NOW, 1000, seen.append) is None
    assert seen == []
    assert [(r[1], r[3], r[11]) for r in kids.dump(con)["jobs"]] == [
        ("late", "dead", "deadline"),
        ("later", "pending", None),
    ]
    assert con.in_transaction is False


def test_claim_that_only_sweeps_commits_even_if_a_hook_would_raise(con: sqlite3.Connection) -> None:
    assert enqueue(con, {"id": "late", "qty": 1}, 1000, 500) is True

    def hook(name: str) -> None:
        raise Boom(name)

    assert claim(con, "w", NOW, 1000, hook) is None
    assert kids.row(con, "late")["status"] == "dead"  # type: ignore[index]


def test_claim_of_an_empty_queue_calls_no_hook(con: sqlite3.Connection) -> None:
    seen: list[str] = []
    assert claim(con, "w", NOW, 1000, seen.append) is None
    assert seen == []


def test_stale_finish_calls_no_hook(con: sqlite3.Connection) -> None:
    assert enqueue(con, {"id": "a", "qty": 1}, 1000, 10_000) is True
    ticket = claim(con, "w", 1000)
    assert ticket is not None
    seen: list[str] = []
    before = kids.dump(con)
    for stale, now in [({**ticket, "token": 2}, 1500), (ticket, 2000), ({**ticket, "id": "b"}, 1500)]:
        assert finish(con, stale, "ok", now, 0, seen.append) is False
    assert seen == []
    assert kids.dump(con) == before


def test_refused_redrive_calls_no_hook(con: sqlite3.Connection) -> None:
    assert enqueue(con, {"id": "a", "qty": 1}, 1000, 10_000) is True
    seen: list[str] = []
    for job_id in ("a", "missing"):
        with pytest.raises(ValueError):
            redrive(con, job_id, NOW, 1000, "ops", seen.append)
    assert seen == []
    assert kids.dump(con)["redrives"] == []


@pytest.mark.parametrize(("op", "point"), CASES)
def test_child_exits_at_fault_point(tmp_path: Path, path: Path, op: str, point: str) -> None:
    """The child dies with ``os._exit`` inside the hook; reopening shows all or nothing."""
    args = prepare(path, op)
    before = kids.dump(path)
    after = expected_after(path, op, args)
    child = kids.spawn("fault", {"db": str(path), "op": op, "point": point, "args": args}, tmp_path, stdin=False)
    try:
        code = child.wait(timeout=20)
    finally:
        kids.finish_child(child)
    assert code == kids.FAULT_EXIT, kids.stderr_of(tmp_path)
    assert kids.dump(path) == (after if point == "after-commit" else before)
    reopened = open_queue(path)  # the queue is usable again: no lock, no half transaction
    try:
        assert kids.dump(reopened) == (after if point == "after-commit" else before)
        reopened.execute("BEGIN IMMEDIATE")
        reopened.execute("ROLLBACK")
    finally:
        reopened.close()
