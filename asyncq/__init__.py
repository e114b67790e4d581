"""asyncq: a durable job queue inside asyncio applications, on a local SQLite file.

Public names load lazily (PEP 562) so that ``import asyncq.lab.lease`` needs only the standard library.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AsyncqError",
    "BadAck",
    "Conflict",
    "FakeTransport",
    "HttpTransport",
    "Inbox",
    "Job",
    "JobContext",
    "JobSpec",
    "Outbox",
    "Permanent",
    "Pool",
    "Queue",
    "Relay",
    "RetryPolicy",
    "Retryable",
    "Ticket",
    "deliver_with",
    "enqueue_sync",
]

_WHERE = {
    "AsyncqError": "asyncq.errors",
    "BadAck": "asyncq.errors",
    "Conflict": "asyncq.errors",
    "FakeTransport": "asyncq.delivery.fake",
    "HttpTransport": "asyncq.delivery.http",
    "Inbox": "asyncq.inbox",
    "Job": "asyncq.core.jobs",
    "JobContext": "asyncq.worker.context",
    "JobSpec": "asyncq.core.jobs",
    "Outbox": "asyncq.outbox",
    "Permanent": "asyncq.errors",
    "Pool": "asyncq.worker.pool",
    "Queue": "asyncq.queue",
    "Relay": "asyncq.outbox",
    "RetryPolicy": "asyncq.worker.context",
    "Retryable": "asyncq.errors",
    "Ticket": "asyncq.core.jobs",
    "deliver_with": "asyncq.worker.context",
    "enqueue_sync": "asyncq.store.sqlite.sync",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
