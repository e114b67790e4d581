"""The ticket worker: ``python3 worker.py [--drain] [--pause NAME]``.

Takes one ready registration from RabbitMQ (``basic.get``, unacknowledged), prints
``Received R-0002 redelivered=False``, calls ``handle(ch, delivery, job, db, pause)`` from ``handler.py``
(or the module named by ``TICKET_DESK_HANDLER``), prints ``Handler returned.`` and exits. ``--drain``
repeats until nothing is ready; with nothing ready it prints ``No ready registrations``.

The handler is the only code that acknowledges the delivery, through a pika-shaped
``ch.basic_ack(delivery.delivery_tag)``. It runs in a thread of its own, so the event loop keeps serving
the connection (heartbeats included) while a ``--pause`` checkpoint waits for Enter. Ctrl+C closes the
connection, which returns an unacknowledged delivery to the queue, and exits with status 130, saying what
became of the delivery in hand: back to the queue if the handler had not acknowledged it, gone if it had.
An unknown ``--pause`` name is refused (exit status 2).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

import broker
import common
import store
from settings import Settings

INTERRUPTED = 130
USAGE = 2


class InHand:
    """The delivery this worker holds, as the Ctrl+C message needs it: its id, whether the handler's ack
    was sent (``None`` while it is being sent), and the handler's ``db`` (its open transaction, if any)."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.acked: bool | None = False
        self.db: sqlite3.Connection | None = None

    def take(self, registration_id: str) -> None:
        """A new delivery is in hand, not yet acknowledged."""
        self.id, self.acked, self.db = registration_id, False, None

    def done(self) -> None:
        """The handler returned: nothing is in hand any more."""
        self.id, self.db = None, None

    def interrupted(self) -> str:
        """What became of the delivery in hand, for the line printed at Ctrl+C."""
        if self.id is None:
            return "Interrupted; no registration was in hand."
        rollback = ""
        if self.db is not None and self.db.in_transaction:
            rollback = " Its open SQLite transaction is rolled back: nothing it wrote is kept."
        if self.acked is None:
            return (f"Interrupted while acknowledging {self.id}: RabbitMQ may have removed it or may return it;"
                    f" python3 desk.py status shows the queue.{rollback}")  # fmt: skip
        if self.acked:
            return (f"Interrupted; {self.id} was already acknowledged, so RabbitMQ has removed it and nothing"
                    f" goes back to the queue (python3 desk.py retry {self.id} republishes it).{rollback}")  # fmt: skip
        return (f"Interrupted; {self.id} was not acknowledged, so RabbitMQ returns it to the queue now that the"
                f" connection is closed (the next worker sees redelivered=True).{rollback}")  # fmt: skip


@dataclass(frozen=True)
class PikaDelivery:
    """What pika calls the method frame of a delivery: its tag and whether RabbitMQ redelivered it."""

    delivery_tag: int
    redelivered: bool


class PikaChannel:
    """The handler's ``ch``: pika's ``basic_ack`` for the one delivery it was handed, sent from the
    handler's thread through the event loop that owns the connection."""

    def __init__(self, message: AbstractIncomingMessage, loop: asyncio.AbstractEventLoop, in_hand: InHand) -> None:
        self._message = message
        self._loop = loop
        self._in_hand = in_hand

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """Acknowledge the delivery; returns once the ack is written to the connection."""
        if delivery_tag != self._message.delivery_tag or multiple:
            raise ValueError(f"this worker holds delivery {self._message.delivery_tag} only")
        self._in_hand.acked = None
        asyncio.run_coroutine_threadsafe(self._message.ack(), self._loop).result(timeout=30)
        self._in_hand.acked = True


def in_thread(work: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``work`` in a daemon thread: one blocked on Enter never holds up the exit after Ctrl+C."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Callable[[], object]) -> None:
        if not future.done():  # not cancelled by Ctrl+C meanwhile
            outcome()

    def target() -> None:
        try:
            outcome = functools.partial(future.set_result, work())
        except BaseException as exc:
            outcome = functools.partial(future.set_exception, exc)
        loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=target, name="handler", daemon=True).start()
    return future


def call_handler(handle: Callable[..., object], ch: PikaChannel, delivery: PikaDelivery, job: dict[str, Any],
                 settings: Settings, pause: str | None, in_hand: InHand) -> None:  # fmt: skip
    """``handle(ch, delivery, job, db, pause)`` with ``db`` a sqlite3 connection in the default mode (shared
    with the main thread only to read ``in_transaction`` at Ctrl+C)."""
    db = sqlite3.connect(settings.db_path, timeout=store.BUSY_TIMEOUT, check_same_thread=False)
    in_hand.db = db
    try:
        handle(ch, delivery, job, db, pause)
    finally:
        db.close()


async def take_one(queue: AbstractQueue, handle: Callable[..., object], settings: Settings,
                   pause: str | None, in_hand: InHand) -> bool:  # fmt: skip
    """Handle one ready message; ``False`` if none was ready."""
    message = await queue.get(no_ack=False, fail=False)
    if message is None:
        print("No ready registrations", flush=True)
        return False
    job = json.loads(message.body)
    redelivered = bool(message.redelivered)
    in_hand.take(str(job["id"]))
    print(f"Received {job['id']} redelivered={redelivered}", flush=True)
    assert message.delivery_tag is not None
    ch = PikaChannel(message, asyncio.get_running_loop(), in_hand)
    delivery = PikaDelivery(message.delivery_tag, redelivered)
    await in_thread(lambda: call_handler(handle, ch, delivery, job, settings, pause, in_hand))
    in_hand.done()
    print("Handler returned.", flush=True)
    if pause is not None and pause not in common.reached:
        print(f"Note: {settings.handler}.py has no checkpoint {pause!r}, so nothing paused.", file=sys.stderr)
    return True


async def work(settings: Settings, drain: bool, pause: str | None, in_hand: InHand) -> None:
    """One message, or every ready one with ``drain``."""
    handle = importlib.import_module(settings.handler).handle
    store.connect(settings.db_path).close()
    async with await aio_pika.connect(settings.amqp_url) as connection:
        channel = await connection.channel()
        queue = await broker.declare_queue(channel, settings)
        while await take_one(queue, handle, settings, pause, in_hand) and drain:
            pass


async def main(args: argparse.Namespace) -> int:
    """Run :func:`work` until it ends or Ctrl+C arrives; return the exit status."""
    settings = Settings.from_env()
    in_hand = InHand()
    interrupted = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    job = asyncio.create_task(work(settings, args.drain, args.pause, in_hand))
    stop = asyncio.create_task(interrupted.wait())
    await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not job.done():
        job.cancel()  # leaves the ``async with`` above: the connection closes, the delivery returns
        await asyncio.gather(job, return_exceptions=True)
        print(in_hand.interrupted(), file=sys.stderr)
        return INTERRUPTED
    stop.cancel()
    try:
        job.result()
    except (OSError, aiormq.exceptions.AMQPConnectionError) as exc:
        print(f"Cannot reach RabbitMQ at {settings.amqp_url}: {exc}", file=sys.stderr)
        return 1
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; an unknown pause point is refused with one line and exit status 2."""
    parser = argparse.ArgumentParser(description="Take one ready registration and call handle().")
    parser.add_argument("--drain", action="store_true", help="repeat until no registration is ready")
    names = ", ".join(common.CHECKPOINTS)
    parser.add_argument("--pause", metavar="NAME", help=f"wait for Enter or Ctrl+C at checkpoint NAME ({names})")
    args = parser.parse_args(argv)
    if args.pause is not None and args.pause not in common.CHECKPOINTS:
        parser.exit(USAGE, f"{parser.prog}: error: unknown pause point {args.pause!r}; the checkpoints are {names}\n")
    return args


if __name__ == "__main__":
    arguments = parse()
    broker.quiet_connect_errors()
    status = asyncio.run(main(arguments))
    sys.stdout.flush()
    sys.stderr.flush()
    # A handler thread may still wait on Enter (or hold an open transaction): end without joining it.
    os._exit(status)
