"""Version 13 of the SQLite queue schema: dependencies and groups (``docs/dependencies.md``).

- ``asyncq_jobs`` gains the ``waiting`` status (a job held back by its dependencies, or a group's callback before
  the group completes), ``group_name`` (its group), ``links`` (``core.dependencies``' flags: ``NULL`` for a job in no
  graph, so only a graph job's end runs more statements) and ``waits`` (its edges not met yet).
- ``asyncq_edges``: one row per dependency, keyed by the two jobs' ``seq`` (never reused: an id pruned and enqueued
  again is another job), with its policy and state; ``asyncq_groups``: one row per group, its counters and its
  callback job.
- The live-deadline index and the unique-key index take ``waiting`` in (the sweep ends a waiting job at its
  deadline; a waiting job holds its unique key); a waiting job is in no claim's index.

SQLite cannot change a ``CHECK`` in place, and a rebuild of the jobs table costs a copy of every row. The status
check is only widened (every row that passed it passes the new one), so the table's stored ``CREATE TABLE`` text is
edited in the migration's transaction, SQLite's documented procedure for a change that leaves the stored rows as
they are (``PRAGMA writable_schema``, the schema cookie moved on so that every connection reads the new text): O(1)
at any depth. The indexes built here read the table once each (measured in docs/benchmarks.md).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from asyncq.core.lifecycle import DEAD, DONE, LIVE, STATUSES, UNIQUE_WHILE
from asyncq.errors import StoreError

_OLD_CHECK = "CHECK(status IN ('pending','leased','done','dead'))"
_NEW_CHECK = "CHECK(status IN ('pending','leased','done','dead','waiting'))"
#: A job that may still run (pending, leased or waiting: ``core.lifecycle.LIVE``, which is also ``UNIQUE_WHILE``), as
#: the sweep's deadline statement, the key holders' read and their indexes name it (verbatim). Written as the two
#: statuses it is not: SQLite evaluates an ``IN`` list of three constants or more through an ephemeral table, and two
#: indexes' conditions so written cost every finish 0.8 µs a job more (measured; two values are two comparisons).
LIVE_STATUSES = "status NOT IN ('done', 'dead')"
assert set(LIVE) == set(UNIQUE_WHILE) == set(STATUSES) - {DONE, DEAD}


def widen_status_check(con: sqlite3.Connection) -> None:
    """Let ``asyncq_jobs.status`` hold ``waiting``: the stored table text edited in the caller's write transaction,
    then the schema cookie moved on, which makes this connection (and every other, at its next statement) read the
    new text before any other DDL of the migration runs. ``StoreError`` if the table's text is not the one asyncq
    wrote (nothing is changed then)."""
    (text,) = con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'asyncq_jobs'").fetchone()
    if _NEW_CHECK in text:
        return
    if text.count(_OLD_CHECK) != 1:
        raise StoreError("asyncq_jobs has a status check this asyncq did not write: cannot add the waiting status")
    (cookie,) = con.execute("PRAGMA schema_version").fetchone()
    con.execute("PRAGMA writable_schema = ON")
    try:
        con.execute(
            "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'asyncq_jobs'",
            (text.replace(_OLD_CHECK, _NEW_CHECK),),
        )
        con.execute(f"PRAGMA schema_version = {int(cookie) + 1}")
    finally:
        con.execute("PRAGMA writable_schema = OFF")


EDGES = """CREATE TABLE IF NOT EXISTS asyncq_edges (dependency INTEGER NOT NULL, dependant INTEGER NOT NULL,
  policy TEXT NOT NULL CHECK (policy IN ('dead', 'run', 'wait')),
  state TEXT NOT NULL CHECK (state IN ('open', 'met', 'failed')),
  PRIMARY KEY (dependency, dependant)) WITHOUT ROWID"""

GROUPS = """CREATE TABLE IF NOT EXISTS asyncq_groups (name TEXT PRIMARY KEY, members INTEGER NOT NULL DEFAULT 0,
  done INTEGER NOT NULL DEFAULT 0, dead INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,
  sealed_at INTEGER, completed_at INTEGER, callback_seq INTEGER) WITHOUT ROWID"""

GRAPHS: tuple[str | Callable[[sqlite3.Connection], None], ...] = (
    widen_status_check,
    "ALTER TABLE asyncq_jobs ADD COLUMN group_name TEXT",
    "ALTER TABLE asyncq_jobs ADD COLUMN links INTEGER",
    "ALTER TABLE asyncq_jobs ADD COLUMN waits INTEGER NOT NULL DEFAULT 0",
    "DROP INDEX IF EXISTS asyncq_jobs_live_deadline",
    f"CREATE INDEX asyncq_jobs_live_deadline ON asyncq_jobs(deadline) WHERE {LIVE_STATUSES}",
    "DROP INDEX IF EXISTS asyncq_jobs_unique",
    "CREATE UNIQUE INDEX asyncq_jobs_unique ON asyncq_jobs(queue, unique_key)"
    f" WHERE unique_key IS NOT NULL AND {LIVE_STATUSES}",
    # The jobs with edges not met (the waiting ones, and dependants that ended before they were met) in seq order, for
    # listings (``asyncq jobs --waiting``, the dashboard): O(waiting) at any depth. Neither this index nor the next
    # names ``status``: SQLite looks at an index on an update only if the update sets a column the index names, so
    # a claim or a finish (which set ``status``) never pays for them.
    "CREATE INDEX asyncq_jobs_waits ON asyncq_jobs(waits) WHERE waits > 0",
    # A group's members in seq order (``Queue.group_members``); only members have an entry.
    "CREATE INDEX asyncq_jobs_members ON asyncq_jobs(group_name) WHERE group_name IS NOT NULL",
    EDGES,
    "CREATE INDEX asyncq_edges_dependant ON asyncq_edges(dependant)",
    GROUPS,
    "CREATE INDEX asyncq_groups_callback ON asyncq_groups(callback_seq) WHERE callback_seq IS NOT NULL",
)

#: A finished job that a graph still needs, so that neither ``prune`` nor retention removes it (``j`` is the job): a
#: dependency of a job that has not ended (it may read its dependency's row or result), a member of a group whose
#: callback has not ended (it reads its members), a callback whose group is not complete. Only a row with ``links``
#: (a job in a graph) is looked at: for the others this costs one column read.
NEEDED_BY_GRAPH = """(j.links IS NOT NULL AND (
  EXISTS (SELECT 1 FROM asyncq_edges e JOIN asyncq_jobs d ON d.seq = e.dependant
          WHERE e.dependency = j.seq AND d.status IN ('waiting', 'pending', 'leased'))
  OR EXISTS (SELECT 1 FROM asyncq_groups g LEFT JOIN asyncq_jobs c ON c.seq = g.callback_seq
             WHERE g.name = j.group_name AND (g.completed_at IS NULL OR c.status IN ('waiting', 'pending', 'leased')))
  OR EXISTS (SELECT 1 FROM asyncq_groups g WHERE g.callback_seq = j.seq AND g.completed_at IS NULL)))"""
#: The edges removed with their jobs (either end): a dependency is removed only once nothing live waits for it.
REMOVE_EDGES = (
    "DELETE FROM asyncq_edges WHERE dependant IN (SELECT value FROM json_each(:seqs))",
    "DELETE FROM asyncq_edges WHERE dependency IN (SELECT value FROM json_each(:seqs))",
)
