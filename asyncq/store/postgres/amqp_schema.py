"""The AMQP consumer's tables in their PostgreSQL schema, as forward migrations of the component ``amqp`` (the
SQLite driver's ``asyncq_amqp_*`` tables, column for column). ``{schema}`` is the schema's checked name.

- ``amqp_completed``: a key is written in the transaction of its effect, so it exists exactly when the effect
  committed;
- ``amqp_attempts``: how often an unfinished key was delivered, and its last error; written in a transaction of its
  own before the effect runs again;
- ``amqp_dead``: parked messages, whole, with their reason (a ``NULL`` key, a message without one, may repeat).
"""

from __future__ import annotations

from asyncq.store.postgres.connection import Migrations

AMQP = Migrations(
    component="amqp",
    steps=(
        (
            "CREATE TABLE {schema}.amqp_completed (key text PRIMARY KEY, at_ms bigint NOT NULL)",
            "CREATE TABLE {schema}.amqp_attempts (key text PRIMARY KEY, deliveries integer NOT NULL, last_error text)",
            """CREATE TABLE {schema}.amqp_dead (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  key text UNIQUE,
  queue text NOT NULL,
  body bytea NOT NULL,
  headers text NOT NULL,
  content_type text,
  deliveries integer NOT NULL,
  reason text NOT NULL,
  at_ms bigint NOT NULL
)""",
        ),
    ),
)
