"""The queue's tables in their PostgreSQL schema, as forward migrations (``connection.migrate`` runs them under
the advisory lock). ``{schema}`` is the schema's checked name.

- ``jobs``: one row per job, the same columns as SQLite's ``asyncq_jobs`` (times in epoch ms as ``bigint``; the
  body as its canonical JSON text, so that it is returned byte for byte). A hot table of short-lived rows: its
  fillfactor leaves room on every page for the claim's and the finish's new row versions (HOT updates: no index
  entry written when no indexed column changes), and autovacuum visits it after 1 % of its rows changed rather
  than PostgreSQL's default 20 % (docs/operations.md).
- The lifecycle indexes are partial over live rows (``pending`` or ``leased``) as on SQLite: a finished job
  leaves them, so history costs no index entries.
- ``counts``: exact job counts by status (and a dead job's reason), kept by a statement-level trigger in the
  same transaction as every change, so ``stats`` reads a few rows instead of counting the table. Each backend
  writes rows of its own (``pg_backend_pid()``), so concurrent writers never wait for each other's counter rows
  (a shared counter row would serialise every transaction of every host); ``FOLD_COUNTS`` moves the rows of
  ended backends into row ``0``.
"""

from __future__ import annotations

from asyncq.store.postgres.connection import Migrations
from asyncq.store.postgres.graph_schema import GRAPHS
from asyncq.store.postgres.schedules import SCHEDULE_TABLES

JOBS = """
CREATE TABLE {schema}.jobs (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id text NOT NULL UNIQUE,
  queue text NOT NULL,
  body text NOT NULL,
  status text NOT NULL CHECK (status IN ('pending', 'leased', 'done', 'dead')),
  attempts integer NOT NULL,
  max_attempts integer NOT NULL,
  token bigint NOT NULL,
  available_at bigint NOT NULL,
  deadline bigint NOT NULL,
  owner text,
  lease_until bigint,
  reason text
) WITH (
  fillfactor = 70,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 1
)
"""

INDEXES = (
    # The claim walks a queue's pending rows in seq order and stops at the first LIMIT available ones.
    "CREATE INDEX jobs_pending ON {schema}.jobs (queue, seq) WHERE status = 'pending'",
    # Expired leases of a queue (the claim's takeover), and every lease for stats.
    "CREATE INDEX jobs_leased ON {schema}.jobs (queue, lease_until) WHERE status = 'leased'",
    "CREATE INDEX jobs_live_deadline ON {schema}.jobs (deadline) WHERE status IN ('pending', 'leased')",
    "CREATE INDEX jobs_live_exhausted ON {schema}.jobs (seq)"
    " WHERE attempts >= max_attempts AND status IN ('pending', 'leased')",
)

AUDIT = """
CREATE TABLE {schema}.audit (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id text NOT NULL,
  job_seq bigint NOT NULL,
  token bigint NOT NULL,
  at_ms bigint NOT NULL,
  note text NOT NULL,
  action text NOT NULL CHECK (action IN ('redrive', 'cancel')),
  reason text
)
"""

ERRORS = """
CREATE TABLE {schema}.errors (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_seq bigint NOT NULL,
  attempt integer NOT NULL,
  at_ms bigint NOT NULL,
  type text NOT NULL,
  message text NOT NULL,
  traceback text NOT NULL
)
"""

COUNTS = """
CREATE TABLE {schema}.counts (
  backend integer NOT NULL,
  status text NOT NULL,
  reason text NOT NULL,
  n bigint NOT NULL,
  PRIMARY KEY (backend, status, reason)
) WITH (fillfactor = 50)
"""

# One aggregated upsert per statement that touched jobs (never one per row): the rows it added, less the rows it
# removed, by (status, dead reason); a change that moves no count (an extend) writes nothing. ``ORDER BY`` keeps
# the row locks in one order.
COUNT_TRIGGER_FUNCTION = """
CREATE FUNCTION {schema}.count_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO {schema}.counts AS c (backend, status, reason, n)
    SELECT pg_backend_pid(), status, CASE WHEN status = 'dead' THEN coalesce(reason, '') ELSE '' END, count(*)
    FROM added GROUP BY 2, 3 ORDER BY 2, 3
    ON CONFLICT (backend, status, reason) DO UPDATE SET n = c.n + EXCLUDED.n;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO {schema}.counts AS c (backend, status, reason, n)
    SELECT pg_backend_pid(), status, CASE WHEN status = 'dead' THEN coalesce(reason, '') ELSE '' END, -count(*)
    FROM removed GROUP BY 2, 3 ORDER BY 2, 3
    ON CONFLICT (backend, status, reason) DO UPDATE SET n = c.n + EXCLUDED.n;
  ELSE
    INSERT INTO {schema}.counts AS c (backend, status, reason, n)
    SELECT pg_backend_pid(), status, r, sum(d) FROM (
      SELECT status, CASE WHEN status = 'dead' THEN coalesce(reason, '') ELSE '' END AS r, 1 AS d FROM added
      UNION ALL
      SELECT status, CASE WHEN status = 'dead' THEN coalesce(reason, '') ELSE '' END, -1 FROM removed
    ) moved GROUP BY 2, 3 HAVING sum(d) <> 0 ORDER BY 2, 3
    ON CONFLICT (backend, status, reason) DO UPDATE SET n = c.n + EXCLUDED.n;
  END IF;
  RETURN NULL;
END
$$
"""

COUNT_TRIGGERS = (
    "CREATE TRIGGER count_inserts AFTER INSERT ON {schema}.jobs REFERENCING NEW TABLE AS added"
    " FOR EACH STATEMENT EXECUTE FUNCTION {schema}.count_jobs()",
    "CREATE TRIGGER count_updates AFTER UPDATE ON {schema}.jobs REFERENCING OLD TABLE AS removed NEW TABLE AS added"
    " FOR EACH STATEMENT EXECUTE FUNCTION {schema}.count_jobs()",
    "CREATE TRIGGER count_deletes AFTER DELETE ON {schema}.jobs REFERENCING OLD TABLE AS removed"
    " FOR EACH STATEMENT EXECUTE FUNCTION {schema}.count_jobs()",
)

# What a task returned (the SQLite driver's ``asyncq_results``): one row per job that ended done with a result,
# written in the finish's transaction for a finish that landed; pruned with its job, or alone once expired.
RESULTS = """
CREATE TABLE {schema}.results (
  job_seq bigint PRIMARY KEY,
  value text NOT NULL,
  at_ms bigint NOT NULL,
  expires_at bigint NOT NULL
)
"""

# Version 4: a cancel requested while a job is leased (``Queue.cancel``), stored on its row in the cancel's
# transaction and audited (``cancel_request``); the holder's renewal returns it, the sweep ends a row carrying one
# once nobody holds it. The index holds only the rows with a request.
CANCEL_REQUESTS = (
    "ALTER TABLE {schema}.jobs ADD COLUMN cancel_requested_at bigint",
    "CREATE INDEX jobs_cancel_requested ON {schema}.jobs (seq)"
    " WHERE cancel_requested_at IS NOT NULL AND status IN ('pending', 'leased')",
    "ALTER TABLE {schema}.audit DROP CONSTRAINT audit_action_check",
    "ALTER TABLE {schema}.audit ADD CONSTRAINT audit_action_check"
    " CHECK (action IN ('redrive', 'cancel', 'cancel_request'))",
)

# Version 5: flow control (docs/flow-control.md; the SQLite store's v8). A job's priority (claimed higher first,
# then by the time it became ready, then seq): the pending index becomes ``(queue, priority DESC, available_at,
# seq)``, the claim's order, and ``jobs_waiting`` finds a queue's oldest ready job in one seek for ``max_wait``.
# ``queues`` holds each queue's stored settings, read by the claim statement itself (paused: since, by whom, why;
# ``max_wait_ms``); ``queue_audit`` keeps every move on a queue (the job audit's rows name a job; these do not).
FLOW_CONTROL = (
    "ALTER TABLE {schema}.jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100)",
    "DROP INDEX {schema}.jobs_pending",
    "CREATE INDEX jobs_ranked ON {schema}.jobs (queue, priority DESC, available_at, seq) WHERE status = 'pending'",
    "CREATE INDEX jobs_waiting ON {schema}.jobs (queue, available_at, seq) WHERE status = 'pending'",
    """CREATE TABLE {schema}.queues (
  queue text PRIMARY KEY,
  paused_at bigint,
  paused_by text,
  note text,
  max_wait_ms bigint
)""",
    """CREATE TABLE {schema}.queue_audit (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue text NOT NULL,
  action text NOT NULL CHECK (action IN ('pause', 'resume', 'max_wait')),
  at_ms bigint NOT NULL,
  actor text NOT NULL,
  note text NOT NULL,
  max_wait_ms bigint
)""",
    "CREATE INDEX queue_audit_queue ON {schema}.queue_audit (queue)",
)

# Version 6: unique while active (docs/flow-control.md; the SQLite store's v9). A job's optional ``unique_key``; the
# partial unique index lets at most one job of a queue hold a key while it is active (``core.lifecycle.UNIQUE_WHILE``:
# pending, delayed included, or leased). Scope: the queue. A job that ends (done, dead) leaves the index.
UNIQUE_KEYS = (
    "ALTER TABLE {schema}.jobs ADD COLUMN unique_key text",
    "CREATE UNIQUE INDEX jobs_unique ON {schema}.jobs (queue, unique_key)"
    " WHERE unique_key IS NOT NULL AND status IN ('pending', 'leased')",  # version 6's statuses (v10 adds waiting)
)

# When a finished job ended (the SQLite store's ``schema.ENDED_AT``).
ENDED_AT = (
    "(CASE WHEN status = 'done' OR reason IN ('permanent', 'cancelled', 'dependency') THEN available_at"
    " ELSE deadline END)"
)  # Version 7: retention per terminal state (docs/flow-control.md, "Retention"; the SQLite store's v10). Three windows
# on each queue's settings row (NULL: for ever), the ``retention`` move and the windows it set in ``queue_audit``,
# and ``jobs_ended``: the finished jobs by queue, status, reason and ``available_at`` (plain columns, as on SQLite),
# so a step is one bounded index seek per cell (``core.retention.STATE_CELLS``).
RETENTION = (
    "ALTER TABLE {schema}.queues ADD COLUMN retain_done_ms bigint, ADD COLUMN retain_dead_ms bigint,"
    " ADD COLUMN retain_cancelled_ms bigint",
    "ALTER TABLE {schema}.queue_audit ADD COLUMN retain_done_ms bigint, ADD COLUMN retain_dead_ms bigint,"
    " ADD COLUMN retain_cancelled_ms bigint",
    "ALTER TABLE {schema}.queue_audit DROP CONSTRAINT queue_audit_action_check",
    "ALTER TABLE {schema}.queue_audit ADD CONSTRAINT queue_audit_action_check"
    " CHECK (action IN ('pause', 'resume', 'max_wait', 'retention'))",
    "CREATE INDEX jobs_ended ON {schema}.jobs (queue, status, reason, available_at) WHERE status IN ('done', 'dead')",
)

# Version 8: the task a job's body names (``core.jobs.task_of``; the SQLite store's v11), set at enqueue, NULL for any
# other body and for rows enqueued before (the migration reads no body: adding a nullable column rewrites nothing).
# ``jobs_task`` finds a task's jobs in ``seq`` order (an operator's listing); only rows with a task have an entry.
TASKS = (
    "ALTER TABLE {schema}.jobs ADD COLUMN task text",
    "CREATE INDEX jobs_task ON {schema}.jobs (task, seq) WHERE task IS NOT NULL",
)

# Version 8 (with ``TASKS``): retention rules per scope (the SQLite store's ``RETENTION_RULES``): ``retention`` holds
# one row per rule, keyed by queue (``*``: every queue) and task (empty: the whole queue); the queues' own windows move
# there (a queue that ever set its retention has a rule) and their columns go; the queue audit gains ``task`` and the
# ``retention_clear`` move; ``jobs_retained`` puts ``task`` after ``queue`` in the index of ended jobs, so a group of
# one queue and task is one range per cell, and replaces ``jobs_ended`` (the same entries).
RETENTION_RULES = (
    """CREATE TABLE {schema}.retention (
  queue text NOT NULL,
  task text NOT NULL,
  retain_done_ms bigint,
  retain_dead_ms bigint,
  retain_cancelled_ms bigint,
  PRIMARY KEY (queue, task)
)""",
    "INSERT INTO {schema}.retention (queue, task, retain_done_ms, retain_dead_ms, retain_cancelled_ms)"
    " SELECT queue, '', retain_done_ms, retain_dead_ms, retain_cancelled_ms FROM {schema}.queues"
    " WHERE queue IN (SELECT queue FROM {schema}.queue_audit WHERE action = 'retention')",
    "ALTER TABLE {schema}.queues DROP COLUMN retain_done_ms, DROP COLUMN retain_dead_ms,"
    " DROP COLUMN retain_cancelled_ms",
    "ALTER TABLE {schema}.queue_audit ADD COLUMN task text",
    "ALTER TABLE {schema}.queue_audit DROP CONSTRAINT queue_audit_action_check",
    "ALTER TABLE {schema}.queue_audit ADD CONSTRAINT queue_audit_action_check"
    " CHECK (action IN ('pause', 'resume', 'max_wait', 'retention', 'retention_clear'))",
    "DROP INDEX {schema}.jobs_ended",
    "CREATE INDEX jobs_retained ON {schema}.jobs (queue, task, status, reason, available_at)"
    " WHERE status IN ('done', 'dead')",
)

# Version 11: concurrency and rate limits (docs/flow-control.md, "Limits"; the SQLite store's v14). A job's optional
# ``limit_key``; each queue's limits on its settings row (NULL: none) and the rate's state (``rate_tat_us``: GCRA's
# theoretical arrival time, microseconds), advanced by the claim that takes jobs, which holds the row's lock: the
# claims of a limited queue are serialised on it, so each counts every lease committed before it. The queue audit
# gains the ``limits`` move and the limits it set (beside version 8's ``retention_clear`` and ``task``). A limited
# claim counts live leases through ``jobs_leased``; ``jobs_keyed`` holds the pending jobs that have a key, by queue,
# key and claim order, so that a claim under a per-key limit finds each key's best jobs in one seek instead of walking
# a full key's backlog (``limits.CLAIM_BY_KEYS``). Jobs without a key (every job of a queue never limited by key) are
# not in it.
LIMITS = (
    "ALTER TABLE {schema}.jobs ADD COLUMN limit_key text",
    "ALTER TABLE {schema}.queues ADD COLUMN limit_concurrency integer, ADD COLUMN limit_per_key integer,"
    " ADD COLUMN limit_rate integer, ADD COLUMN limit_per_ms bigint, ADD COLUMN limit_burst integer,"
    " ADD COLUMN rate_tat_us bigint",
    "ALTER TABLE {schema}.queue_audit ADD COLUMN limit_concurrency integer, ADD COLUMN limit_per_key integer,"
    " ADD COLUMN limit_rate integer, ADD COLUMN limit_per_ms bigint, ADD COLUMN limit_burst integer",
    "ALTER TABLE {schema}.queue_audit DROP CONSTRAINT queue_audit_action_check",
    "ALTER TABLE {schema}.queue_audit ADD CONSTRAINT queue_audit_action_check"
    " CHECK (action IN ('pause', 'resume', 'max_wait', 'retention', 'retention_clear', 'limits'))",
    "CREATE INDEX jobs_keyed ON {schema}.jobs (queue, limit_key, priority DESC, available_at, seq)"
    " WHERE status = 'pending' AND limit_key IS NOT NULL",
)

# Version 13: idle pools' offers (``core.offers``; the SQLite store's v17). ``offers`` holds a row per queue an idle
# pool serves: its owner, its free slots, its lease and the offer's end; ``offered`` each job an enqueue claimed for
# an offer, until the pool's next commit takes it (the pool's reads seek it by owner).
OFFERS = (
    """CREATE TABLE {schema}.offers (
  queue text NOT NULL,
  owner text NOT NULL,
  slots integer NOT NULL,
  lease_ms bigint NOT NULL,
  until_ms bigint NOT NULL,
  PRIMARY KEY (queue, owner)
)""",
    """CREATE TABLE {schema}.offered (
  owner text NOT NULL,
  job_seq bigint NOT NULL,
  PRIMARY KEY (owner, job_seq)
)""",
)

# Version 12: the operator's console (docs/console.md; the SQLite store's v15). ``operations`` is the operator audit:
# one row per console action (who, their role, why, the filter, the count and the ids of its set, its digest and
# what came of it), named by each job audit row it wrote (``op_seq``; the job audit gains the ``delete`` and
# ``priority`` moves); ``samples`` each queue's figures at each console sample (deleted past its keep);
# ``workers_seen`` the lease holders the samples saw; ``errors_type`` the jobs that failed with an error type.
CONSOLE = (
    "ALTER TABLE {schema}.audit ADD COLUMN op_seq bigint",
    "ALTER TABLE {schema}.audit DROP CONSTRAINT audit_action_check",
    "ALTER TABLE {schema}.audit ADD CONSTRAINT audit_action_check"
    " CHECK (action IN ('redrive', 'cancel', 'cancel_request', 'delete', 'priority'))",
    """CREATE TABLE {schema}.operations (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at_ms bigint NOT NULL,
  actor text NOT NULL,
  role text NOT NULL,
  action text NOT NULL,
  note text NOT NULL,
  filter text NOT NULL,
  count integer NOT NULL,
  ids text NOT NULL,
  digest text NOT NULL,
  outcome text NOT NULL
)""",
    """CREATE TABLE {schema}.samples (
  at_ms bigint NOT NULL,
  queue text NOT NULL,
  pending bigint NOT NULL,
  ready bigint NOT NULL,
  leased bigint NOT NULL,
  oldest_ready_at bigint,
  done bigint NOT NULL,
  dead bigint NOT NULL,
  failed bigint NOT NULL,
  capped boolean NOT NULL,
  errors_seq bigint NOT NULL,
  PRIMARY KEY (at_ms, queue)
)""",
    """CREATE TABLE {schema}.workers_seen (
  owner text PRIMARY KEY,
  first_seen_ms bigint NOT NULL,
  last_seen_ms bigint NOT NULL,
  leases integer NOT NULL,
  renewals bigint NOT NULL,
  last_renewal_ms bigint
)""",
    "CREATE INDEX errors_type ON {schema}.errors (type, job_seq)",
)

QUEUE = Migrations(
    component="queue",
    steps=(
        (
            JOBS,
            *INDEXES,
            AUDIT,
            "CREATE INDEX audit_id ON {schema}.audit (id)",
            "CREATE INDEX audit_job ON {schema}.audit (job_seq)",
            ERRORS,
            "CREATE INDEX errors_job ON {schema}.errors (job_seq)",
            COUNTS,
            COUNT_TRIGGER_FUNCTION,
            *COUNT_TRIGGERS,
        ),
        (RESULTS, "CREATE INDEX results_expiry ON {schema}.results (expires_at)"),  # version 2: tasks' results
        (  # version 3: what an operator refreshes reads indexes, not the table (the SQLite store's v5 indexes)
            # The oldest ready job in one seek: an expression no claim names, so the claim never takes it.
            "CREATE INDEX jobs_ready_at ON {schema}.jobs ((available_at + 0)) WHERE status = 'pending'",
            # Dead jobs listed newest first without walking the done history.
            "CREATE INDEX jobs_dead ON {schema}.jobs (seq) WHERE status = 'dead'",
        ),
        CANCEL_REQUESTS,  # version 4: a cancel requested while a job is leased
        FLOW_CONTROL,  # version 5: priorities, the queues' stored settings (pause, max_wait) and their audit
        UNIQUE_KEYS,  # version 6: a job's unique key, held by one active job of its queue at a time
        RETENTION,  # version 7: retention per terminal state, its audit, the index of ended jobs
        (*TASKS, *RETENTION_RULES),  # version 8: the task a job's body names; retention rules per task, queue, default
        SCHEDULE_TABLES,  # version 9: schedules as stored state, their events
        GRAPHS,  # version 10: dependencies and groups (the waiting status, edges, groups)
        LIMITS,  # version 11: concurrency and rate limits per queue and limit key, the rate's state, their audit
        CONSOLE,  # version 12: the console's operator audit, samples and workers seen; errors by type
        OFFERS,  # version 13: idle pools' offers, and the jobs enqueues claimed for them
    ),
)
SCHEMA_VERSION = QUEUE.version

# The rows of backends that are gone, summed into row 0, in one statement (the sum of every row is unchanged).
FOLD_COUNTS = """
WITH gone AS (
  DELETE FROM {schema}.counts c
  WHERE c.backend <> 0 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = c.backend)
  RETURNING status, reason, n
)
INSERT INTO {schema}.counts AS c (backend, status, reason, n)
SELECT 0, status, reason, sum(n) FROM gone GROUP BY status, reason ORDER BY status, reason
ON CONFLICT (backend, status, reason) DO UPDATE SET n = c.n + EXCLUDED.n
"""
