"""An in-memory transport for tests and examples of the pool: it records every attempt and fails on script.

    transport = FakeTransport()
    transport.fail("job-1", Retryable("busy", delay_ms=0), Permanent("gone"))  # the next two attempts
    await transport.deliver("job-1", {"qty": 1}, {})  # raises Retryable, records the attempt

Bodies go through the same JSON encoding as HTTP delivery, so a body the real transport refuses
(``Permanent``) is refused here too, and what is recorded is a decoded copy the caller cannot change later.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncq.core.values import check_identifier
from asyncq.delivery.base import Body, encode_body


@dataclass(frozen=True)
class Delivery:
    """One call of :meth:`FakeTransport.deliver`, as the receiver would have seen it."""

    job_id: str
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class FakeTransport:
    """Records deliveries; succeeds unless :meth:`fail` scripted an error for the job's next attempt.

    ``hook``, if given, is awaited with each attempt before its outcome: tests use it to hold a delivery in
    flight (await an ``asyncio.Event``) or to observe concurrency.
    """

    def __init__(self, hook: Callable[[Delivery], Awaitable[None]] | None = None) -> None:
        self.hook = hook
        #: Every attempt, in call order, failed ones included.
        self.attempts: list[Delivery] = []
        #: The attempts that returned normally (the receiver "acknowledged").
        self.delivered: list[Delivery] = []
        self.closed = False
        self._script: dict[str, list[BaseException]] = {}
        self._always: dict[str, BaseException] = {}

    def fail(self, job_id: str, *errors: BaseException) -> None:
        """Raise ``errors`` on the next attempts for ``job_id``, one per attempt, then succeed again."""
        self._script.setdefault(check_identifier(job_id, "job_id"), []).extend(errors)

    def fail_always(self, job_id: str, error: BaseException | None) -> None:
        """Raise ``error`` on every attempt for ``job_id`` after any scripted ones; ``None`` stops that."""
        if error is None:
            self._always.pop(job_id, None)
        else:
            self._always[check_identifier(job_id, "job_id")] = error

    def delivered_ids(self) -> list[str]:
        """The ids of successful deliveries, in order (a job delivered twice appears twice)."""
        return [delivery.job_id for delivery in self.delivered]

    async def deliver(self, job_id: str, body: Body, headers: Mapping[str, str]) -> None:
        """Record the attempt, await the hook, then raise the scripted error or succeed."""
        if self.closed:
            raise RuntimeError("FakeTransport is closed")
        check_identifier(job_id, "job_id")
        delivery = Delivery(job_id, json.loads(encode_body(body)), dict(headers))
        self.attempts.append(delivery)
        if self.hook is not None:
            await self.hook(delivery)
        scripted = self._script.get(job_id)
        if scripted:
            raise scripted.pop(0)
        if job_id in self._always:
            raise self._always[job_id]
        self.delivered.append(delivery)

    async def close(self) -> None:
        """Mark the transport closed; later deliveries raise ``RuntimeError``."""
        self.closed = True
