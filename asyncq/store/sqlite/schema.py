"""Table layouts. The lease lab keeps the spec's exact tables; product queues have their own, beside an
app's tables in the same file (hence the ``asyncq_`` prefix). Both run the same statements
(``asyncq.store.sqlite.statements``), which differ only in the table names, the payload columns and the scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The lease lab's tables, exactly as its contract writes them (sqlite_master keeps this text).
LAB_TABLES = (
    """CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
  qty INTEGER NOT NULL, status TEXT NOT NULL CHECK(status IN ('pending','leased','done','dead')),
  attempts INTEGER NOT NULL, max_attempts INTEGER NOT NULL, token INTEGER NOT NULL,
  available_at INTEGER NOT NULL, deadline INTEGER NOT NULL, owner TEXT, lease_until INTEGER, reason TEXT)""",
    """CREATE TABLE IF NOT EXISTS redrives (seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL, token INTEGER NOT NULL, at_ms INTEGER NOT NULL, note TEXT NOT NULL)""",
)

PRODUCT_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
  queue TEXT NOT NULL, body TEXT NOT NULL,
  status TEXT NOT NULL CHECK(status IN ('pending','leased','done','dead')),
  attempts INTEGER NOT NULL, max_attempts INTEGER NOT NULL, token INTEGER NOT NULL,
  available_at INTEGER NOT NULL, deadline INTEGER NOT NULL, owner TEXT, lease_until INTEGER, reason TEXT)""",
    """CREATE TABLE IF NOT EXISTS asyncq_audit (seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL, token INTEGER NOT NULL, at_ms INTEGER NOT NULL, note TEXT NOT NULL,
  action TEXT NOT NULL DEFAULT 'redrive', reason TEXT)""",
)


def lifecycle_indexes(table: str, scope_columns: str = "") -> tuple[str, ...]:
    """Indexes that make the sweep, the claim and the finish logarithmic in the queue's depth.

    All are partial, over live rows only (``pending`` or ``leased``): finished jobs leave every index, so history
    costs neither index space nor index updates, and a finish deletes index entries instead of moving them.
    ``pending`` holds one status value and so is ordered by ``seq`` (the rowid): the claim walks it in ``seq``
    order and stops at the first available row. ``exhausted`` is partial on a two-column comparison
    (``attempts >= max_attempts``), which no ordinary index can seek. Each ``WHERE`` is repeated verbatim in the
    statement that uses it (``asyncq.store.sqlite.statements``), which is what lets SQLite choose a partial index.
    """
    return (
        f"CREATE INDEX IF NOT EXISTS {table}_pending ON {table}({scope_columns}status) WHERE status = 'pending'",
        f"CREATE INDEX IF NOT EXISTS {table}_leased ON {table}({scope_columns}status, lease_until)"
        " WHERE status = 'leased'",
        f"CREATE INDEX IF NOT EXISTS {table}_live_deadline ON {table}(deadline) WHERE status IN ('pending', 'leased')",
        f"CREATE INDEX IF NOT EXISTS {table}_live_exhausted ON {table}(status)"
        " WHERE attempts >= max_attempts AND status IN ('pending', 'leased')",
    )


@dataclass(frozen=True, eq=False)  # identity hash: ``sql(layout, name)`` is cached per layout object
class Layout:
    """Where a lifecycle lives: its tables, the columns that carry the job's payload, and an optional
    scope (a SQL condition on named parameters, such as the product's queue name) for claims."""

    jobs: str
    audit: str
    payload: tuple[str, ...]
    scope: str
    ddl: tuple[str, ...]
    #: The table that keeps each failed attempt's error (the product's); ``None`` keeps none (the lab's).
    errors: str | None = None
    #: The table of job counts its triggers keep (the product's, ``JOB_COUNTS``); ``None`` keeps none (the lab's).
    counts: str | None = None
    #: The table of tasks' results (the product's, ``RESULT_TABLES``); ``None`` keeps none (the lab's).
    results: str | None = None
    #: Whether the jobs table has ``cancel_requested_at`` (the product's, ``CANCEL_REQUESTS``; the lab's has not).
    cancels: bool = False
    #: The claim statement's name (``statements.NAMES``): the lab's claims by ``seq``; the product's by the order of
    #: ``core.claim_plan.claim_rank``, reading its queue's stored settings (``settings``: paused, ``max_wait``).
    claim: str = "CLAIM"
    settings: str | None = None
    #: Columns inserted and compared with the payload (the same id with another value is a ``Conflict``) that a
    #: claim does not return: the product's ``unique_key`` (``UNIQUE_KEYS``) and ``limit_key`` (``LIMITS``; the lab's
    #: tables have neither).
    keys: tuple[str, ...] = ()
    #: Columns inserted from the payload that no comparison reads, because another column decides them: the
    #: product's ``task``, derived from the body (``core.jobs.task_of``; ``TASKS``). A row stored before the column
    #: existed holds ``NULL`` there and still matches the same body.
    derived: tuple[str, ...] = ()
    #: Whether the jobs table has the dependencies' and groups' columns (the product's, ``graph_schema``): its sweep
    #: also ends waiting jobs past their deadline, and its finishes and sweeps return each row's ``links``.
    graphs: bool = False
    #: Inserted columns that most jobs leave at the column's own ``DEFAULT``, with that default: an enqueue writes
    #: only those of them that some job of its statement sets (``statements.insert_rows``). The product's five
    #: (priority, unique key, group, limit key, task) were 1 µs of every plain job enqueued to bind
    #: (docs/benchmarks.md, "ab-pool").
    defaults: tuple[tuple[str, Any], ...] = ()
    #: Whether an enqueue claims for an idle pool's offer (the product's, ``OFFERS``: ``core.offers``).
    offers: bool = False

    @property
    def stored(self) -> tuple[str, ...]:
        """Every column of a job's payload as stored and compared: ``payload``, then ``keys``."""
        return self.payload + self.keys

    @property
    def inserted(self) -> tuple[str, ...]:
        """Every column an enqueue inserts from the payload: ``stored``, then ``derived``."""
        return self.stored + self.derived


LAB = Layout(
    jobs="jobs",
    audit="redrives",
    payload=("qty",),
    scope="",
    ddl=(*LAB_TABLES, *lifecycle_indexes("jobs")),
)

PRODUCT = Layout(
    jobs="asyncq_jobs",
    audit="asyncq_audit",
    errors="asyncq_errors",
    counts="asyncq_counts",
    results="asyncq_results",
    cancels=True,
    payload=("queue", "body", "priority"),
    scope="AND queue = :queue",
    claim="CLAIM_RANKED",
    settings="asyncq_queues",
    keys=("unique_key", "group_name", "limit_key"),
    derived=("task",),
    graphs=True,
    defaults=(("priority", 0), ("unique_key", None), ("group_name", None), ("limit_key", None), ("task", None)),
    offers=True,
    ddl=(
        *PRODUCT_TABLES,
        *lifecycle_indexes("asyncq_jobs", "queue, "),
        "CREATE INDEX IF NOT EXISTS asyncq_audit_id ON asyncq_audit(id)",
    ),
)

# Each failed attempt's error, keyed by the job's ``seq`` (never reused, so a pruned id enqueued again starts
# clean). Written in the finish's transaction; pruned with its job.
ERROR_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_errors (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_seq INTEGER NOT NULL,
  attempt INTEGER NOT NULL, at_ms INTEGER NOT NULL, type TEXT NOT NULL, message TEXT NOT NULL,
  traceback TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS asyncq_errors_job ON asyncq_errors(job_seq)",
)

# Version 4: audit rows name the job's ``seq``, so that a job enqueued again under a pruned job's id does not
# inherit its predecessor's redrives (rows written before it are matched to the job their id names now).
AUDIT_JOB_SEQ = (
    "ALTER TABLE asyncq_audit ADD COLUMN job_seq INTEGER",
    "UPDATE asyncq_audit SET job_seq = (SELECT seq FROM asyncq_jobs j WHERE j.id = asyncq_audit.id)",
    "CREATE INDEX IF NOT EXISTS asyncq_audit_job ON asyncq_audit(job_seq)",
)

# Version 5: what ``Queue.stats()`` counts, kept as jobs move instead of counted by a scan. One row per cell
# ``(status, attempts, reason)`` of the jobs that are not leased holds how many jobs are in it (a few dozen cells, one
# page): pending, done and dead by status, dead jobs by reason, pending jobs by attempts. Leased jobs are in flight,
# few, and read from their own index (``asyncq.store.sqlite.stats``); leaving them out makes a job's lifecycle write
# three cells (its insert, its claim, its finish) instead of five, and a lease renewal or a job claimed ahead being
# started writes none. Triggers on ``asyncq_jobs`` keep the cells in the statement that moves a row, so every path is
# counted exactly (the engine's statements, operators, prune, an app's own SQL) and a rollback takes its counts back
# with it. An update fires only when it assigns a counted column (``UPDATE OF``) and changes the cell (``WHEN``); the
# row leaves its old cell and enters its new one in two triggers, each a one-row upsert (the cheapest form measured:
# docs/benchmarks.md, "Stats without scans"). A reason is never NULL in a key (a NULL would make a new cell per
# row): no reason is ``''``. Cells that reach 0 stay (their number is bounded). The lab's tables, exactly as its
# contract writes them, have none of this.
_CELL_OF_NEW = "NEW.status, NEW.attempts, ifnull(NEW.reason, '')"
_CELL_OF_OLD = "OLD.status, OLD.attempts, ifnull(OLD.reason, '')"
_CELL_CHANGED = "(OLD.status, OLD.attempts, OLD.reason) IS NOT (NEW.status, NEW.attempts, NEW.reason)"
_UPSERT = "INSERT INTO asyncq_counts VALUES ({cell}, {n}) ON CONFLICT DO UPDATE SET jobs = jobs + excluded.jobs;"
JOB_COUNTS = (
    """CREATE TABLE IF NOT EXISTS asyncq_counts (status TEXT NOT NULL, attempts INTEGER NOT NULL,
  reason TEXT NOT NULL, jobs INTEGER NOT NULL, PRIMARY KEY (status, attempts, reason)) WITHOUT ROWID""",
    "CREATE TRIGGER IF NOT EXISTS asyncq_jobs_count_insert AFTER INSERT ON asyncq_jobs WHEN NEW.status <> 'leased'"
    f" BEGIN {_UPSERT.format(cell=_CELL_OF_NEW, n=1)} END",
    "CREATE TRIGGER IF NOT EXISTS asyncq_jobs_count_delete AFTER DELETE ON asyncq_jobs WHEN OLD.status <> 'leased'"
    f" BEGIN {_UPSERT.format(cell=_CELL_OF_OLD, n=-1)} END",
    "CREATE TRIGGER IF NOT EXISTS asyncq_jobs_count_leave AFTER UPDATE OF status, attempts, reason ON asyncq_jobs"
    f" WHEN OLD.status <> 'leased' AND {_CELL_CHANGED} BEGIN {_UPSERT.format(cell=_CELL_OF_OLD, n=-1)} END",
    "CREATE TRIGGER IF NOT EXISTS asyncq_jobs_count_enter AFTER UPDATE OF status, attempts, reason ON asyncq_jobs"
    f" WHEN NEW.status <> 'leased' AND {_CELL_CHANGED} BEGIN {_UPSERT.format(cell=_CELL_OF_NEW, n=1)} END",
    # The oldest ready job's ``available_at``: the first entry of this index. It indexes an expression that no
    # lifecycle statement names, so that the claim's planner can never take it for ``asyncq_jobs_pending`` (a claim
    # walks that one in ``seq`` order); only ``asyncq.store.sqlite.stats`` reads it. One entry per pending job.
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_ready_at ON asyncq_jobs(available_at + 0) WHERE status = 'pending'",
    # Dead jobs in ``seq`` order, for listings (``asyncq.store.sqlite.admin``): the newest dead jobs a dashboard
    # shows on every refresh are the last entries. Only a job that dies writes an entry; a done job writes none.
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_dead ON asyncq_jobs(status) WHERE status = 'dead'",
)

# Every cell counted from the rows: how version 5 fills the table of an existing file, in the migration's
# transaction (under the write lock, once: the same transaction moves ``user_version`` on), and what tests
# compare the kept counts with.
RECOUNT = (
    "DELETE FROM asyncq_counts",
    "INSERT INTO asyncq_counts SELECT status, attempts, ifnull(reason, ''), count(*) FROM asyncq_jobs"
    " WHERE status <> 'leased' GROUP BY 1, 2, 3",
)

# Version 6: what a task returned, one row per job that ended done with a result, keyed by the job's ``seq``.
# Written in the finish's transaction, only for a finish that landed (a stale worker's result is never written);
# ``prune`` deletes it with its job, or alone once ``expires_at`` has passed.
RESULT_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_results (job_seq INTEGER PRIMARY KEY, value TEXT NOT NULL,
  at_ms INTEGER NOT NULL, expires_at INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS asyncq_results_expiry ON asyncq_results(expires_at)",
)

# Version 7: a cancel requested while a job is leased (``Queue.cancel``), stored on its row in the cancel's
# transaction (the note is in its audit row). The holder's renewal returns it; the sweep ends a row that carries one
# once nobody holds it (pending again, or its lease expired). The index holds only rows with a request.
CANCEL_REQUESTS = (
    "ALTER TABLE asyncq_jobs ADD COLUMN cancel_requested_at INTEGER",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_cancel_requested ON asyncq_jobs(status)"
    " WHERE cancel_requested_at IS NOT NULL AND status IN ('pending', 'leased')",
)

# The transactional outbox (``asyncq.outbox``): items in ``seq`` order, the operators' audit, and the relay's one
# fenced lease row. Created with ``IF NOT EXISTS`` by ``asyncq.store.sqlite.outbox.ensure_tables``, beside the
# app's tables.
OUTBOX_TABLES = (
    """CREATE TABLE IF NOT EXISTS asyncq_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
  topic TEXT NOT NULL, body TEXT NOT NULL, created_at INTEGER NOT NULL,
  state TEXT NOT NULL CHECK(state IN ('unsent','sent','alarm','quarantined')),
  attempts INTEGER NOT NULL DEFAULT 0, budget_from INTEGER NOT NULL DEFAULT 0, last_error TEXT,
  next_attempt_at INTEGER NOT NULL, sent_at INTEGER)""",
    "CREATE INDEX IF NOT EXISTS asyncq_outbox_state ON asyncq_outbox(state)",
    """CREATE TABLE IF NOT EXISTS asyncq_outbox_audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL,
  item_seq INTEGER NOT NULL, at_ms INTEGER NOT NULL,
  action TEXT NOT NULL CHECK(action IN ('retry','quarantine','requeue')), from_state TEXT NOT NULL,
  note TEXT NOT NULL, reason TEXT, attempts INTEGER NOT NULL, last_error TEXT,
  skipped_ahead_of TEXT NOT NULL, skipped_count INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS asyncq_outbox_audit_id ON asyncq_outbox_audit(id)",
    """CREATE TABLE IF NOT EXISTS asyncq_outbox_lease (name TEXT PRIMARY KEY, owner TEXT,
  token INTEGER NOT NULL, lease_until INTEGER)""",
    "INSERT OR IGNORE INTO asyncq_outbox_lease (name, token) VALUES ('relay', 0)",
)

# Version 7: flow control (docs/flow-control.md). A job's priority, claimed higher first, then by the time it became
# ready (``available_at``), then ``seq``: the pending jobs' partial index becomes ``(queue, priority DESC,
# available_at)`` (its rowid, ``seq``, last), so the claim walks one queue's ready jobs in exactly that order and
# stops at its limit, and ``asyncq_jobs_waiting`` finds a queue's oldest ready job in one seek for ``max_wait``
# (a job ready longer than that is served first). ``asyncq_queues`` holds each queue's stored settings, read by
# the claim statement itself: paused (since, by whom, why) and ``max_wait_ms``; ``asyncq_queue_audit`` keeps every
# move on a queue. A queue without a row runs, with strict priorities.
FLOW_CONTROL = (
    "ALTER TABLE asyncq_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100)",
    "DROP INDEX IF EXISTS asyncq_jobs_pending",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_ranked ON asyncq_jobs(queue, priority DESC, available_at)"
    " WHERE status = 'pending'",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_waiting ON asyncq_jobs(queue, available_at) WHERE status = 'pending'",
    """CREATE TABLE IF NOT EXISTS asyncq_queues (queue TEXT PRIMARY KEY, paused_at INTEGER, paused_by TEXT,
  note TEXT, max_wait_ms INTEGER) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS asyncq_queue_audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
  action TEXT NOT NULL CHECK (action IN ('pause', 'resume', 'max_wait')), at_ms INTEGER NOT NULL,
  actor TEXT NOT NULL, note TEXT NOT NULL, max_wait_ms INTEGER)""",
    "CREATE INDEX IF NOT EXISTS asyncq_queue_audit_queue ON asyncq_queue_audit(queue)",
)

# Version 9: unique while active (docs/flow-control.md). A job's optional ``unique_key``; the partial unique index
# lets at most one job of a queue hold a key while it is active (``core.lifecycle.UNIQUE_WHILE``: pending, delayed
# included, or leased). The scope is the queue: the same key in two queues is two keys. A finished job (done, dead)
# leaves the index, so its key is free again; a redrive must take it again (``engine.redrive`` checks first).
UNIQUE_KEYS = (
    "ALTER TABLE asyncq_jobs ADD COLUMN unique_key TEXT",
    "CREATE UNIQUE INDEX IF NOT EXISTS asyncq_jobs_unique ON asyncq_jobs(queue, unique_key)"
    " WHERE unique_key IS NOT NULL AND status IN ('pending', 'leased')",  # version 9's statuses (v13 adds waiting)
)

# When a finished job ended (``admin``'s prune and retention read it): finish and cancel stamp ``available_at =
# now``; the sweep stamps nothing, and a row with reason deadline or exhausted is dated by its deadline.
ENDED_AT = (
    "(CASE WHEN status = 'done' OR reason IN ('permanent', 'cancelled', 'dependency') THEN available_at"
    " ELSE deadline END)"
)

# Version 10: retention per terminal state (docs/flow-control.md, "Retention"). Three windows on each queue's
# settings row (``NULL``: kept for ever); ``asyncq_queue_audit`` gains the ``retention`` action and the windows it
# set (SQLite cannot change a CHECK in place: the table is rebuilt, its rows and their seqs kept, and
# AUTOINCREMENT goes on from the highest). ``asyncq_jobs_ended`` holds the finished jobs by queue, status, reason and
# ``available_at`` (plain columns: an expression index cost a finish twice as much, measured with ab_pool), so a
# step seeks the expired rows of one queue and cell (``core.retention.STATE_CELLS``) and stops at its batch, at any
# depth. A row dated by its deadline has ``available_at`` at or before it (its last ready time), so the seek's
# ``available_at < cutoff`` never misses one, and the deadline is checked on the rows the seek found.
RETENTION = (
    "ALTER TABLE asyncq_queues ADD COLUMN retain_done_ms INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN retain_dead_ms INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN retain_cancelled_ms INTEGER",
    """CREATE TABLE asyncq_queue_audit_v9 (seq INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
  action TEXT NOT NULL CHECK (action IN ('pause', 'resume', 'max_wait', 'retention')), at_ms INTEGER NOT NULL,
  actor TEXT NOT NULL, note TEXT NOT NULL, max_wait_ms INTEGER, retain_done_ms INTEGER, retain_dead_ms INTEGER,
  retain_cancelled_ms INTEGER)""",
    "INSERT INTO asyncq_queue_audit_v9 (seq, queue, action, at_ms, actor, note, max_wait_ms)"
    " SELECT seq, queue, action, at_ms, actor, note, max_wait_ms FROM asyncq_queue_audit",
    "DROP TABLE asyncq_queue_audit",
    "ALTER TABLE asyncq_queue_audit_v9 RENAME TO asyncq_queue_audit",
    "CREATE INDEX IF NOT EXISTS asyncq_queue_audit_queue ON asyncq_queue_audit(queue)",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_ended ON asyncq_jobs(queue, status, reason, available_at)"
    " WHERE status IN ('done', 'dead')",
)

# Version 11: the task a job's body names (``core.jobs.task_of``: ``{"task": name, "args": {…}}``), set at enqueue,
# ``NULL`` for any other body and for rows enqueued before (the migration reads no body). ``asyncq_jobs_task`` finds
# a task's jobs in ``seq`` order (an operator's listing); only rows with a task have an entry, written at their insert
# (no claim or finish changes ``task`` or ``seq``, so they write none).
TASKS = (
    "ALTER TABLE asyncq_jobs ADD COLUMN task TEXT",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_task ON asyncq_jobs(task, seq) WHERE task IS NOT NULL",
)

# Version 11 (with ``TASKS``): retention rules per scope (``core.retention.RetentionRule``): ``asyncq_retention`` holds
# one row per rule, keyed by queue (``*``: every queue, the default) and task (empty: the whole queue). The queues'
# own windows move there from ``asyncq_queues`` (a queue that ever set its retention has a rule, its row's windows
# kept), and those columns go. The queue audit gains ``task`` and the ``retention_clear`` move (rebuilt, as in
# version 10: its rows and seqs kept). The index of ended jobs puts ``task`` after ``queue``, so a group of one
# queue's jobs of one task (or of none) is one range per cell, and a step still seeks and stops at its batch; it
# replaces ``asyncq_jobs_ended`` (the same entries: no more index writes per finish).
RETENTION_RULES = (
    """CREATE TABLE asyncq_retention (queue TEXT NOT NULL, task TEXT NOT NULL, retain_done_ms INTEGER,
  retain_dead_ms INTEGER, retain_cancelled_ms INTEGER, PRIMARY KEY (queue, task)) WITHOUT ROWID""",
    "INSERT INTO asyncq_retention (queue, task, retain_done_ms, retain_dead_ms, retain_cancelled_ms)"
    " SELECT queue, '', retain_done_ms, retain_dead_ms, retain_cancelled_ms FROM asyncq_queues"
    " WHERE queue IN (SELECT queue FROM asyncq_queue_audit WHERE action = 'retention')",
    "ALTER TABLE asyncq_queues DROP COLUMN retain_done_ms",
    "ALTER TABLE asyncq_queues DROP COLUMN retain_dead_ms",
    "ALTER TABLE asyncq_queues DROP COLUMN retain_cancelled_ms",
    """CREATE TABLE asyncq_queue_audit_v10 (seq INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
  action TEXT NOT NULL CHECK (action IN ('pause', 'resume', 'max_wait', 'retention', 'retention_clear')),
  at_ms INTEGER NOT NULL, actor TEXT NOT NULL, note TEXT NOT NULL, max_wait_ms INTEGER, retain_done_ms INTEGER,
  retain_dead_ms INTEGER, retain_cancelled_ms INTEGER, task TEXT)""",
    "INSERT INTO asyncq_queue_audit_v10 (seq, queue, action, at_ms, actor, note, max_wait_ms, retain_done_ms,"
    " retain_dead_ms, retain_cancelled_ms) SELECT seq, queue, action, at_ms, actor, note, max_wait_ms, retain_done_ms,"
    " retain_dead_ms, retain_cancelled_ms FROM asyncq_queue_audit",
    "DROP TABLE asyncq_queue_audit",
    "ALTER TABLE asyncq_queue_audit_v10 RENAME TO asyncq_queue_audit",
    "CREATE INDEX IF NOT EXISTS asyncq_queue_audit_queue ON asyncq_queue_audit(queue)",
    "DROP INDEX IF EXISTS asyncq_jobs_ended",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_retained ON asyncq_jobs(queue, task, status, reason, available_at)"
    " WHERE status IN ('done', 'dead')",
)

# Version 14: concurrency and rate limits (docs/flow-control.md, "Limits"; ``core.flow_limits``). A job's optional
# ``limit_key`` (the jobs a per-key limit bounds together). Each queue's limits on its settings row (NULL: none):
# live leases of the queue, of one key, and a rate of ``limit_rate`` jobs per ``limit_per_ms`` with up to
# ``limit_burst`` at once; ``rate_tat_us`` is the rate's state (GCRA's theoretical arrival time, microseconds),
# advanced by the claim that takes jobs, in its transaction. The queue audit gains the ``limits`` move and the limits
# it set (rebuilt for its CHECK, as in versions 10 and 11: its rows, seqs and version 13's columns kept). A limited
# claim counts live leases through ``asyncq_jobs_leased``; ``asyncq_jobs_keyed`` holds the pending jobs that have a
# key, by queue, key and claim order, so that a claim under a per-key limit finds each key's best jobs in one seek
# instead of walking a full key's backlog (``limits.CLAIM_BY_KEYS``). Jobs without a key (every job of a queue never
# limited by key) are not in it.
_AUDIT_V13_COLUMNS = (
    "seq, queue, action, at_ms, actor, note, max_wait_ms, retain_done_ms, retain_dead_ms, retain_cancelled_ms, task"
)
LIMITS = (
    "ALTER TABLE asyncq_jobs ADD COLUMN limit_key TEXT",
    "ALTER TABLE asyncq_queues ADD COLUMN limit_concurrency INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN limit_per_key INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN limit_rate INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN limit_per_ms INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN limit_burst INTEGER",
    "ALTER TABLE asyncq_queues ADD COLUMN rate_tat_us INTEGER",
    """CREATE TABLE asyncq_queue_audit_limits (seq INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
  action TEXT NOT NULL CHECK (action IN ('pause', 'resume', 'max_wait', 'retention', 'retention_clear', 'limits')),
  at_ms INTEGER NOT NULL, actor TEXT NOT NULL, note TEXT NOT NULL, max_wait_ms INTEGER, retain_done_ms INTEGER,
  retain_dead_ms INTEGER, retain_cancelled_ms INTEGER, task TEXT, limit_concurrency INTEGER, limit_per_key INTEGER,
  limit_rate INTEGER, limit_per_ms INTEGER, limit_burst INTEGER)""",
    f"INSERT INTO asyncq_queue_audit_limits ({_AUDIT_V13_COLUMNS}) SELECT {_AUDIT_V13_COLUMNS} FROM asyncq_queue_audit",
    "DROP TABLE asyncq_queue_audit",
    "ALTER TABLE asyncq_queue_audit_limits RENAME TO asyncq_queue_audit",
    "CREATE INDEX IF NOT EXISTS asyncq_queue_audit_queue ON asyncq_queue_audit(queue)",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_keyed ON asyncq_jobs(queue, limit_key, priority DESC, available_at)"
    " WHERE status = 'pending' AND limit_key IS NOT NULL",
)

# Version 15: the operator's console (docs/console.md). ``asyncq_operations`` is the operator audit: one row per
# console action (who, their role, why, the filter, the count and the ids of the set it acted on, its digest and
# what came of it); each job audit row that action wrote names it (``op_seq``). ``asyncq_samples`` keeps each queue's
# figures at each sample the running console takes (deleted past the console's keep), ``asyncq_workers_seen`` the
# lease holders those samples saw. ``asyncq_errors_type`` finds the jobs that failed with an error type (the Jobs
# screen's filter) by ``job_seq``: an entry per failed attempt, written only on a failure.
CONSOLE = (
    "ALTER TABLE asyncq_audit ADD COLUMN op_seq INTEGER",
    """CREATE TABLE IF NOT EXISTS asyncq_operations (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL,
  actor TEXT NOT NULL, role TEXT NOT NULL, action TEXT NOT NULL, note TEXT NOT NULL, filter TEXT NOT NULL,
  count INTEGER NOT NULL, ids TEXT NOT NULL, digest TEXT NOT NULL, outcome TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS asyncq_samples (at_ms INTEGER NOT NULL, queue TEXT NOT NULL,
  pending INTEGER NOT NULL, ready INTEGER NOT NULL, leased INTEGER NOT NULL, oldest_ready_at INTEGER,
  done INTEGER NOT NULL, dead INTEGER NOT NULL, failed INTEGER NOT NULL, capped INTEGER NOT NULL,
  errors_seq INTEGER NOT NULL, PRIMARY KEY (at_ms, queue)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS asyncq_workers_seen (owner TEXT PRIMARY KEY, first_seen_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL, leases INTEGER NOT NULL, renewals INTEGER NOT NULL, last_renewal_ms INTEGER)
  WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS asyncq_errors_type ON asyncq_errors(type, job_seq)",
)

# Version 16: two index writes fewer for every pending job (docs/benchmarks.md, "ab-pool"). ``asyncq_jobs_waiting``
# held every pending job by (queue, available_at) for ``max_wait``'s late jobs and the oldest ready one; a job of the
# default priority is already in that order in ``asyncq_jobs_ranked`` (queue, priority DESC, available_at) once its
# priority is fixed, so ``asyncq_jobs_prioritised`` holds only the others, and a read in ready-time order takes the
# two ranges (``priority = 0``, ``priority <> 0``) and merges them. ``asyncq_jobs_ready_at`` (the oldest ready
# job of every queue, for ``stats``) goes too: that is the least of each queue's oldest, found through the same two
# ranges, a seek each per queue.
PENDING_BY_TIME = (
    "DROP INDEX IF EXISTS asyncq_jobs_waiting",
    "DROP INDEX IF EXISTS asyncq_jobs_ready_at",
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_prioritised ON asyncq_jobs(queue, available_at)"
    " WHERE status = 'pending' AND priority <> 0",
)

# Version 17: idle pools' offers (``core.offers``). ``asyncq_offers`` holds a row per queue an idle pool serves: its
# owner, its free slots, its lease and the offer's end; ``asyncq_offered`` each job an enqueue claimed for an offer,
# until the pool's next commit takes it (the pool's reads seek it by owner).
OFFERS = (
    """CREATE TABLE IF NOT EXISTS asyncq_offers (queue TEXT NOT NULL, owner TEXT NOT NULL, slots INTEGER NOT NULL,
  lease_ms INTEGER NOT NULL, until_ms INTEGER NOT NULL, PRIMARY KEY (queue, owner)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS asyncq_offered (owner TEXT NOT NULL, job_seq INTEGER NOT NULL,
  PRIMARY KEY (owner, job_seq)) WITHOUT ROWID""",
)

# The distinct queues of one partial index's rows, by a skip scan: a seek a queue (``{where}`` is the index's WHERE,
# word for word; ``{jobs}`` the jobs table). The console's samples and ``stats`` read it.
QUEUES_OF = """
WITH RECURSIVE q(name) AS (
  SELECT (SELECT min(queue) FROM {jobs} WHERE {where})
  UNION ALL
  SELECT (SELECT min(queue) FROM {jobs} WHERE {where} AND queue > q.name) FROM q WHERE q.name IS NOT NULL
) SELECT name FROM q WHERE name IS NOT NULL
"""
