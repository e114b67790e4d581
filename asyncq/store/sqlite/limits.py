"""A limited queue's claim on SQLite (``core.flow_limits``; docs/flow-control.md, "Limits"), and what operators read
of the limits in force.

The plain claim (``statements.CLAIM_RANKED``) takes nothing from a queue with limits; the group commit then runs
``claim_limited`` for it, in the same transaction: it reads the queue's limits, its rate state and its live leases,
asks ``core.flow_limits.allowance`` how many jobs it may take, claims them with ``CLAIM_LIMITED`` (the window walk,
which applies the per-key limit row by row) and, under a per-key limit when that came back short, ``CLAIM_BY_KEYS``
(the key walk), then advances the rate's state. SQLite's write lock serialises every claim of the file, so
the count a claim reads is exact: no other claim can land between the count and the lease.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from asyncq.core.claim_plan import limited_take
from asyncq.core.flow_limits import (
    Hold,
    Limits,
    LimitState,
    LimitUsage,
    allowance,
    by_keys,
    claim_window,
    held_by_keys,
    rate_after,
    usage_of,
)
from asyncq.store.sqlite.statements import CLAIMED

_LIMITS = "limit_concurrency, limit_per_key, limit_rate, limit_per_ms, limit_burst"

#: Whether the queue has limits (a primary-key read; what a claim that came back short asks).
IS_LIMITED = (
    "SELECT 1 FROM asyncq_queues WHERE queue = :queue"
    " AND coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL"
)
LIMIT_SETTINGS = f"SELECT {_LIMITS}, rate_tat_us, paused_at IS NOT NULL FROM asyncq_queues WHERE queue = :queue"
# The queue's live leases: a range of ``asyncq_jobs_leased`` (queue, status, lease_until), the first the earliest.
LIVE_LEASES = """
SELECT count(*), min(lease_until) FROM asyncq_jobs WHERE status = 'leased' AND queue = :queue AND lease_until > :now
"""
LIVE_BY_KEY = """
SELECT limit_key, count(*) FROM asyncq_jobs
WHERE status = 'leased' AND queue = :queue AND lease_until > :now AND limit_key IS NOT NULL GROUP BY limit_key
"""
SET_RATE_STATE = "UPDATE asyncq_queues SET rate_tat_us = :tat_us WHERE queue = :queue"
LIMITED_QUEUES = f"""
SELECT queue, {_LIMITS}, rate_tat_us FROM asyncq_queues
WHERE coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL ORDER BY queue
"""

# The window walk: CLAIM_RANKED's branches and order, each branch reading at most ``:window`` jobs of its index (the
# first of the queue's claim order), then leaving out the jobs of the keys at their limit (``live`` counts each key's
# live leases, in the queue's leased range; ``full`` are those at ``:per_key``) and keeping of each other key's jobs
# only as many as its free slots (``nth``: the job's place among its key's, in the claim order). A job without a key
# is bound by the queue's limits only. ``:limit`` is what the queue's slots and rate allow
# (``core.flow_limits.allowance``); ``:per_key`` NULL: no per-key limit (then nothing is left out). A paused queue
# never gets here (``claim_limited`` reads it first, under the write lock). The window bounds the walk: the jobs of
# full keys ranked past it are reached by the key walk (``CLAIM_BY_KEYS``), not by walking them.
CLAIM_LIMITED = (
    """
WITH flow AS (SELECT :now - max_wait_ms AS late_at FROM asyncq_queues WHERE queue = :queue),
live AS MATERIALIZED (
  SELECT limit_key, count(*) AS n FROM asyncq_jobs
  WHERE status = 'leased' AND queue = :queue AND lease_until > :now AND limit_key IS NOT NULL GROUP BY limit_key
),
full AS (SELECT limit_key FROM live WHERE n >= :per_key),
ready AS (
  SELECT * FROM (SELECT seq, 1 AS late, priority, available_at, limit_key FROM asyncq_jobs
                 WHERE status = 'pending' AND queue = :queue AND priority = 0
                   AND available_at <= (SELECT late_at FROM flow)
                 ORDER BY available_at, seq LIMIT :window)
  WHERE limit_key IS NULL OR limit_key NOT IN full
  UNION ALL
  SELECT * FROM (SELECT seq, 1 AS late, priority, available_at, limit_key FROM asyncq_jobs
                 WHERE status = 'pending' AND queue = :queue AND priority <> 0
                   AND available_at <= (SELECT late_at FROM flow)
                 ORDER BY available_at, seq LIMIT :window)
  WHERE limit_key IS NULL OR limit_key NOT IN full
  UNION ALL
  SELECT * FROM (SELECT seq, 0, priority, available_at, limit_key FROM asyncq_jobs
                 WHERE status = 'pending' AND queue = :queue AND +available_at <= :now
                   AND +available_at > ifnull((SELECT late_at FROM flow), -1)
                 ORDER BY priority DESC, available_at, seq LIMIT :window)
  WHERE limit_key IS NULL OR limit_key NOT IN full
  UNION ALL
  SELECT * FROM (SELECT seq, available_at <= ifnull((SELECT late_at FROM flow), -1) AS late, priority, available_at,
                   limit_key
                 FROM asyncq_jobs WHERE status = 'leased' AND lease_until <= :now AND queue = :queue
                 ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT :window)
  WHERE limit_key IS NULL OR limit_key NOT IN full
),
ranked AS (
  SELECT seq, late, priority, available_at, limit_key,
    row_number() OVER (PARTITION BY limit_key
                       ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq) AS nth
  FROM ready
),
fits AS (
  SELECT r.seq, r.late, r.priority, r.available_at FROM ranked r
  WHERE r.limit_key IS NULL OR :per_key IS NULL
    OR r.nth + ifnull((SELECT n FROM live WHERE live.limit_key = r.limit_key), 0) <= :per_key
)
UPDATE asyncq_jobs
SET status = 'leased', attempts = attempts + 1, token = token + 1, owner = :owner,
    lease_until = min(:now + :lease_ms, deadline), reason = NULL
WHERE seq IN (
  SELECT seq FROM fits ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT :limit)
RETURNING """
    + CLAIMED
)

# The key walk, when the window walk came back short under a per-key limit: every key with pending jobs, one seek
# each of ``asyncq_jobs_keyed`` (queue, limit_key, priority DESC, available_at: keyed pending jobs only), from the
# first key to the last (``keys``); of each key with free slots (``room``), its best ready jobs, at most its free
# slots, by priority, then ready time, then seq; the best ``:limit`` of them all. Its cost is one seek a key with
# pending jobs, whatever their backlogs. It sees this transaction's claims (the window walk's) in ``live``. ``INDEXED
# BY``: the ranked index has the same order after the queue, and a planner taking it would walk a big key's backlog.
CLAIM_BY_KEYS = (
    """
WITH RECURSIVE live AS MATERIALIZED (
  SELECT limit_key, count(*) AS n FROM asyncq_jobs
  WHERE status = 'leased' AND queue = :queue AND lease_until > :now AND limit_key IS NOT NULL GROUP BY limit_key
),
keys(k) AS (
  SELECT (SELECT min(limit_key) FROM asyncq_jobs INDEXED BY asyncq_jobs_keyed
          WHERE status = 'pending' AND queue = :queue AND limit_key IS NOT NULL)
  UNION ALL
  SELECT (SELECT min(limit_key) FROM asyncq_jobs INDEXED BY asyncq_jobs_keyed
          WHERE status = 'pending' AND queue = :queue AND limit_key IS NOT NULL AND limit_key > keys.k)
  FROM keys WHERE keys.k IS NOT NULL
),
room AS MATERIALIZED (
  SELECT k, :per_key - ifnull((SELECT n FROM live WHERE live.limit_key = k), 0) AS free FROM keys WHERE k IS NOT NULL
),
candidates AS (
  SELECT j.seq, j.priority, j.available_at, j.limit_key, r.free FROM room r JOIN asyncq_jobs j
  ON j.seq IN (SELECT s.seq FROM asyncq_jobs s INDEXED BY asyncq_jobs_keyed
               WHERE s.status = 'pending' AND s.queue = :queue AND s.limit_key = r.k AND s.limit_key IS NOT NULL
                 AND s.available_at <= :now
               ORDER BY s.limit_key, s.priority DESC, s.available_at, s.seq LIMIT :per_key)
  WHERE r.free > 0
),
fits AS (
  SELECT seq, priority, available_at FROM (
    SELECT c.seq, c.priority, c.available_at, c.free,
      row_number() OVER (PARTITION BY c.limit_key ORDER BY c.priority DESC, c.available_at, c.seq) AS nth
    FROM candidates c)
  WHERE nth <= free
)
UPDATE asyncq_jobs
SET status = 'leased', attempts = attempts + 1, token = token + 1, owner = :owner,
    lease_until = min(:now + :lease_ms, deadline), reason = NULL
WHERE seq IN (SELECT seq FROM fits ORDER BY priority DESC, available_at, seq LIMIT :limit)
RETURNING """
    + CLAIMED
)


def is_limited(con: sqlite3.Connection, queue: str) -> bool:
    """Whether ``queue`` has limits now (its plain claim takes nothing then)."""
    return con.execute(IS_LIMITED, {"queue": queue}).fetchone() is not None


def limit_state(con: sqlite3.Connection, queue: str, now_ms: int) -> LimitState | None:
    """What ``queue``'s limited claim reads first: ``None`` if it has no limits (any more)."""
    row = con.execute(LIMIT_SETTINGS, {"queue": queue}).fetchone()
    limits = None if row is None else Limits(*row[:5])
    if limits is None or not limits.limited:
        return None
    live, first_expiry = con.execute(LIVE_LEASES, {"queue": queue, "now": now_ms}).fetchone()
    return LimitState(limits, row[5], bool(row[6]), live, first_expiry)


def claim_limited(
    con: sqlite3.Connection, queue: str, want: int, counts: bool, params: dict[str, Any]
) -> tuple[list[tuple[Any, ...]], Hold | None] | None:
    """Claim up to ``want`` jobs of the limited ``queue`` (``params``: the claim's ``now``, ``owner``, ``lease_ms``),
    as its limits allow: the rows (``CLAIM_RANKED``'s columns) and what holds the queue when it took none; ``None``
    if the queue has no limits (the caller runs the plain claim). Never claims ahead (``counts`` false: nothing)."""
    now_ms = params["now"]
    state = limit_state(con, queue, now_ms)
    if state is None:
        return None
    allowed = allowance(queue, state, now_ms)
    asked = 0 if state.paused else limited_take(counts, want, allowed.jobs)
    if asked == 0:
        return [], None if state.paused else allowed.hold
    limits = state.limits
    shape = {
        "queue": queue,
        "limit": asked,
        "per_key": limits.per_key_concurrency,
        "window": claim_window(limits, asked),
    }
    taken = con.execute(CLAIM_LIMITED, params | shape).fetchall()
    if by_keys(limits, asked, len(taken)):
        taken += con.execute(CLAIM_BY_KEYS, params | shape | {"limit": asked - len(taken)}).fetchall()
    if taken and limits.rate is not None:
        con.execute(SET_RATE_STATE, {"queue": queue, "tat_us": rate_after(limits, state.tat_us, now_ms, len(taken))})
    return taken, None if taken else held_by_keys(queue, state)


def limit_usage(con: sqlite3.Connection, now_ms: int) -> list[LimitUsage]:
    """Every limited queue's limits and what they hold now (``core.flow_limits.LimitUsage``), by name."""
    usage = []
    for queue, *limits, tat_us in con.execute(LIMITED_QUEUES).fetchall():
        live, _first = con.execute(LIVE_LEASES, {"queue": queue, "now": now_ms}).fetchone()
        per_key = dict(con.execute(LIVE_BY_KEY, {"queue": queue, "now": now_ms}).fetchall())
        usage.append(usage_of(queue, Limits(*limits), tat_us, now_ms, live, per_key))
    return usage
