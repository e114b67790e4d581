"""What a handler sees: the job context, the handler type, and a transport turned into a handler.
``RetryPolicy`` (``asyncq.core.backoff``) is re-exported here for the pool's users."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from asyncq.core.backoff import RetryPolicy
from asyncq.core.jsontext import JSON
from asyncq.delivery.base import Transport


@dataclass(slots=True)
class JobContext:
    """What a handler knows about the job it runs."""

    id: str
    queue: str
    attempt: int
    token: int
    deadline: int
    lease_until: int


#: A handler: an async function of a job's decoded body (``asyncq.JSON``) and its context.
Handler = Callable[[JSON, JobContext], Awaitable[object]]


def job_fields(job_id: str, queue: str, attempt: int, outcome: str | None) -> dict[str, Any]:
    """The structured fields of a per-job log record (``extra=``), so that a JSON formatter shows them; the task
    layer adds ``task``."""
    return {"job_id": job_id, "queue": queue, "attempt": attempt, "outcome": outcome}


class TransportHandler:
    """A handler that delivers each job's body through a transport, with its fencing token in the
    ``Asyncq-Token`` header (the transport adds the id as ``Idempotency-Key``).

    The pool calls ``deliver`` with the body as stored (canonical JSON text, a ``JsonText``), which the
    transport sends as it is: no decoding and encoding again per job, and no ``JobContext`` built."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def __call__(self, body: JSON, context: JobContext) -> Awaitable[None]:
        return self.deliver(context.id, context.token, body)

    def deliver(self, job_id: str, token: int, body: JSON) -> Awaitable[None]:
        """Deliver ``body`` (a decoded body, or a ``JsonText`` sent as it is) as job ``job_id`` under fencing
        token ``token``.

        Both methods return the transport's own coroutine instead of awaiting it in one more: every
        coroutine frame between the pool and aiohttp is passed on each of a request's several resumptions."""
        return self.transport.deliver(job_id, body, {"Asyncq-Token": str(token)})


def deliver_with(transport: Transport) -> TransportHandler:
    """The handler that delivers jobs through ``transport`` (see ``TransportHandler``)."""
    return TransportHandler(transport)


__all__ = ["Handler", "JobContext", "RetryPolicy", "TransportHandler", "deliver_with"]
