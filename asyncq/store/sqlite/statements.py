"""Every lifecycle statement, once, by name. ``{jobs}``, ``{audit}``, ``{payload}`` and ``{scope}`` are
filled from a ``Layout``; values are always named parameters, and ``:now`` is always passed in (no
``datetime('now')``), so tests move time instead of sleeping.

The sweep runs first in every claim transaction: an unclaimable row (deadline passed, or attempts used
up) is parked as dead before the selection, in two statements so that each can seek an index.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar

# The finish plan's change and row (``core.finish_plan``), bound by ``finish_params``: named here for the SQL's sake.
from asyncq.core.claim_plan import RANK_PRIORITY_STEP
from asyncq.core.finish_plan import FinishChange as FinishChange
from asyncq.core.finish_plan import FinishRow as FinishRow
from asyncq.store.sqlite.graph_schema import LIVE_STATUSES
from asyncq.store.sqlite.schema import Layout

T = TypeVar("T")

# ``{live}``: the statuses the live-deadline index holds (the product's take ``waiting`` in: a job waiting for its
# dependencies ends at its deadline too). RETURNING gives each parked row's ``links`` (``core.dependencies``; the
# lab's: NULL): a row in a graph has its dependants and its group settled in the same transaction.
SWEEP_DEADLINE = """
UPDATE {jobs} SET status = 'dead', reason = 'deadline', owner = NULL, lease_until = NULL
WHERE {live} AND deadline <= :now AND (status <> 'leased' OR lease_until <= :now)
RETURNING seq, {links}
"""

SWEEP_EXHAUSTED = """
UPDATE {jobs} SET status = 'dead', reason = 'exhausted', owner = NULL, lease_until = NULL
WHERE status IN ('pending', 'leased') AND attempts >= max_attempts
  AND (status = 'pending' OR lease_until <= :now)
RETURNING seq, {links}
"""

# Oldest first by seq among ready rows: pending and available, or leased with an expired lease. ``:count`` is 1:
# the claim counts an attempt; a pool's claim ahead (jobs for its buffer, not started yet) passes 0, and the
# attempt is counted when a handler starts the job (ACTIVATE_ROWS, or the finish's ``new attempts``).
CLAIM = """
UPDATE {jobs}
SET status = 'leased', attempts = attempts + :count, token = token + 1, owner = :owner,
    lease_until = min(:now + :lease_ms, deadline), reason = NULL
WHERE seq IN (
  SELECT seq FROM (
    SELECT seq FROM (SELECT seq FROM {jobs} WHERE status = 'pending' AND available_at <= :now {scope}
                     ORDER BY seq LIMIT :limit)
    UNION ALL
    SELECT seq FROM (SELECT seq FROM {jobs} WHERE status = 'leased' AND lease_until <= :now {scope}
                     ORDER BY seq LIMIT :limit)
  ) ORDER BY seq LIMIT :limit)
RETURNING seq, id, {payload}, owner, token, attempts, lease_until, deadline, max_attempts
"""

# The product's claim, in ``core.claim_plan``'s order (``claim_rank``): a job ready for longer than its queue's
# ``max_wait`` first (``late``, oldest first; none when the queue has no ``max_wait``), then higher priority, then
# the earlier ``available_at``, then ``seq``. Each branch seeks its own index and stops at ``:limit`` (``late``: two,
# the default priority's range of ``asyncq_jobs_ranked`` and ``asyncq_jobs_prioritised``, both in ready-time order;
# ready: ``asyncq_jobs_ranked``, whose order is the branch's, so no sort; the ``+available_at`` keeps the planner
# off the prioritised index there; expired leases: few, from ``asyncq_jobs_leased``).
# The branches are disjoint (the ready branch leaves the late jobs to theirs), so ``UNION ALL`` needs no dedupe
# (a ``UNION`` cost a tenth of the no-op pool's throughput at 16 tasks). ``flow`` is the queue's stored
# settings row: while it says paused, nothing is claimed; nor while the queue has limits (``limits.CLAIM_LIMITED``
# claims those, counting its leases first).
CLAIM_RANKED = """
WITH flow AS (SELECT paused_at, :now - max_wait_ms AS late_at,
                coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL AS limited
              FROM {settings} WHERE queue = :queue),
ready AS (
  SELECT * FROM (SELECT seq, 1 AS late, priority, available_at FROM {jobs}
                 WHERE status = 'pending' AND queue = :queue AND priority = 0
                   AND available_at <= (SELECT late_at FROM flow)
                 ORDER BY available_at, seq LIMIT :limit)
  UNION ALL
  SELECT * FROM (SELECT seq, 1 AS late, priority, available_at FROM {jobs}
                 WHERE status = 'pending' AND queue = :queue AND priority <> 0
                   AND available_at <= (SELECT late_at FROM flow)
                 ORDER BY available_at, seq LIMIT :limit)
  UNION ALL
  SELECT * FROM (SELECT seq, 0, priority, available_at FROM {jobs}
                 WHERE status = 'pending' AND queue = :queue AND +available_at <= :now
                   AND +available_at > ifnull((SELECT late_at FROM flow), -1)
                 ORDER BY priority DESC, available_at, seq LIMIT :limit)
  UNION ALL
  SELECT * FROM (SELECT seq, available_at <= ifnull((SELECT late_at FROM flow), -1) AS late, priority, available_at
                 FROM {jobs} WHERE status = 'leased' AND lease_until <= :now AND queue = :queue
                 ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT :limit)
)
UPDATE {jobs}
SET status = 'leased', attempts = attempts + :count, token = token + 1, owner = :owner,
    lease_until = min(:now + :lease_ms, deadline), reason = NULL
WHERE seq IN (
  SELECT seq FROM ready WHERE NOT EXISTS (SELECT 1 FROM flow WHERE paused_at IS NOT NULL OR limited)
  ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT :limit)
RETURNING {claimed}
"""

# What every product claim (``CLAIM_RANKED``, ``limits.CLAIM_LIMITED`` and ``CLAIM_BY_KEYS``) returns of a row: the
# ticket's columns (``Ticket.from_row``: the queue, owner and lease end are the claim's own, not read back), then
# its rank in the claim order, ``core.claim_plan.packed_rank`` (late: ready for longer than the queue's
# ``max_wait``).
CLAIMED = (
    "seq, id, body, priority, token, attempts, deadline, max_attempts,"
    " CASE WHEN available_at <= ifnull((SELECT :now - max_wait_ms FROM asyncq_queues WHERE queue = :queue), -1)"
    f" THEN available_at ELSE (101 - priority) * {RANK_PRIORITY_STEP} + available_at END"
)

# The finish: a compare-and-set that lands only on the row version each decision was made on (every column
# it read), for one row or many in one statement. The rows of one statement share their change and their owner
# (``?1`` … ``?5``, a ``FinishChange``); ``{rows}`` lists the rows, each a ``FinishRow`` (see ``finish_rows``).
# RETURNING names the rows that landed, each with its ``links`` (NULL but for a job in a graph, whose end settles its
# dependants and its group in the same transaction: ``store.sqlite.graphs``). Shared values are bound once a
# statement, not once a row: a pool's group commit finishes a batch with one change (done, now), and each text
# parameter bound costs (2.4 against 3.0 µs a row, 128 rows a statement).
FINISH_ROWS = """
UPDATE {jobs} SET status = ?1, reason = ?2, available_at = ?3, attempts = {jobs}.attempts + ?4,
    owner = NULL, lease_until = NULL
FROM (VALUES {rows}) AS v
WHERE {jobs}.seq = v.column1 AND {jobs}.id = v.column2 AND {jobs}.status = 'leased' AND {jobs}.owner = ?5
  AND {jobs}.token = v.column3 AND {jobs}.attempts = v.column4 AND {jobs}.lease_until = v.column5
  AND {jobs}.max_attempts = v.column6 AND {jobs}.deadline = v.column7
RETURNING {jobs}.seq, {links}
"""


# ``{ids}`` is a list of ``?`` (see ``select_by_ids``).
SELECT_BY_IDS = """
SELECT seq, id, {payload}, status, attempts, max_attempts, token, owner, lease_until, deadline, reason
FROM {jobs} WHERE id IN ({ids})
"""

# One job or many in one statement. ``{rows}`` is a list of ``(?, …, 'pending', 0, ?, 0, ?, ?)`` rows (see
# ``insert_rows``): the id, the payload columns, then max_attempts, available_at and deadline. A known id
# inserts nothing (its whole row is kept); the caller then compares payloads. So does a unique key that an active
# job of the queue holds (``asyncq_jobs_unique``; ``ON CONFLICT`` without a target covers every unique index): the
# caller reads who holds it (``SELECT_KEY_HOLDERS``). No RETURNING (0.4 µs a job): the
# cursor's ``rowcount`` says whether every row was inserted, and only when some id was known does
# ``SELECT_INSERTED`` read the ids of the rows inserted: the ``rowcount`` greatest seqs up to the cursor's
# ``lastrowid`` (the write lock is held, and a new row's seq is greater than any row's, so those are exactly the
# rows this statement inserted). Not "consecutive seqs": a known id can use one up.
INSERT_ROWS = """
INSERT INTO {jobs} (id, {payload}, status, attempts, max_attempts, token, available_at, deadline)
VALUES {rows}
ON CONFLICT DO NOTHING
"""

# Who holds each unique key of ``{keys}`` (``(?, ?)`` pairs of queue and key): the index's own condition, verbatim.
# A join from the pairs, so that each seeks ``asyncq_jobs_unique`` (a row-value ``IN`` of two pairs or more walks
# another index over every active job).
SELECT_KEY_HOLDERS = """
SELECT j.queue, j.unique_key, j.id FROM (VALUES {keys}) AS k CROSS JOIN {jobs} j
WHERE j.queue = k.column1 AND j.unique_key = k.column2 AND j.unique_key IS NOT NULL
  AND j.status NOT IN ('done', 'dead')
"""

SELECT_INSERTED = """
SELECT id FROM {jobs} WHERE seq <= :last ORDER BY seq DESC LIMIT :inserted
"""

# The renewal returns, fenced like itself, whether a cancel was requested (``{cancel_requested}``: the product's
# ``cancel_requested_at IS NOT NULL``; the lab's tables have no such column).
EXTEND = """
UPDATE {jobs} SET lease_until = min(:now + :lease_ms, deadline)
WHERE id = :id AND status = 'leased' AND owner = :owner AND token = :token AND attempts = :attempt
  AND lease_until = :lease_until AND :now < lease_until AND :now < deadline
RETURNING lease_until, {cancel_requested}
"""

# ``{audit_seq}``/``{audit_seq_value}``: the product's audit rows also name the job's ``seq`` (an id pruned and
# enqueued again is another job); the lab's table, exactly as its contract writes it, has no such column.
AUDIT = """
INSERT INTO {audit} (id, token, at_ms, note{audit_seq}) VALUES (:id, :token, :now, :note{audit_seq_value})
"""

REDRIVE = """
UPDATE {jobs} SET status = 'pending', attempts = 0, available_at = :now, deadline = :deadline,
    owner = NULL, lease_until = NULL, reason = NULL{clear_cancel}
WHERE seq = :seq AND status = 'dead'
"""

NAMES = {
    "SWEEP_DEADLINE": SWEEP_DEADLINE,
    "SWEEP_EXHAUSTED": SWEEP_EXHAUSTED,
    "CLAIM": CLAIM,
    "CLAIM_RANKED": CLAIM_RANKED,
    "EXTEND": EXTEND,
    "AUDIT": AUDIT,
    "REDRIVE": REDRIVE,
    "SELECT_INSERTED": SELECT_INSERTED,
}


@cache
def sql(layout: Layout, name: str) -> str:
    """The statement ``name`` for ``layout``'s tables."""
    return NAMES[name].format(
        jobs=layout.jobs,
        audit=layout.audit,
        payload=", ".join(layout.payload),
        scope=layout.scope,
        errors=layout.errors,
        results=layout.results,
        settings=layout.settings,
        audit_seq=", job_seq" if layout.errors is not None else "",
        audit_seq_value=", :seq" if layout.errors is not None else "",
        cancel_requested="cancel_requested_at IS NOT NULL" if layout.cancels else "0",
        clear_cancel=", cancel_requested_at = NULL" if layout.cancels else "",
        live=LIVE_STATUSES if layout.graphs else "status IN ('pending', 'leased')",
        links="links" if layout.graphs else "NULL",
        claimed=CLAIMED,
    )


IN_LIST_MAX = 64


@cache
def select_by_ids(layout: Layout, count: int) -> str:
    """``SELECT_BY_IDS`` for ``count`` ids (1 … ``IN_LIST_MAX``), rounded up to a power of two so that only
    seven statement texts exist and all stay in the connection's statement cache; fill the list with
    ``padded``."""
    ids = ", ".join("?" * _in_list_size(count))
    return SELECT_BY_IDS.format(jobs=layout.jobs, payload=", ".join(layout.stored), ids=ids)


@cache
def select_key_holders(layout: Layout, count: int) -> str:
    """``SELECT_KEY_HOLDERS`` for ``count`` (queue, key) pairs (1 … ``IN_LIST_MAX``), rounded up like
    ``select_by_ids``."""
    return SELECT_KEY_HOLDERS.format(jobs=layout.jobs, keys=", ".join(["(?, ?)"] * _in_list_size(count)))


# What a row holds now, for the finishes whose compare-and-set did not land (``core.finish_plan.landed_before``).
ROWS_NOW = """
SELECT seq, status, reason, token, owner, attempts FROM {jobs} WHERE seq IN ({seqs})
"""


@cache
def rows_now(layout: Layout, count: int) -> str:
    """``ROWS_NOW`` for ``count`` seqs (1 … ``IN_LIST_MAX``, rounded up as ``select_by_ids``; fill with ``padded``)."""
    return ROWS_NOW.format(jobs=layout.jobs, seqs=", ".join("?" * _in_list_size(count)))


# A pool's group commit finishes up to 128 jobs (``Pool.batch``): one statement for all of them.
FINISH_ROWS_MAX = 128
_CHANGE_WIDTH = len(FinishChange._fields)
_ROW_WIDTH = len(FinishRow._fields)


@cache
def finish_rows(layout: Layout, count: int) -> str:
    """``FINISH_ROWS`` for ``count`` rows (1 … ``FINISH_ROWS_MAX``), rounded up like ``select_by_ids``; its
    parameters are ``finish_params``'s. Numbered: the shared ones first, then each row's."""
    size = _in_list_size(count)
    rows = (
        "(" + ", ".join(f"?{_CHANGE_WIDTH + 1 + row * _ROW_WIDTH + column}" for column in range(_ROW_WIDTH)) + ")"
        for row in range(size)
    )
    links = f"{layout.jobs}.links" if layout.graphs else "NULL"
    return FINISH_ROWS.format(jobs=layout.jobs, rows=", ".join(rows), links=links)


def finish_params(change: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[Any]:
    """The parameters of ``finish_rows(layout, len(rows))``: ``change`` (a ``FinishChange``), then ``rows`` (each a
    ``FinishRow``), the last repeated up to the statement's size (a repeated row updates its job once)."""
    values = list(change)
    extend = values.extend
    for row in rows:
        extend(row)
    last = rows[-1]
    for _ in range(_in_list_size(len(rows)) - len(rows)):
        extend(last)
    return values


@cache
def activate_rows(layout: Layout, count: int) -> str:
    """``ACTIVATE_ROWS`` for ``count`` rows (1 … ``IN_LIST_MAX``), rounded up like ``select_by_ids``."""
    row = "(" + ", ".join("?" * 6) + ")"
    return ACTIVATE_ROWS.format(jobs=layout.jobs, rows=", ".join([row] * _in_list_size(count)))


INSERT_ROWS_MAX = 256


@cache
def insert_rows(layout: Layout, count: int, columns: tuple[str, ...] | None = None) -> str:
    """``INSERT_ROWS`` for ``count`` jobs (1 … ``INSERT_ROWS_MAX``), rounded up like ``select_by_ids``; fill it
    with ``padded`` rows (a repeated row inserts nothing: its id is then known). One statement for 256 jobs
    instead of 256 halves the connection thread's time per enqueued job (docs/benchmarks.md, "How the design was
    measured"). ``columns``: the payload columns written (default: all of ``layout.inserted``); the others keep
    their defaults (``Layout.defaults``)."""
    columns = layout.inserted if columns is None else columns
    row = "(" + ", ".join(["?"] * (1 + len(columns)) + ["'pending'", "0", "?", "0", "?", "?"]) + ")"
    return INSERT_ROWS.format(
        jobs=layout.jobs, payload=", ".join(columns), rows=", ".join([row] * _in_list_size(count))
    )


def padded(ids: list[T]) -> list[T]:
    """``ids`` (or rows) with the last repeated up to the statement's power-of-two size (a repeated id
    matches once)."""
    return ids + ids[-1:] * (_in_list_size(len(ids)) - len(ids))


def _in_list_size(count: int) -> int:
    return 1 << (count - 1).bit_length()


# Product-only statements (the lab has no cancel and no operator queries). A cancel ends a job nobody holds (pending,
# waiting, or leased under an expired lease: ``core.lifecycle.decide_cancel`` decided it on the row read in this
# transaction); its ``links`` say whether its dependants and group are settled with it.
CANCEL = """
UPDATE {jobs} SET status = 'dead', reason = 'cancelled', available_at = :now, owner = NULL, lease_until = NULL
WHERE seq = :seq AND status IN ('pending', 'leased', 'waiting')
RETURNING links
"""

# A cancel of a job held under a live lease: the request, kept on the row for its holder (a second one keeps the first).
REQUEST_CANCEL = """
UPDATE {jobs} SET cancel_requested_at = :now
WHERE seq = :seq AND status = 'leased' AND cancel_requested_at IS NULL
"""

# The sweep's third statement (the product's): a row with a cancel request that nobody holds any more (retried or
# released with it, or its lease expired) ends dead, never run again. Its WHERE is the partial index's.
SWEEP_CANCELLED = """
UPDATE {jobs} SET status = 'dead', reason = 'cancelled', available_at = :now, owner = NULL, lease_until = NULL
WHERE cancel_requested_at IS NOT NULL AND status IN ('pending', 'leased')
  AND (status = 'pending' OR lease_until <= :now)
RETURNING seq, {links}
"""

AUDIT_ACTION = """
INSERT INTO {audit} (id, token, at_ms, note, action, reason{audit_seq})
VALUES (:id, :token, :now, :note, :action, :reason{audit_seq_value})
"""

# A pool gives back a job it claimed but never started (graceful stop): fenced like a finish, and an attempt
# counted at claim (``:refund`` 1; 0 for a job claimed ahead, never counted) is returned to the budget. The token
# stays; the next claim issues a new one.
RELEASE = """
UPDATE {jobs} SET status = 'pending', attempts = attempts - :refund, available_at = :now, owner = NULL,
    lease_until = NULL, reason = NULL
WHERE id = :id AND status = 'leased' AND owner = :owner AND token = :token AND attempts = :attempt
  AND lease_until = :lease_until AND :now < lease_until
"""

# A failed attempt's error, kept in the finish's transaction (``Layout.errors``: the product's only).
KEEP_ERROR = """
INSERT INTO {errors} (job_seq, attempt, at_ms, type, message, traceback) VALUES (?, ?, ?, ?, ?, ?)
"""

# A handler started a job claimed ahead: its attempt is counted now, fenced on the whole lease. ``{rows}`` is a list
# of ``(seq, id, token, owner, attempts, lease_until)`` rows (see ``activate_rows``); RETURNING names those counted.
ACTIVATE_ROWS = """
UPDATE {jobs} SET attempts = attempts + 1
FROM (VALUES {rows}) AS v
WHERE {jobs}.seq = v.column1 AND {jobs}.id = v.column2 AND {jobs}.status = 'leased' AND {jobs}.token = v.column3
  AND {jobs}.owner = v.column4 AND {jobs}.attempts = v.column5 AND {jobs}.lease_until = v.column6
RETURNING {jobs}.seq
"""

# A task's result, kept in the finish's transaction for a finish that landed as done (``Layout.results``).
KEEP_RESULT = """
INSERT OR REPLACE INTO {results} (job_seq, value, at_ms, expires_at) VALUES (?, ?, ?, ?)
"""

NAMES |= {"CANCEL": CANCEL, "AUDIT_ACTION": AUDIT_ACTION, "RELEASE": RELEASE, "KEEP_ERROR": KEEP_ERROR}
NAMES |= {"KEEP_RESULT": KEEP_RESULT, "REQUEST_CANCEL": REQUEST_CANCEL, "SWEEP_CANCELLED": SWEEP_CANCELLED}
