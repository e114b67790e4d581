"""A child process for the AMQP consumer's chaos test: ``python tests/amqp_children.py CONFIG_JSON``.

An ``IdempotentConsumer`` on the store the config names (a SQLite file or a ``postgresql://`` URL) whose effect adds
one row to the app's ``tickets`` table, in either dialect. It prints ``consuming`` once the broker confirmed the
consumer, then ``KEY OUTCOME redelivered=…`` per answered delivery, and runs until SIGTERM (a graceful stop, rc 0).
The repository root is put on ``sys.path``, so the child imports ``asyncq`` from this checkout.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncq.amqp import Delivery, DeliveryOutcome, EffectTransaction, IdempotentConsumer

ADD_TICKET = {"sqlite": "INSERT INTO tickets (key) VALUES (?)", "postgresql": "INSERT INTO tickets (key) VALUES ($1)"}


def add_ticket(tx: EffectTransaction, delivery: Delivery) -> None:
    tx.execute(ADD_TICKET[tx.dialect], (delivery.key,))


def report(delivery: Delivery, outcome: DeliveryOutcome) -> None:
    print(f"{delivery.key} {outcome.value} redelivered={delivery.redelivered}", flush=True)


async def main(config: dict[str, Any]) -> None:
    consumer = IdempotentConsumer(
        config["store"], add_ticket, queue=config["queue"], url=config["amqp_url"], prefetch=20, concurrency=4,
        queue_arguments=config["queue_arguments"], on_outcome=report,
    )  # fmt: skip
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(consumer.stop()))
    await consumer.start()
    print("consuming", flush=True)
    await consumer.run()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
