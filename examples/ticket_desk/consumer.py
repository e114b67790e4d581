"""The product-level worker: ``python3 consumer.py [--prefetch 20] [--concurrency 4] [--verbose]``.

The same safe pattern as ``handler.py``, done by :class:`asyncq.amqp.IdempotentConsumer`: the ticket and
the completion keys (asyncq's and the desk's ``completed``) commit in one transaction, the delivery is
acknowledged after COMMIT, a redelivered completed registration is acknowledged without a second ticket,
and a registration that keeps failing is parked after ``--delivery-limit`` deliveries. Runs until SIGINT
or SIGTERM, then stops gracefully and prints its counts.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from asyncq.amqp import Delivery, EffectTransaction, IdempotentConsumer, Outcome

import store
from settings import Settings


def issue_ticket(db: EffectTransaction, delivery: Delivery) -> None:
    """The database effect: runs inside the transaction that records the completion key."""
    job = delivery.json()
    assert isinstance(job, dict)
    db.execute("INSERT OR IGNORE INTO completed VALUES (?)", (job["id"],))
    db.execute("INSERT INTO tickets(registration_id,name) VALUES (?,?)", (job["id"], job["name"]))


def report(delivery: Delivery, outcome: Outcome) -> None:
    """One line per answered delivery (``--verbose``)."""
    print(f"{delivery.key} {outcome.value} redelivered={delivery.redelivered}", flush=True)


async def main(args: argparse.Namespace) -> None:
    """Consume until a signal asks to stop."""
    settings = Settings.from_env()
    store.connect(settings.db_path).close()
    consumer = IdempotentConsumer(
        settings.db_path,
        issue_ticket,
        queue=settings.queue,
        url=settings.amqp_url,
        prefetch=args.prefetch,
        concurrency=args.concurrency,
        delivery_limit=args.delivery_limit,
        queue_arguments=settings.queue_arguments,
        on_outcome=report if args.verbose else None,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: asyncio.ensure_future(consumer.stop()))
    await consumer.start()
    print(f"Consuming {settings.queue} (prefetch={args.prefetch}, concurrency={args.concurrency})", flush=True)
    await consumer.run()
    print(f"Stopped: {consumer.stats}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Issue tickets with asyncq's idempotent consumer.")
    parser.add_argument("--prefetch", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delivery-limit", type=int, default=5)
    parser.add_argument("--verbose", action="store_true", help="print every delivery's outcome")
    asyncio.run(main(parser.parse_args()))
