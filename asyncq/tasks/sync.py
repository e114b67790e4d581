"""``Task.defer_sync``'s write: a task's job body through ``enqueue_sync``, in the caller's ``sqlite3``
transaction (the SQLite driver's by nature, like ``enqueue_sync`` itself)."""

from __future__ import annotations

import sqlite3
from typing import Any

from asyncq.store.sqlite.sync import enqueue_sync


def enqueue_body(con: sqlite3.Connection, job_id: str, body: dict[str, Any], options: dict[str, Any]) -> bool:
    """Enqueue ``body`` as job ``job_id`` through ``con`` (see ``enqueue_sync``)."""
    return enqueue_sync(con, job_id, body, **options)
