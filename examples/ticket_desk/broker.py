"""The ticket desk's RabbitMQ queue: declared the same way by every process, and counted for ``desk.py status``.

The ready count comes from an AMQP passive declare. AMQP cannot tell how many deliveries are out with
consumers unacknowledged; that count comes from ``rabbitmqctl list_queues`` (``RABBITMQCTL`` names the
program) and is ``None``, shown as unknown and never as 0, when it cannot be asked or when the broker
itself did not answer (``rabbitmqctl`` would then describe some other broker, or a stale queue).
"""

from __future__ import annotations

import logging
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


LOOPBACK = {"127.0.0.1", "localhost", "::1"}


async def queue_counts(settings: Settings) -> tuple[Count, Count]:
    """``(ready, unacknowledged)``: ready from a passive declare; unacknowledged from ``rabbitmqctl``, asked
    only when that broker answered and is this machine's (``rabbitmqctl`` speaks for the local node)."""
    try:
        connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    except (OSError, aiormq.exceptions.AMQPError) as exc:
        reason = f"broker unreachable: {exc}"
        return Count(None, reason), Count(None, f"not asked, {reason}")
    async with connection:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(settings.queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            absent = "AMQP passive declare: the queue does not exist yet"
            return Count(0, absent), Count(0, absent)
        ready = Count(queue.declaration_result.message_count, "AMQP passive declare")
    host = urlsplit(settings.amqp_url).hostname or "127.0.0.1"
    if host not in LOOPBACK:
        return ready, Count(None, f"rabbitmqctl speaks for this machine's broker, not {host}")
    return ready, unacknowledged_count(settings)


async def empty_queue(settings: Settings) -> Count:
    """Delete the queue (its ready messages, and deliveries a worker still holds) and declare it again,
    empty; the ready count read back from the new queue."""
    async with await aio_pika.connect(settings.amqp_url, timeout=5) as connection:
        channel = await connection.channel()
        await channel.queue_delete(settings.queue)
        queue = await declare_queue(channel, settings)
        return Count(queue.declaration_result.message_count, "AMQP declare after deleting the queue")


def quiet_connect_errors() -> None:
    """Silence aiormq's own log line for a failed connect: every caller here says it once, in its words."""
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)


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
