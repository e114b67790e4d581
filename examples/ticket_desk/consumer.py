"""The product-level worker: ``python3 consumer.py [--prefetch 20] [--concurrency 4] [--verbose]``.

The same safe pattern as ``handler.py``, done by :class:`asyncq.amqp.IdempotentConsumer`, with the same
completion rule: the desk's ``completed`` table decides, whichever worker wrote it. The effect runs
``handler.py``'s two statements (``INSERT OR IGNORE INTO completed`` and, only if that added a row, the
ticket) inside the consumer's transaction, which also records asyncq's own key; the delivery is
acknowledged after COMMIT. So a registration that ``handler.py`` already ticketed gets no second ticket
here (``already ticketed``), and a redelivered completed registration is acknowledged without one; a
registration that keeps failing is parked after ``--delivery-limit`` deliveries. Runs until SIGINT or
SIGTERM, then stops gracefully and prints its counts.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from collections.abc import Callable

import aiormq
from asyncq.amqp import Delivery, DeliveryOutcome, EffectTransaction, IdempotentConsumer

import broker
import store
from settings import Settings

ALREADY_TICKETED = "already-ticketed"


class TicketDesk:
    """The effect, and what it found: the keys whose registration already had the desk's completion key."""

    def __init__(self) -> None:
        self.already_ticketed = 0
        self._skipped: set[str] = set()
        self._lock = threading.Lock()  # effects run in the consumer's worker threads

    def issue_ticket(self, db: EffectTransaction, delivery: Delivery) -> None:
        """``handler.py``'s rule, inside the transaction that also records asyncq's key: the completion
        key first, and the ticket only if that key is new."""
        job = delivery.json()
        assert isinstance(job, dict)
        added = db.execute("INSERT OR IGNORE INTO completed VALUES (?) RETURNING 1", (job["id"],))
        if added:
            db.execute("INSERT INTO tickets(registration_id,name) VALUES (?,?)", (job["id"], job["name"]))
        if not added:
            with self._lock:
                self._skipped.add(str(delivery.key))

    def outcome(self, delivery: Delivery, outcome: DeliveryOutcome) -> str:
        """The outcome to print: ``already-ticketed`` when the effect found the desk's key."""
        with self._lock:
            skipped = outcome is DeliveryOutcome.COMPLETED and str(delivery.key) in self._skipped
            self._skipped.discard(str(delivery.key))
        self.already_ticketed += skipped
        return ALREADY_TICKETED if skipped else outcome.value


def reporter(desk: TicketDesk, verbose: bool) -> Callable[[Delivery, DeliveryOutcome], None]:
    """Count each answered delivery; with ``verbose`` print one line for it."""

    def report(delivery: Delivery, outcome: DeliveryOutcome) -> None:
        shown = desk.outcome(delivery, outcome)
        if verbose:
            print(f"{delivery.key} {shown} redelivered={delivery.redelivered}", flush=True)

    return report


async def main(args: argparse.Namespace) -> int:
    """Consume until a signal asks to stop; the exit status."""
    settings = Settings.from_env()
    store.connect(settings.db_path).close()
    desk = TicketDesk()
    consumer = IdempotentConsumer(
        settings.db_path,
        desk.issue_ticket,
        queue=settings.queue,
        url=settings.amqp_url,
        prefetch=args.prefetch,
        concurrency=args.concurrency,
        delivery_limit=args.delivery_limit,
        queue_arguments=settings.queue_arguments,
        on_outcome=reporter(desk, args.verbose),
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: asyncio.ensure_future(consumer.stop()))
    try:
        await consumer.start()
    except (OSError, aiormq.exceptions.AMQPConnectionError) as exc:
        print(f"Cannot reach RabbitMQ at {settings.amqp_url}: {exc}", file=sys.stderr)
        return 1
    print(f"Consuming {settings.queue} (prefetch={args.prefetch}, concurrency={args.concurrency})", flush=True)
    await consumer.run()
    stats = consumer.stats
    print(
        f"Stopped: {stats.delivered} delivered ({stats.redelivered} redelivered), "
        f"{stats.completed - desk.already_ticketed} tickets issued, {desk.already_ticketed} already ticketed, "
        f"{stats.duplicates} duplicates acknowledged, {stats.parked} parked, {stats.requeued} requeued",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Issue tickets with asyncq's idempotent consumer.")
    parser.add_argument("--prefetch", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delivery-limit", type=int, default=5)
    parser.add_argument("--verbose", action="store_true", help="print every delivery's outcome")
    arguments = parser.parse_args()
    broker.quiet_connect_errors()
    sys.exit(asyncio.run(main(arguments)))
