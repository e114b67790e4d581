"""The ticket desk's RabbitMQ queue: declared the same way by every process, and counted for ``desk.py status``.

The ready count comes from an AMQP passive declare. AMQP cannot tell how many deliveries are out with
consumers unacknowledged; that count comes from ``rabbitmqctl list_queues`` (``RABBITMQCTL`` names the
program) and is ``None``, shown as unknown and never as 0, when it cannot be asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractQueue
from asyncq.delivery.amqp import AmqpTransport

from settings import Settings


async def declare_queue(channel: AbstractChannel, settings: Settings) -> AbstractQueue:
    """Declare the durable registrations queue (idempotent when the arguments match)."""
    return await channel.declare_queue(settings.queue, durable=True, arguments=settings.queue_arguments)


def transport(settings: Settings) -> AmqpTransport:
    """A confirmed, ``mandatory`` publisher to the queue, declaring it on each new channel."""
    return AmqpTransport(
        settings.amqp_url,
        routing_key=settings.queue,
        declare=lambda channel: declare_queue(channel, settings),
    )


@dataclass(frozen=True)
class Count:
    """A count with where it came from; ``value`` ``None`` means unknown."""

    value: int | None
    source: str

    def __str__(self) -> str:
        shown = "unknown" if self.value is None else str(self.value)
        return f"{shown} ({self.source})"


async def ready_count(settings: Settings) -> Count:
    """Messages ready for delivery, from a passive declare (which never creates the queue)."""
    try:
        connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        return Count(None, f"broker unreachable: {exc}")
    async with connection:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(settings.queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return Count(0, "AMQP passive declare: the queue does not exist yet")
        ready = queue.declaration_result.message_count
        return Count(ready, "AMQP passive declare")


def unacknowledged_count(settings: Settings) -> Count:
    """Deliveries held unacknowledged by consumers, from ``rabbitmqctl list_queues``."""
    program = os.environ.get("RABBITMQCTL") or shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    vhost = unquote(urlsplit(settings.amqp_url).path[1:]) or "/"
    command = [program, "-q", "list_queues", "-p", vhost, "--no-table-headers"]
    command += ["name", "messages_ready", "messages_unacknowledged"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=15, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return Count(None, f"rabbitmqctl unavailable: {exc}")
    for line in done.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[0] == settings.queue:
            return Count(int(fields[2]), "rabbitmqctl list_queues")
    return Count(None, f"rabbitmqctl does not list {settings.queue}")
