"""Bad input to every parameter of every lease lab function: ``ValueError`` before any change.

Each case checks four things: the error is ``ValueError``; both tables are unchanged (a full dump);
the inputs are unchanged (a deep copy compared after the call); no transaction is left open. The exact
valid edges are accepted.
"""

from __future__ import annotations

import copy
import math
import sqlite3
from collections import OrderedDict
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from conftest import fresh_copy

from asyncq.lab.lease import claim, enqueue, finish, open_queue, redrive, retry_delay, run_file, run_once

try:
    import lease_children as kids
except ImportError:  # tests/ imported as a package
    from tests import lease_children as kids

pytestmark = pytest.mark.timeout(60)

TIME_MAX = 10**15 - 60_000
TOKEN_MAX = 10**15


class D(dict):  # type: ignore[type-arg]
    pass


class S(str):
    __slots__ = ()


class I(int):  # noqa: E742
    pass


class F(float):
    pass


def bad_ints(low: int, high: int) -> list[object]:
    """Values that an exact int parameter in ``low … high`` must refuse."""
    return [low - 1, high + 1, True, False, float(low), I(low), str(low), None, Decimal(low), Fraction(low), [low]]


BAD_IDENTIFIERS: list[object] = [
    "",
    "a" * 65,
    "a\n",
    "\na",
    "a b",
    "a.b",
    "a/b",
    "a:b",
    "é",
    "\u0430",  # Cyrillic а
    "w\u0430",
    "\uff41",  # fullwidth ａ
    "\uff11",  # fullwidth １
    "a\x00",
    "ß",
    S("a"),
    b"a",
    None,
    1,
    ["a"],
]
GOOD_IDENTIFIERS = ["a" * 64, "-", "_", "Az09_-", "0"]

BAD_TIMES = [-1, TIME_MAX + 1, True, False, 1000.0, I(1000), "1000", None, Decimal(1000)]
BAD_JITTERS: list[object] = [
    True,
    False,
    math.nan,
    math.inf,
    -math.inf,
    1.0000001,
    -1e-300,
    -1,
    2,
    Decimal("0.5"),
    Fraction(1, 2),
    "0.5",
    None,
    F(0.5),
    I(1),
    complex(0.5, 0),
]
GOOD_JITTERS: list[object] = [0, 1, 0.0, 1.0, -0.0, 0.5, 5e-324, 0.9999999999999999]


def ticket_cases() -> list[tuple[str, object]]:
    cases: list[tuple[str, object]] = [
        ("subclass", "D"),
        ("ordered", "OrderedDict"),
        ("missing", "lease_until"),
        ("extra", "status"),
        ("list", None),
        ("none", None),
    ]
    for key in ("id", "owner"):
        cases += [(key, bad) for bad in BAD_IDENTIFIERS]
    cases += [("qty", bad) for bad in bad_ints(1, 1000)]
    cases += [("token", bad) for bad in bad_ints(1, TOKEN_MAX)]
    cases += [("attempt", bad) for bad in bad_ints(1, 16)]
    cases += [("lease_until", bad) for bad in bad_ints(1, TOKEN_MAX)]
    return cases


def reshape(good: dict[str, Any], key: str, value: object) -> object:
    """A copy of ``good`` broken in one way: a subclass, a missing or extra key, or one bad value."""
    if key == "subclass":
        return D(good)
    if key == "ordered":
        return OrderedDict(good)
    if key == "missing":
        return {k: v for k, v in good.items() if k != value}
    if key == "extra":
        return {**good, value: 1}
    if key == "list":
        return list(good.items())
    if key == "none":
        return None
    return {**good, key: value}


def event_cases() -> list[tuple[str, object]]:
    cases: list[tuple[str, object]] = [
        ("subclass", "D"),
        ("ordered", "OrderedDict"),
        ("missing", "qty"),
        ("missing", "id"),
        ("extra", "ttl"),
        ("list", None),
        ("none", None),
    ]
    cases += [("id", bad) for bad in BAD_IDENTIFIERS]
    cases += [("qty", bad) for bad in bad_ints(1, 1000)]
    return cases


# --- the queue every DB case runs against -----------------------------------------------------------


@pytest.fixture(scope="module")
def lab_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A queue where a valid call of every function would change something: a sweepable row (``late``),
    a claimable one (``ready``), a held lease ``held`` (owner ``w``) and a dead job ``dead`` with one audit
    row. Built once; every test gets its own copy of the file."""
    file = tmp_path_factory.mktemp("inputs") / "template.db"
    connection = open_queue(file)
    assert enqueue(connection, {"id": "held", "qty": 5}, 1000, 10_000) is True
    assert enqueue(connection, {"id": "dead", "qty": 1}, 1000, 10_000) is True
    assert claim(connection, "w", 1000, 5000) is not None  # held: lease_until 6000
    dead = claim(connection, "w", 1000)
    assert dead is not None
    assert finish(connection, dead, "permanent", 1001) == "dead"
    assert redrive(connection, "dead", 1002, 10_000, "first") is True
    dead = claim(connection, "w", 1003)
    assert dead is not None and dead["id"] == "dead"
    assert finish(connection, dead, "permanent", 1004) == "dead"
    assert enqueue(connection, {"id": "late", "qty": 1}, 1000, 100) is True  # sweepable at 2000
    assert enqueue(connection, {"id": "ready", "qty": 2}, 1000, 10_000) is True
    connection.close()
    return file


@pytest.fixture
def path(tmp_path: Path, lab_template: Path) -> Path:
    """This module's queue file (conftest's ``con`` opens it): a fresh copy of ``lab_template``."""
    return fresh_copy(lab_template, tmp_path / "queue.db")


HELD = {"id": "held", "qty": 5, "owner": "w", "token": 1, "attempt": 1, "lease_until": 6000}


def refused(con: sqlite3.Connection, call: Callable[..., object], *args: object, **kwargs: object) -> None:
    """``call(*args, **kwargs)`` raises ValueError and changes neither the rows nor the inputs."""
    before = kids.dump(con)
    inputs = copy.deepcopy(without_connections((args, kwargs)))
    with pytest.raises(ValueError):
        call(*args, **kwargs)
    assert kids.dump(con) == before
    assert con.in_transaction is False
    assert same_inputs(without_connections((args, kwargs)), inputs)


def without_connections(value: Any) -> Any:
    """``(args, kwargs)`` with the borrowed connection left out (it cannot be copied, only checked)."""
    args, kwargs = value
    return [a for a in args if not isinstance(a, sqlite3.Connection)], kwargs


def same_inputs(now: object, then: object) -> bool:
    """Deep equality that also holds for NaN (an unchanged NaN is still the same input)."""
    if isinstance(now, float) and isinstance(then, float) and math.isnan(now):
        return math.isnan(then)
    if isinstance(now, dict) and isinstance(then, dict):
        return type(now) is type(then) and list(now) == list(then) and all(same_inputs(now[k], then[k]) for k in now)
    if callable(now) and not isinstance(now, type):  # a recorder: deep-copied, compared by its kind
        return type(now) is type(then)
    if isinstance(now, list | tuple) and isinstance(then, list | tuple):
        return type(now) is type(then) and len(now) == len(then) and all(map(same_inputs, now, then))
    return type(now) is type(then) and bool(now == then)


# --- retry_delay -----------------------------------------------------------------------------------

GOOD_DELAY = {"attempt": 3, "base_ms": 100, "cap_ms": 1000, "jitter": 1}


@pytest.mark.parametrize(
    ("name", "value"),
    [("attempt", v) for v in bad_ints(1, 16)]
    + [("base_ms", v) for v in bad_ints(1, 60_000)]
    + [("cap_ms", v) for v in [*bad_ints(100, 60_000), 99]]  # cap below base
    + [("jitter", v) for v in BAD_JITTERS],
)
def test_retry_delay_refuses(name: str, value: object) -> None:
    with pytest.raises(ValueError):
        retry_delay(**{**GOOD_DELAY, name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [("attempt", 1), ("attempt", 16), ("base_ms", 1), ("base_ms", 1000), ("cap_ms", 100), ("cap_ms", 60_000)]
    + [("jitter", v) for v in GOOD_JITTERS],
)
def test_retry_delay_accepts_the_edges(name: str, value: object) -> None:
    assert type(retry_delay(**{**GOOD_DELAY, name: value})) is int


def test_retry_delay_cap_may_equal_a_large_base() -> None:
    assert retry_delay(1, 60_000, 60_000, 1) == 60_000
    with pytest.raises(ValueError):
        retry_delay(1, 60_001, 60_001, 1)


# --- open_queue ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, 1, 1.5, "", ":memory:", ["q.db"], "q\x00.db"])
def test_open_queue_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        open_queue(value)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# --- enqueue ---------------------------------------------------------------------------------------

GOOD_EVENT = {"id": "new", "qty": 3}


@pytest.mark.parametrize(("key", "value"), event_cases())
def test_enqueue_refuses_event(con: sqlite3.Connection, key: str, value: object) -> None:
    refused(con, enqueue, con, reshape(GOOD_EVENT, key, value), 2000, 1000, 3)


@pytest.mark.parametrize(
    ("name", "value"),
    [("now_ms", v) for v in BAD_TIMES]
    + [("ttl_ms", v) for v in bad_ints(1, 60_000)]
    + [("max_attempts", v) for v in bad_ints(1, 16)],
)
def test_enqueue_refuses(con: sqlite3.Connection, name: str, value: object) -> None:
    kwargs = {"now_ms": 2000, "ttl_ms": 1000, "max_attempts": 3, name: value}
    refused(con, enqueue, con, dict(GOOD_EVENT), **kwargs)


def test_enqueue_refuses_bad_input_even_for_an_existing_id(con: sqlite3.Connection) -> None:
    refused(con, enqueue, con, {"id": "held", "qty": 5}, 2000, 0)
    refused(con, enqueue, con, {"id": "held", "qty": 6}, 2000, 1000, 0)  # not Conflict: bad input first


@pytest.mark.parametrize(
    ("event", "now", "ttl", "max_attempts"),
    [
        ({"id": "a" * 64, "qty": 1}, 0, 1, 1),
        ({"id": "-", "qty": 1000}, TIME_MAX, 60_000, 16),
        ({"qty": 2, "id": "Az09_-"}, 5, 7, 2),
    ],
)
def test_enqueue_accepts_the_edges(
    con: sqlite3.Connection, event: dict[str, Any], now: int, ttl: int, max_attempts: int
) -> None:
    kept = copy.deepcopy(event)
    assert enqueue(con, event, now, ttl, max_attempts) is True
    assert event == kept
    found = kids.row(con, event["id"])
    assert found is not None
    assert (found["qty"], found["deadline"], found["max_attempts"]) == (event["qty"], now + ttl, max_attempts)


# --- claim -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [("owner", v) for v in BAD_IDENTIFIERS]
    + [("now_ms", v) for v in BAD_TIMES]
    + [("lease_ms", v) for v in bad_ints(1, 60_000)]
    + [("fault", v) for v in [1, "after-claim", b"x"]],
)
def test_claim_refuses(con: sqlite3.Connection, name: str, value: object) -> None:
    kwargs = {"owner": "v", "now_ms": 2000, "lease_ms": 1000, "fault": None, name: value}
    refused(con, claim, con, **kwargs)


@pytest.mark.parametrize(
    ("owner", "now", "lease_ms"),
    [("a" * 64, 2000, 1), ("_", 2000, 60_000), ("v", TIME_MAX, 1000), ("v", 0, 1000)],
)
def test_claim_accepts_the_edges(con: sqlite3.Connection, owner: str, now: int, lease_ms: int) -> None:
    claim(con, owner, now, lease_ms)
    assert con.in_transaction is False


# --- finish ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), ticket_cases())
def test_finish_refuses_ticket(con: sqlite3.Connection, key: str, value: object) -> None:
    refused(con, finish, con, reshape(HELD, key, value), "ok", 2000)


@pytest.mark.parametrize(
    ("name", "value"),
    [("outcome", v) for v in ["OK", "ok ", "done", "", "retry\n", S("ok"), b"ok", None, 1, True]]
    + [("now_ms", v) for v in BAD_TIMES]
    + [("delay_ms", v) for v in bad_ints(0, 60_000)]
    + [("fault", v) for v in [1, "after-finish"]],
)
def test_finish_refuses(con: sqlite3.Connection, name: str, value: object) -> None:
    kwargs = {"outcome": "ok", "now_ms": 2000, "delay_ms": 0, "fault": None, name: value}
    refused(con, finish, con, dict(HELD), **kwargs)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("id", "a" * 64),
        ("owner", "a" * 64),
        ("qty", 1),
        ("qty", 1000),
        ("token", TOKEN_MAX),
        ("attempt", 16),
        ("lease_until", 1),
        ("lease_until", TOKEN_MAX),
    ],
)
def test_finish_accepts_ticket_edges_as_stale(con: sqlite3.Connection, key: str, value: object) -> None:
    ticket = {**HELD, key: value}
    kept = copy.deepcopy(ticket)
    before = kids.dump(con)
    assert finish(con, ticket, "ok", 2000) is False
    assert kids.dump(con) == before and ticket == kept


@pytest.mark.parametrize(("now", "delay"), [(0, 0), (2000, 60_000), (TIME_MAX, 0)])
def test_finish_accepts_time_and_delay_edges(con: sqlite3.Connection, now: int, delay: int) -> None:
    status = finish(con, dict(HELD), "retry", now, delay)
    assert status == ("dead" if delay == 60_000 else False if now == TIME_MAX else "pending")


# --- redrive ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [("job_id", v) for v in BAD_IDENTIFIERS]
    + [("now_ms", v) for v in BAD_TIMES]
    + [("ttl_ms", v) for v in bad_ints(1, 60_000)]
    + [("note", v) for v in BAD_IDENTIFIERS]
    + [("fault", v) for v in [1, "after-audit"]],
)
def test_redrive_refuses(con: sqlite3.Connection, name: str, value: object) -> None:
    kwargs = {"job_id": "dead", "now_ms": 2000, "ttl_ms": 1000, "note": "ops", "fault": None, name: value}
    refused(con, redrive, con, **kwargs)


@pytest.mark.parametrize(("now", "ttl", "note"), [(0, 1, "a" * 64), (TIME_MAX, 60_000, "-"), (2000, 1000, "Az09_-")])
def test_redrive_accepts_the_edges(con: sqlite3.Connection, now: int, ttl: int, note: str) -> None:
    assert redrive(con, "dead", now, ttl, note) is True
    found = kids.row(con, "dead")
    assert found is not None and (found["status"], found["deadline"]) == ("pending", now + ttl)
    assert kids.dump(con)["redrives"][-1][1:] == ("dead", 2, now, note)


# --- run_once / run_file ---------------------------------------------------------------------------


class Recorder:
    def __init__(self, value: object = None) -> None:
        self.value, self.calls = value, 0

    def __call__(self, *args: object) -> object:
        self.calls += 1
        return self.value


RUN_CASES = (
    [("owner", v) for v in BAD_IDENTIFIERS]
    + [("jitter", v) for v in BAD_JITTERS]
    + [("lease_ms", v) for v in bad_ints(1, 60_000)]
    + [("clock", v) for v in [None, 2000, "clock"]]
    + [("send", v) for v in [None, True, "send"]]
)
FIRST_CLOCKS = [-1, TIME_MAX + 1, True, 2000.0, I(2000), "2000", None, Decimal(2000)]


@pytest.mark.parametrize(("name", "value"), RUN_CASES)
def test_run_once_refuses(con: sqlite3.Connection, name: str, value: object) -> None:
    clock, send = Recorder(2000), Recorder(True)
    kwargs = {"owner": "v", "clock": clock, "send": send, "jitter": 1, "lease_ms": 1000, name: value}
    refused(con, run_once, con, **kwargs)
    assert send.calls == 0
    if name == "jitter":  # validated first: before the clock is read
        assert clock.calls == 0


@pytest.mark.parametrize("first", FIRST_CLOCKS)
def test_run_once_refuses_a_bad_first_clock(con: sqlite3.Connection, first: object) -> None:
    clock, send = Recorder(first), Recorder(True)
    refused(con, run_once, con, "v", clock, send, 1)
    assert (clock.calls, send.calls) == (1, 0)


@pytest.mark.parametrize("jitter", GOOD_JITTERS)
def test_run_once_accepts_every_valid_jitter(con: sqlite3.Connection, jitter: object) -> None:
    assert run_once(con, "v", Recorder(2000), Recorder(True), jitter) == {"id": "ready", "token": 1, "status": "done"}


@pytest.fixture
def queue_file(con: sqlite3.Connection, path: Path) -> Path:
    return path


@pytest.mark.parametrize(("name", "value"), [*RUN_CASES, *(("clock", Recorder(v)) for v in FIRST_CLOCKS)])
def test_run_file_refuses(con: sqlite3.Connection, queue_file: Path, name: str, value: object) -> None:
    clock, send = Recorder(2000), Recorder(True)
    kwargs = {"owner": "v", "clock": clock, "send": send, "jitter": 1, "lease_ms": 1000, name: value}
    refused(con, run_file, queue_file, **kwargs)
    assert send.calls == 0


@pytest.mark.parametrize("value", [None, 1, 1.5, ["q.db"], b"\xff"])
def test_run_file_refuses_a_path_that_is_no_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object
) -> None:
    # Not a str or PathLike at all: a format error (ValueError); FileNotFoundError is also a refusal.
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ValueError, FileNotFoundError)):
        run_file(value, "v", Recorder(2000), Recorder(True), 1)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
