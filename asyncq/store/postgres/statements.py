"""Every lifecycle statement of the PostgreSQL queue, once, by name (``{schema}`` filled by ``sql``). Values are
always parameters, and ``now`` is always the caller's (``$n``), never the server's clock.

Batches travel as arrays: one statement per batch (``unnest``), whatever its size. The claim is Oban's lesson:
the rows are chosen first in a materialised CTE (``ORDER BY seq … FOR UPDATE SKIP LOCKED LIMIT n``), then exactly
those are updated; a planner free to fold the selection into the update could lock or update more rows than
the limit. Claimers never wait for each other: a row another transaction holds is skipped.
"""

from __future__ import annotations

from functools import cache

from asyncq.core.claim_plan import RANK_PRIORITY_STEP

# The sweep: unclaimable rows (deadline passed; attempts used up), pending, waiting (for dependencies: the deadline
# only) or with an expired lease, parked as dead. Rows another transaction holds are skipped (it is finishing or
# claiming them; the next sweep sees them), so a sweep never waits and never deadlocks with a finish. RETURNING gives
# each parked row's ``links``: a job in a graph has its dependants and group settled in the same transaction.
SWEEP_DEADLINE = """
UPDATE {schema}.jobs SET status = 'dead', reason = 'deadline', owner = NULL, lease_until = NULL
WHERE seq IN (
  SELECT seq FROM {schema}.jobs
  WHERE status IN ('pending', 'leased', 'waiting') AND deadline <= $1 AND (status <> 'leased' OR lease_until <= $1)
  FOR UPDATE SKIP LOCKED)
RETURNING seq, links
"""

SWEEP_EXHAUSTED = """
UPDATE {schema}.jobs SET status = 'dead', reason = 'exhausted', owner = NULL, lease_until = NULL
WHERE seq IN (
  SELECT seq FROM {schema}.jobs
  WHERE status IN ('pending', 'leased') AND attempts >= max_attempts AND (status = 'pending' OR lease_until <= $1)
  FOR UPDATE SKIP LOCKED)
RETURNING seq, links
"""

# A row with a cancel request that nobody holds any more (retried or released with it, or its lease expired) ends
# dead, never run again (``core.lifecycle.decide_cancel``).
SWEEP_CANCELLED = """
UPDATE {schema}.jobs SET status = 'dead', reason = 'cancelled', available_at = $1, owner = NULL, lease_until = NULL
WHERE seq IN (
  SELECT seq FROM {schema}.jobs
  WHERE cancel_requested_at IS NOT NULL AND status IN ('pending', 'leased')
    AND (status = 'pending' OR lease_until <= $1)
  FOR UPDATE SKIP LOCKED)
RETURNING seq, links
"""

# $1 queue, $2 now, $3 limit, $4 owner, $5 lease_ms, $6 count (1: the claim counts an attempt; 0: claimed ahead,
# counted when a handler starts it). The ready rows in ``core.claim_plan``'s order (``claim_rank``): a job ready for
# longer than its queue's ``max_wait`` first (``late``, oldest first; none without a ``max_wait``), then higher
# priority, then the earlier ``available_at``, then seq; pending and available, or leased with an expired lease.
# Each branch seeks its own index in its own order (``jobs_waiting``, ``jobs_ranked``, ``jobs_leased``) and stops at
# the limit; the branches are disjoint (the ready branch leaves the late jobs to theirs), so ``UNION ALL``.
# ``flow`` is the queue's stored settings row: while it says paused, no branch returns a row; nor while the queue
# has limits (``limits.CLAIM_LIMITED`` claims those, under the settings row's lock). A row the sweep
# skipped (another transaction held it) is never leased past its budget, nor with a cancel request: each branch
# repeats the sweep's conditions.
CLAIM = """
WITH flow AS MATERIALIZED (
  SELECT paused_at, $2 - max_wait_ms AS late_at,
    coalesce(limit_concurrency, limit_per_key, limit_rate) IS NOT NULL AS limited
  FROM {schema}.queues WHERE queue = $1
), late AS MATERIALIZED (
  SELECT seq, priority, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND queue = $1 AND available_at <= (SELECT late_at FROM flow) AND deadline > $2
    AND attempts < max_attempts AND cancel_requested_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM flow WHERE paused_at IS NOT NULL OR limited)
  ORDER BY available_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED
), pending AS MATERIALIZED (
  SELECT seq, priority, available_at FROM {schema}.jobs
  WHERE status = 'pending' AND queue = $1 AND available_at <= $2 AND deadline > $2 AND attempts < max_attempts
    AND cancel_requested_at IS NULL
    AND NOT coalesce(available_at <= (SELECT late_at FROM flow), false)
    AND NOT EXISTS (SELECT 1 FROM flow WHERE paused_at IS NOT NULL OR limited)
  ORDER BY priority DESC, available_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED
), expired AS MATERIALIZED (
  SELECT seq, priority, available_at FROM {schema}.jobs
  WHERE status = 'leased' AND queue = $1 AND lease_until <= $2 AND deadline > $2 AND attempts < max_attempts
    AND cancel_requested_at IS NULL
    AND NOT EXISTS (SELECT 1 FROM flow WHERE paused_at IS NOT NULL OR limited)
  ORDER BY coalesce(available_at <= (SELECT late_at FROM flow), false) DESC,
    CASE WHEN coalesce(available_at <= (SELECT late_at FROM flow), false) THEN 0 ELSE priority END DESC,
    available_at, seq
  LIMIT $3 FOR UPDATE SKIP LOCKED
), chosen AS MATERIALIZED (
  SELECT seq, late FROM (
    SELECT seq, priority, available_at, coalesce(available_at <= (SELECT late_at FROM flow), false) AS late
    FROM (SELECT * FROM late UNION ALL SELECT * FROM pending UNION ALL SELECT * FROM expired) c
  ) r ORDER BY late DESC, CASE WHEN late THEN 0 ELSE priority END DESC, available_at, seq LIMIT $3
)
UPDATE {schema}.jobs j
SET status = 'leased', attempts = j.attempts + $6, token = j.token + 1, owner = $4,
    lease_until = least($2 + $5, j.deadline), reason = NULL
FROM chosen WHERE j.seq = chosen.seq
RETURNING {claimed}
"""


def claimed_columns(late: str) -> str:
    """What every product claim (``CLAIM``, ``limits.CLAIM_LIMITED`` and ``CLAIM_BY_KEYS``) returns of a row ``j``:
    the ticket's columns (``Ticket.from_row``: the queue, owner and lease end are the claim's own, not read back),
    then its rank in the claim order, ``core.claim_plan.packed_rank``; ``late`` says whether the row was ready for
    longer than its queue's ``max_wait``."""
    return (
        "j.seq, j.id, j.body, j.priority, j.token, j.attempts, j.deadline, j.max_attempts,"
        f" CASE WHEN {late} THEN j.available_at ELSE (101 - j.priority) * {RANK_PRIORITY_STEP}::bigint + j.available_at"
        " END"
    )


CLAIM = CLAIM.replace("{claimed}", claimed_columns("chosen.late"))

# The finish: a compare-and-set on every column each decision read, for a whole batch in one statement. A row
# whose version no longer matches is left alone, and RETURNING names the rows that landed, each with its ``links``
# (NULL but for a job in a graph, whose end settles its dependants and group in the same transaction).
# No ``status = 'leased'`` term (nor in ACTIVATE_ROWS): only a leased row has an owner and a lease (every move out
# of leased clears both), so ``owner`` and ``lease_until`` imply it. Named, it let the planner (on a young table's
# statistics) read the partial indexes of live rows and hash-join every leased row, a cost growing with the queue,
# where the join on ``seq`` probes the primary key once an item: at 4 pools draining 20,000 jobs, the finishes'
# server time fell from 1,032 to 247 ms (benchmarks/postgres.py, docs/benchmarks.md).
FINISH_ROWS = """
UPDATE {schema}.jobs j
SET status = v.status, reason = v.reason, available_at = v.available_at, attempts = v.new_attempts,
    owner = NULL, lease_until = NULL
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::integer[], $6::bigint[], $7::integer[],
            $8::bigint[], $9::text[], $10::text[], $11::bigint[], $12::integer[])
  AS v(seq, id, token, owner, attempts, lease_until, max_attempts, deadline, status, reason, available_at,
       new_attempts)
WHERE j.seq = v.seq AND j.id = v.id AND j.token = v.token AND j.owner = v.owner
  AND j.attempts = v.attempts AND j.lease_until = v.lease_until AND j.max_attempts = v.max_attempts
  AND j.deadline = v.deadline
RETURNING j.seq, j.links
"""

# A handler started a job claimed ahead: its attempt is counted now, fenced on the whole lease.
ACTIVATE_ROWS = """
UPDATE {schema}.jobs j SET attempts = j.attempts + 1
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::integer[], $6::bigint[])
  AS v(seq, id, token, owner, attempts, lease_until)
WHERE j.seq = v.seq AND j.id = v.id AND j.token = v.token AND j.owner = v.owner
  AND j.attempts = v.attempts AND j.lease_until = v.lease_until
RETURNING j.seq
"""

# Leases named by (position, id, owner, token, attempt, lease_until); RETURNING names the positions that landed,
# each with whether a cancel of its job was requested (read under the renewal's own fence). $1 now, $2 lease_ms.
EXTEND_ROWS = """
UPDATE {schema}.jobs j SET lease_until = least($1 + $2, j.deadline)
FROM unnest($3::integer[], $4::text[], $5::text[], $6::bigint[], $7::integer[], $8::bigint[])
  AS v(n, id, owner, token, attempts, lease_until)
WHERE j.id = v.id AND j.status = 'leased' AND j.owner = v.owner AND j.token = v.token AND j.attempts = v.attempts
  AND j.lease_until = v.lease_until AND $1 < j.lease_until AND $1 < j.deadline
RETURNING v.n, j.lease_until, j.cancel_requested_at IS NOT NULL
"""

# A pool gives back a job it claimed but never started: fenced like a finish; the attempt counted at claim
# (``refund`` 1; 0 for a job claimed ahead) is returned. The token stays; the next claim issues a new one.
RELEASE_ROWS = """
UPDATE {schema}.jobs j
SET status = 'pending', attempts = j.attempts - v.refund, available_at = $1, owner = NULL, lease_until = NULL,
    reason = NULL
FROM unnest($2::integer[], $3::text[], $4::text[], $5::bigint[], $6::integer[], $7::bigint[], $8::integer[])
  AS v(n, id, owner, token, attempts, lease_until, refund)
WHERE j.id = v.id AND j.status = 'leased' AND j.owner = v.owner AND j.token = v.token AND j.attempts = v.attempts
  AND j.lease_until = v.lease_until AND $1 < j.lease_until
RETURNING v.n
"""

# New jobs in batch order (seq follows it); a known id inserts nothing and RETURNING leaves it out.
INSERT_ROWS = """
INSERT INTO {schema}.jobs
  (id, queue, body, status, attempts, max_attempts, token, available_at, deadline, priority, unique_key, task,
   group_name, limit_key)
SELECT id, queue, body, 'pending', 0, max_attempts, 0, available_at, deadline, priority, unique_key, task, group_name,
  limit_key
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[], $5::bigint[], $6::bigint[], $7::smallint[],
            $8::text[], $9::text[], $10::text[], $11::text[])
  WITH ORDINALITY AS v(
    id, queue, body, max_attempts, available_at, deadline, priority, unique_key, task, group_name, limit_key, n
  )
ORDER BY n
ON CONFLICT DO NOTHING
RETURNING id
"""

# Who holds each (queue, unique key) now: one seek of ``jobs_unique`` per pair (``LATERAL``, with the index's own
# condition), whatever the table's statistics say.
SELECT_KEY_HOLDERS = """
SELECT j.queue, j.unique_key, j.id FROM unnest($1::text[], $2::text[]) AS k(queue, unique_key)
CROSS JOIN LATERAL (
  SELECT queue, unique_key, id FROM {schema}.jobs
  WHERE queue = k.queue AND unique_key = k.unique_key AND unique_key IS NOT NULL
    AND status IN ('pending', 'leased', 'waiting')
) AS j
"""

# Another active job holding the unique key of the job ``seq`` (a redrive would take it again).
KEY_HOLDER_OF = """
SELECT j.queue, j.unique_key, j.id FROM {schema}.jobs d
JOIN {schema}.jobs j ON j.queue = d.queue AND j.unique_key = d.unique_key
WHERE d.seq = $1 AND j.seq <> d.seq AND j.unique_key IS NOT NULL AND j.status IN ('pending', 'leased', 'waiting')
"""

SELECT_BY_IDS = """
SELECT seq, id, queue, body, status, attempts, max_attempts, token, owner, lease_until, deadline, priority,
  unique_key, group_name, limit_key
FROM {schema}.jobs WHERE id = ANY($1::text[])
"""

# What a row holds now, for the finishes whose compare-and-set did not land (``core.finish_plan.landed_before``).
ROWS_NOW = "SELECT seq, status, reason, token, owner, attempts FROM {schema}.jobs WHERE seq = ANY($1)"

# An operator's change reads the row locked: it is decided on the row it writes.
LOCK_ONE = "SELECT seq, status, token FROM {schema}.jobs WHERE id = $1 FOR UPDATE"

AUDIT = """
INSERT INTO {schema}.audit (id, job_seq, token, at_ms, note, action, reason) VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING seq, id, action, token, at_ms, note, reason, op_seq
"""

REDRIVE = """
UPDATE {schema}.jobs SET status = 'pending', attempts = 0, available_at = $2, deadline = $3, owner = NULL,
    lease_until = NULL, reason = NULL, cancel_requested_at = NULL
WHERE seq = $1 AND status = 'dead'
"""

# A cancel ends a job nobody holds (pending, waiting, or leased under an expired lease), as ``decide_cancel`` decided
# on the row locked by ``LOCK_FOR_CANCEL`` (its ``links``: settle its dependants and group); a live lease gets a
# request for its holder (a second one keeps the first).
LOCK_FOR_CANCEL = (
    "SELECT seq, status, attempts, max_attempts, token, owner, lease_until, deadline, cancel_requested_at"
    " FROM {schema}.jobs WHERE id = $1 FOR UPDATE"
)

CANCEL = """
UPDATE {schema}.jobs SET status = 'dead', reason = 'cancelled', available_at = $2, owner = NULL, lease_until = NULL
WHERE seq = $1 AND status IN ('pending', 'leased', 'waiting')
RETURNING links
"""

REQUEST_CANCEL = """
UPDATE {schema}.jobs SET cancel_requested_at = $2 WHERE seq = $1 AND status = 'leased' AND cancel_requested_at IS NULL
"""

KEEP_ERRORS = """
INSERT INTO {schema}.errors (job_seq, attempt, at_ms, type, message, traceback)
SELECT * FROM unnest($1::bigint[], $2::integer[], $3::bigint[], $4::text[], $5::text[], $6::text[])
"""

# A task's result, for each finish that landed as done (the same transaction as the finish).
KEEP_RESULTS = """
INSERT INTO {schema}.results (job_seq, value, at_ms, expires_at)
SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[])
ON CONFLICT (job_seq) DO UPDATE SET value = EXCLUDED.value, at_ms = EXCLUDED.at_ms, expires_at = EXCLUDED.expires_at
"""

# One notification per transaction whatever it carries (PostgreSQL folds identical ones of a transaction into
# one), sent at commit: waiting workers on every host look for work.
NOTIFY = "SELECT pg_notify($1, '')"

NAMES = {
    "SWEEP_DEADLINE": SWEEP_DEADLINE,
    "SWEEP_EXHAUSTED": SWEEP_EXHAUSTED,
    "CLAIM": CLAIM,
    "FINISH_ROWS": FINISH_ROWS,
    "ACTIVATE_ROWS": ACTIVATE_ROWS,
    "EXTEND_ROWS": EXTEND_ROWS,
    "RELEASE_ROWS": RELEASE_ROWS,
    "INSERT_ROWS": INSERT_ROWS,
    "SELECT_BY_IDS": SELECT_BY_IDS,
    "SELECT_KEY_HOLDERS": SELECT_KEY_HOLDERS,
    "KEY_HOLDER_OF": KEY_HOLDER_OF,
    "ROWS_NOW": ROWS_NOW,
    "LOCK_ONE": LOCK_ONE,
    "AUDIT": AUDIT,
    "REDRIVE": REDRIVE,
    "CANCEL": CANCEL,
    "LOCK_FOR_CANCEL": LOCK_FOR_CANCEL,
    "REQUEST_CANCEL": REQUEST_CANCEL,
    "SWEEP_CANCELLED": SWEEP_CANCELLED,
    "KEEP_ERRORS": KEEP_ERRORS,
    "KEEP_RESULTS": KEEP_RESULTS,
}


@cache
def sql(schema: str, name: str) -> str:
    """The statement ``name`` for the queue in ``schema`` (a checked name: ``connection.check_schema``)."""
    return NAMES[name].format(schema=schema)


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the queue in ``schema``."""
    return f"{schema}_wake"
