"""``python3 desk.py reset``: lay out the seed's starting point, and say what was done.

* ``handler.py`` becomes the original handler, which acknowledges before it writes (what the seed's
  ``cat handler.py`` shows); a ``handler.py`` that is not already that one is kept as
  ``handler.py.before-reset``. The shipped ``handler.py`` is the safe one: the lesson's third block, or
  ``git checkout handler.py``, brings it back.
* The store is made fresh in one transaction: Mina Patel's registration R-0001 and her ticket #1, nothing
  else (the previous rows are kept in ``<store>.before-reset.db``).
* The queue is deleted and declared again: empty, including deliveries a running worker still held.

Nothing changes when the broker cannot be reached or a worker holds the store's write transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import aio_pika
import aiormq

import broker
import store
from settings import HERE, Settings

STARTING_HANDLER = HERE / "handler_ack_first.py"


class Refused(Exception):
    """The reset did not start; nothing was changed."""


def backup_path(db_path: Path) -> Path:
    """Where the previous store is kept: ``nightjar.db`` -> ``nightjar.before-reset.db``."""
    return db_path.with_name(f"{db_path.stem}.before-reset{db_path.suffix or '.db'}")


async def check_broker(settings: Settings) -> None:
    """Refuse unless the broker answers."""
    try:
        connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        raise Refused(f"RabbitMQ does not answer at {settings.amqp_url} ({exc}); nothing was changed") from exc
    await connection.close()


def reset_store(db_path: Path) -> Path | None:
    """Keep a copy of the store as it was (``None`` if there was no file), then make it fresh."""
    kept = backup_path(db_path) if db_path.exists() else None
    db = store.connect(db_path)
    try:
        store.reset(db, kept)
    except sqlite3.OperationalError as exc:
        if not store.is_busy(exc):
            raise
        raise Refused(
            "a worker holds the store's write transaction (paused inside it?); press Ctrl+C in its"
            " terminal and run reset again; nothing was changed"
        ) from exc
    finally:
        db.close()
    return kept


def place_starting_handler(folder: Path) -> Path | None:
    """Make ``handler.py`` the original, ack-first handler; returns where a different one was kept."""
    handler = folder / "handler.py"
    starting = STARTING_HANDLER.read_text()
    kept = None
    if handler.exists() and handler.read_text() != starting:
        kept = folder / "handler.py.before-reset"
        kept.write_text(handler.read_text())
    handler.write_text(starting)
    return kept


def reset(settings: Settings) -> list[str]:
    """Do the reset; the lines that say what was done."""
    asyncio.run(check_broker(settings))
    kept_store = reset_store(settings.db_path)
    try:
        ready = asyncio.run(broker.empty_queue(settings))
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        raise Refused(f"the store was reset but the queue could not be emptied ({exc}); run reset again") from exc
    kept_handler = place_starting_handler(HERE)
    lines = [
        "Reset to the seed's starting point:",
        "  handler.py: the original handler, which acknowledges before it writes (cat handler.py shows it)",
        f"  store {settings.db_path}: fresh, with Mina Patel's registration R-0001 and her ticket #1",
        f"  queue {settings.queue}: empty, {ready.value} ready (deleted and declared again)",
        "The shipped handler.py is the safe one: the lesson's third block (or git checkout handler.py) brings it back.",
    ]
    if kept_handler is not None:
        lines.append(f"Your previous handler.py is kept as {kept_handler.name}.")
    if kept_store is not None:
        lines.append(f"The previous store is kept as {kept_store}.")
    if settings.handler != "handler":
        lines.append(f"Note: TICKET_DESK_HANDLER={settings.handler}, so worker.py runs {settings.handler}.py.")
    return lines
