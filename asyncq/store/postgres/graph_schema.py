"""Version 10 of the PostgreSQL queue schema: dependencies and groups (the SQLite store's v13;
``docs/dependencies.md``). ``{schema}`` is the schema's checked name.

- ``jobs`` gains the ``waiting`` status (its check replaced: added ``NOT VALID``, then validated by one read of the
  table, no rewrite), ``group_name``, ``links`` (``core.dependencies``' flags, NULL for a job in no graph) and
  ``waits`` (a constant default: no rewrite either).
- ``edges`` (keyed by the two jobs' ``seq``) and ``groups`` (counters and the callback job).
- The live-deadline and unique-key indexes take ``waiting`` in; a waiting job is in no claim's index.
"""

from __future__ import annotations

GRAPHS = (
    "ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_status_check",
    "ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_status_check"
    " CHECK (status IN ('pending', 'leased', 'done', 'dead', 'waiting')) NOT VALID",
    "ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_status_check",
    "ALTER TABLE {schema}.jobs ADD COLUMN group_name text, ADD COLUMN links integer,"
    " ADD COLUMN waits integer NOT NULL DEFAULT 0",
    "DROP INDEX {schema}.jobs_live_deadline",
    "CREATE INDEX jobs_live_deadline ON {schema}.jobs (deadline) WHERE status IN ('pending', 'leased', 'waiting')",
    "DROP INDEX {schema}.jobs_unique",
    "CREATE UNIQUE INDEX jobs_unique ON {schema}.jobs (queue, unique_key)"
    " WHERE unique_key IS NOT NULL AND status IN ('pending', 'leased', 'waiting')",
    # The jobs with edges not met (the waiting ones among them) in seq order, for listings, and a group's members in
    # seq order (``group_members``): neither names ``status``, which every claim and finish sets (the SQLite v13's).
    "CREATE INDEX jobs_waits ON {schema}.jobs (seq) WHERE waits > 0",
    "CREATE INDEX jobs_members ON {schema}.jobs (group_name, seq) WHERE group_name IS NOT NULL",
    """CREATE TABLE {schema}.edges (
  dependency bigint NOT NULL,
  dependant bigint NOT NULL,
  policy text NOT NULL CHECK (policy IN ('dead', 'run', 'wait')),
  state text NOT NULL CHECK (state IN ('open', 'met', 'failed')),
  PRIMARY KEY (dependency, dependant)
)""",
    "CREATE INDEX edges_dependant ON {schema}.edges (dependant)",
    """CREATE TABLE {schema}.groups (
  name text PRIMARY KEY,
  members bigint NOT NULL DEFAULT 0,
  done bigint NOT NULL DEFAULT 0,
  dead bigint NOT NULL DEFAULT 0,
  created_at bigint NOT NULL,
  sealed_at bigint,
  completed_at bigint,
  callback_seq bigint
)""",
    "CREATE INDEX groups_callback ON {schema}.groups (callback_seq) WHERE callback_seq IS NOT NULL",
)

#: A finished job a graph still needs (the SQLite store's ``graph_schema.NEEDED_BY_GRAPH``; ``j`` is the job): a
#: dependency of a job not ended, a member of a group whose callback has not ended, a callback of a group not
#: complete. Only a row with ``links`` is looked at.
NEEDED_BY_GRAPH = """(j.links IS NOT NULL AND (
  EXISTS (SELECT 1 FROM {schema}.edges e JOIN {schema}.jobs d ON d.seq = e.dependant
          WHERE e.dependency = j.seq AND d.status IN ('waiting', 'pending', 'leased'))
  OR EXISTS (SELECT 1 FROM {schema}.groups g LEFT JOIN {schema}.jobs c ON c.seq = g.callback_seq
             WHERE g.name = j.group_name AND (g.completed_at IS NULL OR c.status IN ('waiting', 'pending', 'leased')))
  OR EXISTS (SELECT 1 FROM {schema}.groups g WHERE g.callback_seq = j.seq AND g.completed_at IS NULL)))"""
