"""Clock faults: the clock jumps by ±4 ms … ±262144 ms (the powers of 4) between a claim and its finish or extend,
on the product ``Queue`` (its injected clock) and on the lease lab (``now_ms`` and ``run_once``'s clock).

For each jump the result must be exactly what the lifecycle (docs/state-machine.md, shared/specs/lease-lab.md)
says for the jumped time, written out here as plain arithmetic: a finish or extend lands only while
``now < lease_until`` and ``now < deadline``; once the lease has run out another owner takes the job over with a
new token and the old ticket's finish is refused (no stale overwrite); a ticket finishes once (no double finish).
Whole rows are compared, read through fresh ``sqlite3`` connections. A jump back is not an error for the
product or for the lab's ``finish`` (time is a parameter); only the lab's ``run_once`` refuses a second clock
reading below its first, after keeping its committed claim.
"""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from asyncq import Queue
from asyncq.lab import lease

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
JUMPS = [sign * 4**k for k in range(1, 10) for sign in (1, -1)]  # ±4, ±16 … ±262144 ms
# Powers of 4 too, so that jumps land exactly on the boundaries: 4-256 ms stay inside the lease, 1024 lands on its
# end (refused: ``now < lease_until`` fails; claimable: ``lease_until <= now``), 65536 on the deadline; a retry's
# delay ends exactly on the deadline after a jump of 256 (dead: ``now + delay >= deadline``), before it after 64.
LEASE_MS = 1024
TTL_MS = 65536
DELAY_MS = TTL_MS - 256
COLUMNS = "id, status, attempts, token, available_at, deadline, owner, lease_until, reason"


def row(path: Path, table: str, job_id: str) -> tuple[Any, ...]:
    con = sqlite3.connect(path)
    try:
        found = con.execute(f"SELECT {COLUMNS} FROM {table} WHERE id = ?", (job_id,)).fetchone()
    finally:
        con.close()
    assert found is not None, job_id
    return tuple(found)


def held(now: int, lease_until: int, deadline: int) -> bool:
    """The lifecycle's test for a live lease at ``now``."""
    return now < lease_until and now < deadline


def leased(job_id: str, attempts: int, owner: str, lease_until: int, deadline: int, available_at: int = T0) -> tuple:
    return (job_id, "leased", attempts, attempts, available_at, deadline, owner, lease_until, None)


def parked(job_id: str, status: str, reason: str | None, available_at: int, deadline: int) -> tuple:
    return (job_id, status, 1, 1, available_at, deadline, None, None, reason)


# --- the product queue --------------------------------------------------------------------------------------------


async def claimed(queue: Queue, clock: list[int], job_id: str, owner: str = "w1") -> Any:
    clock[0] = T0
    assert await queue.enqueue(job_id, {"n": 1}, ttl=TTL_MS / 1000) is True
    [ticket] = await queue.claim(owner, limit=1, lease=LEASE_MS / 1000)
    assert (ticket.id, ticket.lease_until, ticket.deadline) == (job_id, T0 + LEASE_MS, T0 + TTL_MS)
    return ticket


@pytest.mark.parametrize("jump", JUMPS)
async def test_queue_finish_after_a_jump(queue: Queue, path: Path, clock: list[int], jump: int) -> None:
    """``ok`` and ``retry`` land exactly while the lease holds at the jumped time, then once only."""
    deadline = T0 + TTL_MS
    for job_id, outcome in (("ok", "ok"), ("retry", "retry")):
        ticket = await claimed(queue, clock, job_id)
        now = clock[0] = T0 + jump
        before = row(path, "asyncq_jobs", job_id)
        status = await queue.finish(ticket, outcome, delay=DELAY_MS / 1000)
        if not held(now, ticket.lease_until, deadline):
            assert status is None and row(path, "asyncq_jobs", job_id) == before
            continue
        if outcome == "ok":
            expected = parked(job_id, "done", None, now, deadline)
        elif now + DELAY_MS >= deadline:
            expected = parked(job_id, "dead", "deadline", now, deadline)
        else:
            expected = parked(job_id, "pending", "retry", now + DELAY_MS, deadline)
        assert (status, row(path, "asyncq_jobs", job_id)) == (expected[1], expected)
        assert await queue.finish(ticket, "ok") is None  # no double finish
        assert row(path, "asyncq_jobs", job_id) == expected


@pytest.mark.parametrize("jump", JUMPS)
async def test_queue_extend_after_a_jump(queue: Queue, path: Path, clock: list[int], jump: int) -> None:
    """An extend lands exactly while the lease holds, to ``min(now + lease, deadline)``; the old ticket is stale."""
    deadline = T0 + TTL_MS
    ticket = await claimed(queue, clock, "job")
    now = clock[0] = T0 + jump
    before = row(path, "asyncq_jobs", "job")
    renewed = await queue.extend(ticket, lease=LEASE_MS / 1000)
    if not held(now, ticket.lease_until, deadline):
        assert renewed is None and row(path, "asyncq_jobs", "job") == before
        return
    lease_until = min(now + LEASE_MS, deadline)
    assert renewed is not None and (renewed.lease_until, renewed.token) == (lease_until, ticket.token)
    assert row(path, "asyncq_jobs", "job") == leased("job", 1, "w1", lease_until, deadline)
    if lease_until != ticket.lease_until:
        assert await queue.finish(ticket, "ok") is None  # the fence moved with the renewal
    assert await queue.finish(renewed, "ok") == "done"


@pytest.mark.parametrize("jump", [jump for jump in JUMPS if jump > 0])
async def test_queue_takeover_after_a_jump_refuses_the_old_ticket(
    queue: Queue, path: Path, clock: list[int], jump: int
) -> None:
    """Past the lease, another owner claims with a new token and the first owner's finish changes nothing; past
    the deadline the claim's sweep parks the job dead instead. Before either, the job is not claimable."""
    deadline = T0 + TTL_MS
    first = await claimed(queue, clock, "job")
    now = clock[0] = T0 + jump
    taken = await queue.claim("w2", limit=1, lease=LEASE_MS / 1000)
    if now < first.lease_until:
        assert taken == [] and row(path, "asyncq_jobs", "job") == leased("job", 1, "w1", first.lease_until, deadline)
        return
    if now >= deadline:
        assert taken == [] and row(path, "asyncq_jobs", "job") == parked("job", "dead", "deadline", T0, deadline)
        assert await queue.finish(first, "ok") is None
        return
    [second] = taken
    lease_until = min(now + LEASE_MS, deadline)
    assert (second.token, second.attempt, second.lease_until) == (2, 2, lease_until)
    assert await queue.finish(first, "ok") is None  # no stale overwrite
    assert await queue.extend(first) is None
    assert row(path, "asyncq_jobs", "job") == leased("job", 2, "w2", lease_until, deadline)
    assert await queue.finish(second, "ok") == "done"
    assert row(path, "asyncq_jobs", "job") == ("job", "done", 2, 2, now, deadline, None, None, None)


# --- the lease lab ------------------------------------------------------------------------------------------------

LAB_TTL_MS = 16384  # the lab's budget is at most 60 s: the jump of 16384 lands on its deadline
LAB_DELAY_MS = LAB_TTL_MS - 256


@pytest.mark.parametrize("jump", JUMPS)
def test_lab_finish_after_a_jump(con: sqlite3.Connection, path: Path, jump: int) -> None:
    deadline = T0 + LAB_TTL_MS
    for job_id, outcome in (("ok", "ok"), ("retry", "retry")):
        assert lease.enqueue(con, {"id": job_id, "qty": 1}, T0, LAB_TTL_MS) is True
        ticket = lease.claim(con, "w1", T0, LEASE_MS)
        assert ticket is not None and ticket["lease_until"] == T0 + LEASE_MS
        now, before = T0 + jump, row(path, "jobs", job_id)
        status = lease.finish(con, ticket, outcome, now, LAB_DELAY_MS)
        if not held(now, ticket["lease_until"], deadline):
            assert status is False and row(path, "jobs", job_id) == before
            continue
        if outcome == "ok":
            expected = parked(job_id, "done", None, now, deadline)
        elif now + LAB_DELAY_MS >= deadline:
            expected = parked(job_id, "dead", "deadline", now, deadline)
        else:
            expected = parked(job_id, "pending", "retry", now + LAB_DELAY_MS, deadline)
        assert (status, row(path, "jobs", job_id)) == (expected[1], expected)
        assert lease.finish(con, ticket, "ok", now) is False  # no double finish
        assert row(path, "jobs", job_id) == expected
        assert not con.in_transaction


@pytest.mark.parametrize("jump", [jump for jump in JUMPS if jump > 0])
def test_lab_takeover_after_a_jump_refuses_the_old_ticket(con: sqlite3.Connection, path: Path, jump: int) -> None:
    deadline = T0 + LAB_TTL_MS
    assert lease.enqueue(con, {"id": "job", "qty": 1}, T0, LAB_TTL_MS) is True
    first = lease.claim(con, "w1", T0, LEASE_MS)
    assert first is not None
    now = T0 + jump
    second = lease.claim(con, "w2", now, LEASE_MS)
    if now < first["lease_until"]:
        assert second is None and row(path, "jobs", "job") == leased("job", 1, "w1", T0 + LEASE_MS, deadline)
        return
    if now >= deadline:
        assert second is None and row(path, "jobs", "job") == parked("job", "dead", "deadline", T0, deadline)
        assert lease.finish(con, first, "ok", now) is False
        return
    assert second is not None and (second["token"], second["lease_until"]) == (2, min(now + LEASE_MS, deadline))
    assert lease.finish(con, first, "ok", now) is False  # no stale overwrite
    assert row(path, "jobs", "job") == leased("job", 2, "w2", second["lease_until"], deadline)
    assert lease.finish(con, second, "ok", now) == "done"


@pytest.mark.parametrize("jump", JUMPS)
def test_lab_run_once_with_a_jumping_clock(con: sqlite3.Connection, path: Path, jump: int) -> None:
    """``run_once`` reads the clock twice: a second reading below the first is ``ValueError`` after the committed
    claim (the job stays leased); a later one finishes, or is refused as stale past the lease."""
    assert lease.enqueue(con, {"id": "job", "qty": 1}, T0, LAB_TTL_MS) is True
    readings = iter((T0, T0 + jump))
    sent: list[dict[str, Any]] = []

    def send(event: dict[str, Any]) -> bool:
        sent.append(event)
        return True

    deadline = T0 + LAB_TTL_MS
    if jump < 0:
        with pytest.raises(ValueError, match="backwards"):
            lease.run_once(con, "w1", lambda: next(readings), send, 1.0, LEASE_MS)
        assert row(path, "jobs", "job") == leased("job", 1, "w1", T0 + LEASE_MS, deadline)
    else:
        result = lease.run_once(con, "w1", lambda: next(readings), send, 1.0, LEASE_MS)
        fresh = held(T0 + jump, T0 + LEASE_MS, deadline)
        assert result == {"id": "job", "token": 1, "status": "done" if fresh else "stale"}
        expected = parked("job", "done", None, T0 + jump, deadline) if fresh else leased(
            "job", 1, "w1", T0 + LEASE_MS, deadline)  # fmt: skip
        assert row(path, "jobs", "job") == expected
    assert sent == [{"id": "job", "qty": 1}] and not con.in_transaction


# --- nothing reads the wall clock but the one clock module -------------------------------------------------------

PACKAGE = Path(__file__).resolve().parent.parent / "asyncq"
CLOCK_MODULES = ("clock.py", "core/clock.py")  # the one injectable clock; it may move into core/
# Reading these is reading the wall clock, wherever it happens.
WALL = {
    "time.time", "time.time_ns", "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
    "datetime.date.today", "email.utils.localtime",
}  # fmt: skip
# These read it only when called without a time of their own: gmtime() is now, gmtime(seconds) a conversion.
WALL_WITHOUT_ARGUMENT = {"time.localtime": 0, "time.gmtime": 0, "time.ctime": 0, "time.asctime": 0,
                         "time.strftime": 1, "email.utils.formatdate": 0}  # fmt: skip
# Monotonic clocks time durations and timeouts (fine); used as ``now`` or handed out as a clock they are wall time.
MONOTONIC = {"time.monotonic", "time.monotonic_ns", "time.perf_counter", "time.perf_counter_ns"}
NOW_NAMES = {"now", "now_ms", "at_ms", "clock"}
SQL_NOW = re.compile(
    r"""\b(?:date|time|datetime|julianday|unixepoch|strftime)\s*\([^)]*['"]now['"]|\bcurrent_(?:timestamp|date|time)\b"""
    r"""|\bunixepoch\s*\(\s*\)""",
    re.IGNORECASE,
)


class WallClockReads(ast.NodeVisitor):
    """Every place a module reads the wall clock: ``(line, what)``. Names are resolved through the module's
    imports (``import time as t``, ``from datetime import datetime``); docstrings are prose, not SQL."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        self.found: list[tuple[int, str]] = []
        self.docstrings = {id(docstring) for node in ast.walk(tree) if (docstring := _docstring(node)) is not None}
        self.called: set[int] = set()
        self.visit(tree)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:  # ``import email.utils`` binds ``email``; ``import a.b as c`` binds ``c``
            top = alias.name.split(".")[0]
            self.aliases[alias.asname or top] = alias.name if alias.asname else top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def visit_Call(self, node: ast.Call) -> None:
        self.called.add(id(node.func))
        name = self.dotted(node.func)
        if name in WALL_WITHOUT_ARGUMENT and len(node.args) + len(node.keywords) <= WALL_WITHOUT_ARGUMENT[name]:
            self.found.append((node.lineno, f"{name}() without a time"))
        for keyword in node.keywords:
            if keyword.arg in NOW_NAMES and self.monotonic_call(keyword.value):
                self.found.append((node.lineno, f"a monotonic clock passed as {keyword.arg}="))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        names = [target.id for target in node.targets if isinstance(target, ast.Name)]
        if any("now" in name for name in names) and self.monotonic_call(node.value):
            self.found.append((node.lineno, f"a monotonic clock assigned to {names[0]}"))
        self.generic_visit(node)

    def monotonic_call(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and self.dotted(n.func) in MONOTONIC for n in ast.walk(node))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.reference(node, self.dotted(node))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self.reference(node, self.aliases.get(node.id))

    def reference(self, node: ast.expr, name: str | None) -> None:
        if name in WALL:
            self.found.append((node.lineno, name))
        elif name in MONOTONIC and id(node) not in self.called:
            self.found.append((node.lineno, f"{name} handed out as a clock"))

    def visit_Constant(self, node: ast.Constant) -> None:
        match = SQL_NOW.search(node.value) if isinstance(node.value, str) else None
        if match is not None and id(node) not in self.docstrings:
            self.found.append((node.lineno, f"SQL reading the time: {match.group(0)!r}"))


def _docstring(node: ast.AST) -> ast.Constant | None:
    """The docstring's constant of a module, class or function (prose, which may name ``datetime('now')``)."""
    if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
        return None
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.value
    return None


def wall_clock_reads(source: str) -> list[tuple[int, str]]:
    """Where ``source`` reads the wall clock."""
    return sorted(WallClockReads(ast.parse(source)).found)


KNOWN: dict[str, str] = {}  # a module with a known wall-clock read, and why (none now)


def package_modules() -> list[Any]:
    """Every module of the package but the clock module; a known defect is a strict xfail."""
    params = []
    for module in sorted(PACKAGE.rglob("*.py")):
        relative = module.relative_to(PACKAGE).as_posix()
        if relative in CLOCK_MODULES:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN[relative])] if relative in KNOWN else []
        params.append(pytest.param(module, id=relative, marks=marks))
    return params


@pytest.mark.parametrize("module", package_modules())
def test_no_module_reads_the_wall_clock(module: Path) -> None:
    """No module of the package reads the wall clock itself: time comes from the injected clock
    (``asyncq.clock.wall_clock_ms`` by default). ``time.monotonic``/``perf_counter`` and the loop's time are fine
    for timeouts and durations (``started = time.monotonic()``), not as ``now`` or as a clock handed to something."""
    assert wall_clock_reads(module.read_text()) == []


def test_the_clock_module_is_the_one_that_reads_it() -> None:
    present = [name for name in CLOCK_MODULES if (PACKAGE / name).exists()]
    assert len(present) == 1, f"one clock module, found {present}"
    assert wall_clock_reads((PACKAGE / present[0]).read_text()) != []  # the scan does see the one real read


READS = {
    "time.time": "import time\nnow = time.time()",
    "time_ns alias": "import time as t\nstamp = t.time_ns() // 1_000_000",
    "from-import": "from time import time\nstamp = time()",
    "datetime.now": "from datetime import datetime\nstamp = datetime.now()",
    "utcnow": "import datetime as dt\nstamp = dt.datetime.utcnow()",
    "date.today": "from datetime import date\nday = date.today()",
    "gmtime()": "import time\nparts = time.gmtime()",
    "strftime(fmt)": "import time\ntext = time.strftime('%H:%M')",
    "formatdate()": "import email.utils\nheader = email.utils.formatdate()",
    "a wall clock handed out": "import time\nclock = time.time",
    "monotonic as now": "import time\nrun(now_ms=int(time.monotonic() * 1000))",
    "monotonic assigned to now": "import time\nnow = time.monotonic()",
    "monotonic handed out": "import time\nopen(clock=time.monotonic)",
    "SQL datetime('now')": "SQL = \"UPDATE jobs SET at = datetime('now')\"",
    "SQL strftime": "SQL = \"SELECT strftime('%s', 'now')\"",
    "SQL CURRENT_TIMESTAMP": "SQL = 'INSERT INTO t (at) VALUES (CURRENT_TIMESTAMP)'",
    "SQL unixepoch()": "SQL = 'SELECT unixepoch()'",
}
NOT_READS = {
    "a duration": "import time\nstarted = time.monotonic()\nspent = time.monotonic() - started",
    "a timeout": "import time\ndeadline = time.perf_counter() + 5\nleft = deadline - time.perf_counter()",
    "a conversion": "import time\ntext = time.strftime('%H', time.gmtime(ms // 1000))",
    "from a timestamp": "from datetime import UTC, datetime\nwhen = datetime.fromtimestamp(ms / 1000, UTC)",
    "the loop's time": "import asyncio\nstart = asyncio.get_running_loop().time()",
    "a docstring": '"""No ``datetime(\'now\')`` in SQL."""',
    "time as a parameter": "SQL = 'UPDATE jobs SET at = :now WHERE lease_until <= :now'",
}


@pytest.mark.parametrize("source", READS.values(), ids=READS.keys())
def test_the_scan_finds_each_way_of_reading_the_wall_clock(source: str) -> None:
    assert wall_clock_reads(source) != []


@pytest.mark.parametrize("source", NOT_READS.values(), ids=NOT_READS.keys())
def test_the_scan_allows_durations_conversions_and_parameters(source: str) -> None:
    assert wall_clock_reads(source) == []
