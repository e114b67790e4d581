"""Bad input, per public call and per subcommand: at least 30 inputs each, every one refused with a clear error
before any change. After each: the error's type, the file's rows unchanged (a dump before and after) and no
transaction left open (another connection takes the write lock at once).

The inputs are built from families (wrong types, bools for ints, NaN/inf, huge ints, empty/long/unicode ids,
bodies that are not JSON, negative durations, unknown ids) so each call meets every family that applies to it.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import T0
from stable_ids import stable_repr

from asyncq import App, JobSpec, Pool, Queue, RetryPolicy, Ticket, enqueue_sync
from asyncq.cli.main import main as cli_main
from asyncq.core.lifecycle import Fence
from asyncq.worker.settings import PoolSettings

pytestmark = pytest.mark.timeout(120)

BAD_IDS: list[Any] = [
    "", "a b", "x" * 65, "é", "a\n", "a/b", "日本", None, 1, 1.5, True, b"id", ["a"], {"a": 1}, "a\x00", " a",
]  # fmt: skip
# An operator's note is free text ("customer left"), so ids' bad spellings "a b", "é" and "a/b" are good notes.
BAD_NOTES: list[Any] = [
    "", " ", "x" * 501, "a\n", "a\x00", "\t", "a\tb", "a\rb", "\x1b[31m", "a\x7f", "a\u2028b", " a", "a ",
    None, 1, 1.5, True, b"note", ["a"], {"a": 1},
]  # fmt: skip
BAD_INTS: list[Any] = [-1, 0.5, True, False, 10**30, math.nan, math.inf, "3", None, [1], 2**63]
BAD_DURATIONS: list[Any] = [-1, -0.001, math.nan, math.inf, -math.inf, True, "1s", b"1", [1], 10**30, 1e300]
BAD_BODIES: list[Any] = [math.nan, math.inf, {1, 2}, b"bytes", object(), {"a": math.nan}, {"a": {1, 2}}, "x" * 70_000]


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = sqlite3.connect(path)
    try:
        tables = [name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1")]
        return {table: con.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in tables}
    finally:
        con.close()


def lock_is_free(path: Path) -> bool:
    con = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return True
    finally:
        con.close()


Call = Callable[[Queue, Any], Awaitable[object]]


def facade_cases() -> list[tuple[str, Call, Any]]:
    """(name, call with one bad value, the value): at least 30 per public call."""
    cases: list[tuple[str, Call, Any]] = []

    def add(name: str, call: Call, values: list[Any]) -> None:
        cases.extend((name, call, value) for value in values)

    add("enqueue", lambda q, v: q.enqueue(v, {}), BAD_IDS)
    add("enqueue", lambda q, v: q.enqueue("ok", v), BAD_BODIES)
    add("enqueue", lambda q, v: q.enqueue("ok", {}, max_attempts=v), BAD_INTS[:8])
    add("enqueue", lambda q, v: q.enqueue("ok", {}, ttl=v), BAD_DURATIONS)
    add("enqueue_many", lambda q, v: q.enqueue_many([JobSpec("ok", {}), JobSpec(v, {})]), BAD_IDS)
    add("enqueue_many", lambda q, v: q.enqueue_many([JobSpec("ok", {}), v]), [("a", {}), "a", None, 1, {"id": "a"}])
    add("enqueue_many", lambda q, v: q.enqueue_many([JobSpec("ok", {}, delay=v)]), BAD_DURATIONS)
    add("claim", lambda q, v: q.claim(v), BAD_IDS)
    add("claim", lambda q, v: q.claim("w1", limit=v), [*BAD_INTS, 0, 1001])
    add("claim", lambda q, v: q.claim("w1", queue=v), BAD_IDS[:6])
    add("claim", lambda q, v: q.claim("w1", lease=v), BAD_DURATIONS)
    for name in ("redrive", "cancel"):
        add(name, lambda q, v, name=name: getattr(q, name)(v, "note"), BAD_IDS)
        add(name, lambda q, v, name=name: getattr(q, name)("p-1", v), BAD_NOTES)
        add(name, lambda q, v, name=name: getattr(q, name)("unknown-job", "note"), ["unknown"])
    add("redrive", lambda q, v: q.redrive("p-1", "note", ttl=v), BAD_DURATIONS)
    add("get", lambda q, v: q.get(v), [*BAD_IDS, *BAD_IDS])
    add("history", lambda q, v: q.history(v), [*BAD_IDS, *BAD_IDS])
    add("list_jobs", lambda q, v: q.list_jobs(status=v), ["", "running", 1, True, b"dead", "DEAD", "dead "])
    add("list_jobs", lambda q, v: q.list_jobs(limit=v), [*BAD_INTS, 0, 1002])
    add("list_jobs", lambda q, v: q.list_jobs(after=v), BAD_INTS)
    add("list_jobs", lambda q, v: q.list_jobs(newest=v), [1, 0, "yes", None])
    add("prune", lambda q, v: q.prune(v), BAD_DURATIONS)
    add("prune", lambda q, v: q.prune(60, v), [("pending",), ("leased",), (), ("done", "x"), (1,)])
    add("prune", lambda q, v: q.prune(60, vacuum=v), [1, "yes", None])
    add("prune", lambda q, v: q.prunable(v), BAD_DURATIONS)
    add("prune", lambda q, v: q.prunable(60, limit=v), [True, 1.5, -2, "3"])
    return cases


FACADE = facade_cases()


def test_every_public_call_meets_at_least_30_bad_inputs() -> None:
    counts: dict[str, int] = {}
    for name, _call, _value in FACADE:
        counts[name] = counts.get(name, 0) + 1
    assert min(counts.values()) >= 30, counts


@pytest.fixture
async def filled(path: Path) -> Queue:
    """A queue with a pending job ``p-1`` and a leased one, kept open for the cases of one test."""
    queue = await Queue.open(path, clock=lambda: T0)
    await queue.enqueue_many([JobSpec("p-1", {"n": 1}), JobSpec("l-1", {"n": 2})])
    await queue.claim("w0", limit=1)  # p-1 is claimed first (oldest): claim the other one instead below
    return queue


async def test_bad_input_to_the_facade_is_refused_before_any_change(filled: Queue, path: Path) -> None:
    queue = filled
    try:
        before = dump(path)
        for name, call, value in FACADE:
            with pytest.raises((ValueError, TypeError)):
                await call(queue, value)
                pytest.fail(f"{name} accepted {value!r}")
            assert dump(path) == before, (name, value)
        assert lock_is_free(path)
    finally:
        await queue.close()


def forged_tickets(ticket: Ticket) -> list[Callable[[], Ticket]]:
    """Tickets a caller might build from a real one: every field of the ticket and its fence of a wrong type."""
    fence = ticket.fence
    wrong: list[Any] = [{"a": 1}, None, "1", 1.5, True, [1]]
    forged: list[Callable[[], Ticket]] = []
    for value in wrong:
        for name in ("token", "attempt", "lease_until"):
            forged.append(lambda name=name, value=value: replace(ticket, fence=fence._replace(**{name: value})))
        for name in ("deadline", "max_attempts", "seq"):
            forged.append(lambda name=name, value=value: replace(ticket, **{name: value}))
    for value in [None, 1, b"w", {"a": 1}]:
        forged.append(lambda value=value: replace(ticket, fence=fence._replace(owner=value)))
        forged.append(lambda value=value: replace(ticket, id=value))
    forged.append(lambda: replace(ticket, fence=tuple(fence)))  # type: ignore[arg-type]
    forged.append(lambda: replace(ticket, counted=1))
    return forged


async def test_a_ticket_forged_with_a_wrong_type_is_refused_before_any_statement(filled: Queue, path: Path) -> None:
    queue = filled
    try:
        [ticket] = await queue.claim("w1", limit=1)
        before = dump(path)
        forged = forged_tickets(ticket)
        assert len(forged) >= 30
        for forge in forged:
            with pytest.raises(TypeError, match="ticket"):
                bad = forge()  # refused as it is built: no statement can bind it
                await queue.finish(bad, "ok")
        with pytest.raises(TypeError):
            await queue.finish(tuple.__new__(Fence, ("w1", {"a": 1}, 1, 1)), "ok")  # type: ignore[arg-type]
        assert dump(path) == before
        assert lock_is_free(path)
        assert await queue.finish(ticket, "ok") == "done"  # the real ticket still lands
    finally:
        await queue.close()


@pytest.mark.parametrize(
    "kwargs",
    [*({"concurrency": v} for v in BAD_INTS), *({"lease": v} for v in BAD_DURATIONS),
     *({"poll_min": v} for v in BAD_DURATIONS), *({"job_timeout": v} for v in BAD_DURATIONS[:5]),
     {"retry": "fast"}, {"owner": "a/b"}, {"owner": "a b"}, {"linger": 0}, {"prefetch": -1}],
    ids=repr,
)  # fmt: skip
async def test_bad_pool_arguments_are_refused(queue: Queue, kwargs: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        Pool(queue, **kwargs)


POOL_REFUSALS = [
    ({"owner": ""}, ValueError, "owner must be a str of 1-64"),
    ({"observer": 1}, TypeError, "observer must be a PoolObserver, but a int has no on_claimed"),
    ({"observer": object()}, TypeError, "observer must be a PoolObserver"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), POOL_REFUSALS, ids=stable_repr)
async def test_a_pool_refuses_an_empty_owner_or_a_non_observer_leaving_nothing_behind(
    filled: Queue, path: Path, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Refused where the pool is built, whichever way it is: no task started, no row changed, no lock held, and
    ``Pool.open`` never opens the queue it was given the opener of."""
    before, tasks = dump(path), asyncio.all_tasks()
    opened: list[object] = []

    async def opener() -> Queue:
        opened.append(True)
        return filled

    try:
        with pytest.raises(error, match=message):
            Pool(filled, **kwargs)
        with pytest.raises(error, match=message):
            App().pool(filled, **kwargs)
        settings_kwargs = {key: value for key, value in kwargs.items() if key != "observer"}
        with pytest.raises(error, match=message):
            settings = PoolSettings(**settings_kwargs)
            await Pool.open(opener, settings, observer=kwargs.get("observer"))
        assert opened == []
        assert asyncio.all_tasks() == tasks  # nothing started: no worker, no renewer, no batcher
        assert dump(path) == before and lock_is_free(path)
    finally:
        await filled.close()


@pytest.mark.parametrize(
    "kwargs",
    [*({"base": v} for v in BAD_DURATIONS), *({"cap": v} for v in BAD_DURATIONS), {"jitter": 0.5},
     {"base": 2, "cap": 1}, {"cap": 8 * 86_400}, {"base": 3601}, *({"base_ms": v} for v in BAD_INTS if v is not None)],
    ids=repr,
)  # fmt: skip
def test_a_bad_retry_policy_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        RetryPolicy(**kwargs)


def test_enqueue_sync_refuses_bad_input_inside_the_callers_transaction(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    try:
        enqueue_sync(con, "first", {})  # the tables exist; later refusals must leave them as they are
        before = dump(tmp_path / "app.db")
        bad = [{"job_id": v} for v in BAD_IDS] + [{"body": v} for v in BAD_BODIES]
        bad += [{"now_ms": v} for v in BAD_INTS if v is not None] + [{"ttl": v} for v in BAD_DURATIONS]
        assert len(bad) >= 30
        for case in bad:
            arguments = {"job_id": "ok", "body": {}} | case
            with pytest.raises((ValueError, TypeError)):
                enqueue_sync(con, arguments.pop("job_id"), arguments.pop("body"), **arguments)
                pytest.fail(f"enqueue_sync accepted {case!r}")
            assert not con.in_transaction
        assert dump(tmp_path / "app.db") == before
    finally:
        con.close()


# -- the command line --------------------------------------------------------------------------------------

SUBCOMMAND_BAD: dict[str, list[list[str]]] = {
    "enqueue": [["enqueue", v, "{}"] for v in ("", "a b", "x" * 65, "é")]
    + [["enqueue", "e-1", v] for v in ("{", "NaN", "[1,", '{"a":1,"a":2}', "'x'", "Infinity", "01", "")]
    + [["enqueue", "e-1", "{}", "--max-attempts", v] for v in ("0", "-1", "1001", "x", "1.5", "99999999999999")]
    + [["enqueue", "e-1", "{}", "--ttl", v] for v in ("0s", "-1s", "2x", "", "366d", "nan")]
    + [["enqueue", "e-1", "{}", "--delay", v] for v in ("-1s", "zz", "400d", "nan", "1.5.5s")]
    + [["enqueue", "e-1", "{}", "--queue", v] for v in ("", "a b", "x" * 65)],
    "jobs": [["jobs", "--after", v] for v in ("99999999999999999999", "-1", "x", "1.5", "")]
    + [["jobs", "--limit", v] for v in ("0", "-1", "x", "100000", "1e3")]
    + [["jobs", "--status", v] for v in ("running", "", "DEAD", "1")]
    + [["jobs", "--queue", v] for v in ("", "a b", "x" * 65, "é")]
    + [["jobs", "--reason", v] for v in ("", "a b", "x" * 65)]
    + [["jobs", v] for v in ("extra", "--bogus", "-x")]
    + [["jobs", "--after", "1", "--after"], ["jobs", "--limit"], ["jobs", "--status"], ["jobs", "--newest", "1"]]
    + [["jobs", "--db", ""], ["jobs", "--timeout", "-1"], ["jobs", "--timeout", "nan"]],
    "show": [["show", v] for v in ("", "a b", "x" * 65, "é", "unknown-job", "a/b", "日本", " a")]
    + [["show"], ["show", "a", "b"], ["show", "p-1", "--bogus"], ["show", "p-1", "--db", ""]]
    + [["show", "p-1", "--timeout", v] for v in ("-1", "nan", "x", "inf")]
    + [["show", f"missing-{n}"] for n in range(14)],
    "redrive": [["redrive", v, "--note", "n"] for v in ("", "a b", "x" * 65, "é", "unknown-job", "p-1")]
    + [["redrive", "x-1", "--note", v] for v in ("", " ", "x" * 501, "a\nb", "a\x1b")]
    + [["redrive", "x-1", "--note", "n", "--ttl", v] for v in ("0s", "-1s", "2x", "", "400d")]
    + [["redrive", "--reason", v, "--note", "n"] for v in ("", "retry", "x", "1")]
    + [["redrive", "--note", "n"], ["redrive", "x-1"], ["redrive", "x-1", "--reason", "permanent", "--note", "n"]]
    + [["redrive", "x-1", "--note", "n", "--limit", "2"]]
    + [["redrive", "--reason", "permanent", "--note", "n", "--limit", v] for v in ("0", "x", "-2")]
    + [["redrive", f"missing-{n}", "--note", "n"] for n in range(6)],
    "cancel": [["cancel", v, "--note", "n"] for v in ("", "a b", "x" * 65, "é", "unknown-job")]
    + [["cancel", "p-1", "--note", v] for v in ("", " ", "x" * 501, "a\nb", "a\x00b", "\t")]
    + [["cancel", "p-1"], ["cancel"], ["cancel", "p-1", "extra", "--note", "n"], ["cancel", "p-1", "--note"]]
    + [["cancel", f"missing-{n}", "--note", "n"] for n in range(15)],
    "prune": [["prune", "--older-than", v] for v in ("", "-1s", "x", "1.5.5s", "nan", "99999999d")]
    + [["prune", "--older-than", "1s", "--status", v] for v in ("pending", "leased", "", "x", "DEAD")]
    + [["prune", "--older-than", "1s", "--limit", v] for v in ("x", "-2", "1.5")]
    + [["prune"], ["prune", "--vacuum", "--older-than", "1s"], ["prune", "--older-than"]]
    + [["prune", "--older-than", "1s", v] for v in ("extra", "--bogus")]
    + [["prune", "--older-than", "1s", "--timeout", v] for v in ("-1", "nan", "x")]
    + [["prune", "--older-than", f"{n}q"] for n in range(10)],
}


@pytest.fixture
def cli_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A queue file with a pending job ``p-1``, a leased ``l-1`` and a dead ``x-1``, in the test's folder."""

    async def build() -> None:
        async with await Queue.open(tmp_path / "q.db", clock=lambda: T0) as queue:
            await queue.enqueue_many([JobSpec("x-1", {}, max_attempts=1), JobSpec("p-1", {}), JobSpec("l-1", {})])
            [doomed] = await queue.claim("w0")
            await queue.finish(doomed, "permanent")
            await queue.claim("w0")

    asyncio.run(build())
    monkeypatch.chdir(tmp_path)
    return tmp_path / "q.db"


@pytest.mark.parametrize("subcommand", sorted(SUBCOMMAND_BAD))
def test_bad_input_to_each_subcommand_is_one_line_and_changes_nothing(
    subcommand: str, cli_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = SUBCOMMAND_BAD[subcommand]
    assert len(cases) >= 30, (subcommand, len(cases))
    before = dump(cli_file)
    for argv in cases:
        full = argv if "--db" in argv else [*argv, "--db", "q.db"]
        code = cli_main(full)
        out, err = capsys.readouterr()
        assert code in (1, 2), (full, code, out, err)
        assert out == "" and "Traceback" not in err and err.count("\n") == 1, (full, err)
        assert err.startswith("asyncq: error: ") or err.startswith("usage:") is False, (full, err)
        assert dump(cli_file) == before, full
    assert lock_is_free(cli_file)


async def test_an_operators_note_is_free_text(filled: Queue) -> None:
    await filled.enqueue("c-1", {})
    entry = (await filled.cancel("c-1", note="customer left: ticket #42, é 日本")).audit
    assert entry is not None and entry.note == "customer left: ticket #42, é 日本"
    job = await filled.get("c-1")
    assert job is not None and job.reason == "cancelled"


async def test_a_group_commit_refuses_an_offer_that_is_not_one_before_any_statement(queue: Queue) -> None:
    """``Queue.commit_cycle(offer=)`` takes a ``core.offers.Offer``: a tuple of the same values is refused with
    ``TypeError`` before anything runs, and the ready job it would have claimed stays pending."""
    await queue.enqueue("ready", {})
    with pytest.raises(TypeError, match=r"offer must be a core\.offers\.Offer, not tuple"):
        await queue.commit_cycle([], "w1", [("default", 1)], offer=(1, 2, True))  # type: ignore[arg-type]
    job = await queue.get("ready")
    assert job is not None and (job.status, job.owner, job.token) == ("pending", None, 0)
    assert not queue.store._file.conn._conn.in_transaction  # type: ignore[attr-defined]
