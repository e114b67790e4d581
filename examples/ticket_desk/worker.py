"""The ticket worker: ``python3 worker.py [--drain] [--pause NAME]``.

Takes one ready registration from RabbitMQ (``basic.get``, unacknowledged), prints
``Received R-0002 redelivered=False``, calls ``handle(ch, delivery, job, db, pause)`` from ``handler.py``
(or the module named by ``TICKET_DESK_HANDLER``), prints ``Handler returned.`` and exits. ``--drain``
repeats until nothing is ready; with nothing ready it prints ``No ready registrations``.

The handler is the only code that acknowledges the delivery, through a pika-shaped
``ch.basic_ack(delivery.delivery_tag)``. It runs in a thread of its own, so the event loop keeps serving
the connection (heartbeats included) while a ``--pause`` checkpoint waits for Enter. Ctrl+C closes the
connection, which returns an unacknowledged delivery to the queue, and exits with status 130.
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
import store
from settings import Settings

INTERRUPTED = 130


@dataclass(frozen=True)
class PikaDelivery:
    """What pika calls the method frame of a delivery: its tag and whether RabbitMQ redelivered it."""

    delivery_tag: int
    redelivered: bool


class PikaChannel:
    """The handler's ``ch``: pika's ``basic_ack`` for the one delivery it was handed, sent from the
    handler's thread through the event loop that owns the connection."""

    def __init__(self, message: AbstractIncomingMessage, loop: asyncio.AbstractEventLoop) -> None:
        self._message = message
        self._loop = loop

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """Acknowledge the delivery; returns once the ack is written to the connection."""
        if delivery_tag != self._message.delivery_tag or multiple:
            raise ValueError(f"this worker holds delivery {self._message.delivery_tag} only")
        asyncio.run_coroutine_threadsafe(self._message.ack(), self._loop).result(timeout=30)


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
                 settings: Settings, pause: str | None) -> None:  # fmt: skip
    """``handle(ch, delivery, job, db, pause)`` with ``db`` a sqlite3 connection in the default mode."""
    db = sqlite3.connect(settings.db_path, timeout=10.0)
    try:
        handle(ch, delivery, job, db, pause)
    finally:
        db.close()


async def take_one(queue: AbstractQueue, handle: Callable[..., object], settings: Settings,
                   pause: str | None) -> bool:  # fmt: skip
    """Handle one ready message; ``False`` if none was ready."""
    message = await queue.get(no_ack=False, fail=False)
    if message is None:
        print("No ready registrations", flush=True)
        return False
    job = json.loads(message.body)
    redelivered = bool(message.redelivered)
    print(f"Received {job['id']} redelivered={redelivered}", flush=True)
    assert message.delivery_tag is not None
    ch = PikaChannel(message, asyncio.get_running_loop())
    delivery = PikaDelivery(message.delivery_tag, redelivered)
    await in_thread(lambda: call_handler(handle, ch, delivery, job, settings, pause))
    print("Handler returned.", flush=True)
    return True


async def work(settings: Settings, drain: bool, pause: str | None) -> None:
    """One message, or every ready one with ``drain``."""
    handle = importlib.import_module(settings.handler).handle
    store.connect(settings.db_path).close()
    async with await aio_pika.connect(settings.amqp_url) as connection:
        channel = await connection.channel()
        queue = await broker.declare_queue(channel, settings)
        while await take_one(queue, handle, settings, pause) and drain:
            pass


async def main(args: argparse.Namespace) -> int:
    """Run :func:`work` until it ends or Ctrl+C arrives; return the exit status."""
    settings = Settings.from_env()
    interrupted = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    job = asyncio.create_task(work(settings, args.drain, args.pause))
    stop = asyncio.create_task(interrupted.wait())
    await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not job.done():
        job.cancel()  # leaves the ``async with`` above: the connection closes, the delivery returns
        await asyncio.gather(job, return_exceptions=True)
        print("Interrupted; an unacknowledged delivery goes back to RabbitMQ.", file=sys.stderr)
        return INTERRUPTED
    stop.cancel()
    try:
        job.result()
    except (OSError, aiormq.exceptions.AMQPConnectionError) as exc:
        print(f"Cannot reach RabbitMQ at {settings.amqp_url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Take one ready registration and call handle().")
    parser.add_argument("--drain", action="store_true", help="repeat until no registration is ready")
    parser.add_argument("--pause", metavar="NAME", help="wait for Enter or Ctrl+C at checkpoint NAME")
    status = asyncio.run(main(parser.parse_args()))
    sys.stdout.flush()
    sys.stderr.flush()
    # A handler thread may still wait on Enter (or hold an open transaction): end without joining it.
    os._exit(status)
