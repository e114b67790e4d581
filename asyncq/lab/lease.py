"""The lease lab contract (``docs/lease-lab.md``), exactly, over asyncq's shared lifecycle.

This module only validates and adapts: the transitions, statements and transaction handling are
``asyncq.store.sqlite.engine``'s, the same ones the async ``Queue`` runs. It needs only the standard library.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from typing import Any

from asyncq.core.backoff import retry_delay
from asyncq.core.jobs import Finish, NewJob
from asyncq.core.lifecycle import LAB_OUTCOMES, OK, PERMANENT, RETRY, Fence
from asyncq.core.values import (
    TOKEN_MAX,
    check_choice,
    check_event,
    check_exact_dict,
    check_hook,
    check_identifier,
    check_int,
    check_ratio,
    check_time,
)
from asyncq.errors import BadAck, Conflict, Permanent, Retryable
from asyncq.store.sqlite import engine
from asyncq.store.sqlite.connection import open_file
from asyncq.store.sqlite.schema import LAB

__all__ = [
    "BadAck",
    "Conflict",
    "Permanent",
    "Retryable",
    "claim",
    "enqueue",
    "finish",
    "open_queue",
    "redrive",
    "retry_delay",
    "run_file",
    "run_once",
]

TICKET_KEYS = ("id", "qty", "owner", "token", "attempt", "lease_until")
RETRY_BASE_MS = 100
RETRY_CAP_MS = 1000

Fault = Callable[[str], object] | None


def open_queue(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open (creating if missing) the queue file with ``isolation_level=None``, a 1 s busy timeout,
    ``journal_mode=DELETE`` and ``synchronous=FULL``; existing jobs and audit rows are kept."""
    return open_file(path, LAB.ddl, journal_mode="DELETE", synchronous="FULL", timeout=1.0)


def enqueue(con: sqlite3.Connection, event: dict[str, Any], now_ms: int, ttl_ms: int, max_attempts: int = 3) -> bool:
    """Insert a pending job (``True``); the same id and qty again is ``False`` and keeps the whole row;
    the same id with another qty is ``Conflict``."""
    checked = check_event(event)
    check_time(now_ms)
    check_int(ttl_ms, "ttl_ms", 1, 60_000)
    check_int(max_attempts, "max_attempts", 1, 16)
    job = NewJob(
        id=checked["id"],
        payload={"qty": checked["qty"]},
        max_attempts=max_attempts,
        available_at=now_ms,
        deadline=now_ms + ttl_ms,
    )
    return engine.enqueue(con, LAB, [job])[0] is True  # the lab's jobs have no unique key


def claim(
    con: sqlite3.Connection, owner: str, now_ms: int, lease_ms: int = 1000, fault: Fault = None
) -> dict[str, Any] | None:
    """Sweep unclaimable jobs to dead, then lease the ready job with the smallest ``seq``; ``None`` if
    there is none (the sweep still commits)."""
    check_identifier(owner, "owner")
    check_time(now_ms)
    check_int(lease_ms, "lease_ms", 1, 60_000)
    check_hook(fault)
    claimed = engine.claim(con, LAB, owner, now_ms, lease_ms, fault=fault)
    if not claimed:
        return None
    job = claimed[0]
    return {
        "id": job.id,
        "qty": job.payload["qty"],
        "owner": job.fence.owner,
        "token": job.fence.token,
        "attempt": job.fence.attempt,
        "lease_until": job.fence.lease_until,
    }


def _check_ticket(ticket: object) -> dict[str, Any]:
    checked = check_exact_dict(ticket, "ticket", TICKET_KEYS)
    check_identifier(checked["id"], "ticket['id']")
    check_identifier(checked["owner"], "ticket['owner']")
    check_int(checked["qty"], "ticket['qty']", 1, 1000)
    check_int(checked["token"], "ticket['token']", 1, TOKEN_MAX)
    check_int(checked["attempt"], "ticket['attempt']", 1, 16)
    check_int(checked["lease_until"], "ticket['lease_until']", 1, TOKEN_MAX)
    return dict(checked)


def finish(
    con: sqlite3.Connection,
    ticket: dict[str, Any],
    outcome: str,
    now_ms: int,
    delay_ms: int = 0,
    fault: Fault = None,
) -> str | bool:
    """Record the outcome of a held lease and return the new status; ``False`` (nothing changes) when
    the ticket is stale: job missing or not leased, fields differ, lease or deadline passed."""
    held = _check_ticket(ticket)
    check_choice(outcome, "outcome", LAB_OUTCOMES)
    check_time(now_ms)
    check_int(delay_ms, "delay_ms", 0, 60_000)
    check_hook(fault)
    fence = Fence(held["owner"], held["token"], held["attempt"], held["lease_until"])
    item = Finish(held["id"], fence, outcome, delay_ms)
    status = engine.finish(con, LAB, [item], now_ms, expect={held["id"]: {"qty": held["qty"]}}, fault=fault)[0]
    return False if status is None else status


def redrive(con: sqlite3.Connection, job_id: str, now_ms: int, ttl_ms: int, note: str, fault: Fault = None) -> bool:
    """Re-arm a dead job (attempts 0, a new deadline) after writing an audit row; ``ValueError`` if the
    job is missing or not dead."""
    check_identifier(job_id, "job_id")
    check_time(now_ms)
    check_int(ttl_ms, "ttl_ms", 1, 60_000)
    check_identifier(note, "note")
    check_hook(fault)
    return engine.redrive(con, LAB, job_id, now_ms, now_ms + ttl_ms, note, fault=fault)


def _deliver(send: Callable[[dict[str, Any]], object], ticket: dict[str, Any], jitter: float) -> tuple[str, int]:
    """Call ``send`` once with a fresh ``{id, qty}`` and classify the result as ``(outcome, delay_ms)``."""
    try:
        answer = send({"id": ticket["id"], "qty": ticket["qty"]})
    except Retryable:
        return RETRY, retry_delay(ticket["attempt"], RETRY_BASE_MS, RETRY_CAP_MS, jitter)
    except Permanent:
        return PERMANENT, 0
    if answer is not True:
        raise BadAck(f"send returned {answer!r} for job {ticket['id']!r}, not True")
    return OK, 0


def run_once(
    con: sqlite3.Connection,
    owner: str,
    clock: Callable[[], int],
    send: Callable[[dict[str, Any]], object],
    jitter: float,
    lease_ms: int = 1000,
) -> dict[str, Any] | None:
    """Claim one job, deliver it with no transaction open, and finish it with a second clock reading.

    Returns ``{id, token, status}`` (``'stale'`` if the finish was refused) or ``None`` when nothing was
    ready. Errors other than ``Retryable``/``Permanent`` (and ``BadAck``) propagate with the job leased."""
    check_ratio(jitter, "jitter")
    check_identifier(owner, "owner")
    check_int(lease_ms, "lease_ms", 1, 60_000)
    if not callable(clock) or not callable(send):
        raise ValueError("clock and send must be callable")
    started = check_time(clock(), "clock()")
    ticket = claim(con, owner, started, lease_ms)
    if ticket is None:
        return None
    outcome, delay_ms = _deliver(send, dict(ticket), jitter)
    ended = check_time(clock(), "clock()")
    if ended < started:
        raise ValueError(f"clock() went backwards: {ended} < {started}")
    status = finish(con, ticket, outcome, ended, delay_ms)
    return {"id": ticket["id"], "token": ticket["token"], "status": "stale" if status is False else status}


def run_file(
    path: str | os.PathLike[str],
    owner: str,
    clock: Callable[[], int],
    send: Callable[[dict[str, Any]], object],
    jitter: float,
    lease_ms: int = 1000,
) -> dict[str, Any] | None:
    """``run_once`` on an existing queue file, with a connection it opens and always closes; a path that
    is not an existing regular file is ``FileNotFoundError`` and no file is ever created."""
    if not isinstance(path, str | os.PathLike):
        raise ValueError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    file = os.fspath(path)
    try:
        is_regular = isinstance(file, str) and file != ":memory:" and stat.S_ISREG(os.stat(file).st_mode)
    except (OSError, ValueError):  # ValueError: an embedded NUL byte
        is_regular = False
    if not is_regular:
        raise FileNotFoundError(f"no queue file at {file!r}")
    con = open_queue(file)
    try:
        return run_once(con, owner, clock, send, jitter, lease_ms)
    finally:
        con.close()
