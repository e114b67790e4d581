"""The outbox's tables in their PostgreSQL schema, as forward migrations of the component ``outbox`` (SQLite's
``OUTBOX_TABLES``, column for column). ``{schema}`` is the schema's checked name.

``seq`` is the delivery order and has no default: an add numbers its item ``max(seq) + 1`` under the outbox's order
lock (``asyncq.store.postgres.outbox``), so numbers follow commits and have no gaps. Sent items leave the partial
index the head and the figures read.
"""

from __future__ import annotations

from asyncq.store.postgres.connection import Migrations

OUTBOX = Migrations(
    component="outbox",
    steps=(
        (
            """CREATE TABLE {schema}.outbox (
  seq bigint PRIMARY KEY,
  id text NOT NULL UNIQUE,
  topic text NOT NULL,
  body text NOT NULL,
  created_at bigint NOT NULL,
  state text NOT NULL CHECK (state IN ('unsent', 'sent', 'alarm', 'quarantined')),
  attempts integer NOT NULL DEFAULT 0,
  budget_from integer NOT NULL DEFAULT 0,
  last_error text,
  next_attempt_at bigint NOT NULL,
  sent_at bigint
) WITH (fillfactor = 80)""",
            # The head and the figures read the waiting items only: sent ones leave the index.
            "CREATE INDEX outbox_waiting ON {schema}.outbox (seq) WHERE state IN ('unsent', 'alarm')",
            "CREATE INDEX outbox_quarantined ON {schema}.outbox (seq) WHERE state = 'quarantined'",
            """CREATE TABLE {schema}.outbox_audit (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id text NOT NULL,
  item_seq bigint NOT NULL,
  at_ms bigint NOT NULL,
  action text NOT NULL CHECK (action IN ('retry', 'quarantine', 'requeue')),
  from_state text NOT NULL,
  note text NOT NULL,
  reason text,
  attempts integer NOT NULL,
  last_error text,
  skipped_ahead_of text NOT NULL,
  skipped_count integer NOT NULL
)""",
            "CREATE INDEX outbox_audit_id ON {schema}.outbox_audit (id)",
            """CREATE TABLE {schema}.outbox_lease (
  name text PRIMARY KEY,
  owner text,
  token bigint NOT NULL,
  lease_until bigint
)""",
            "INSERT INTO {schema}.outbox_lease (name, token) VALUES ('relay', 0)",
        ),
    ),
)
