"""asyncq: a durable job queue inside asyncio applications, on a local SQLite file or on PostgreSQL.

Public names load lazily (PEP 562) so that ``import asyncq.lab.lease`` needs only the standard library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real types for mypy and editors; at run time each name loads on first use
    from asyncq.core.backoff import RetryPolicy
    from asyncq.core.dependencies import Dependency, WaitsFor
    from asyncq.core.groups import Group, GroupOutcome, group_callback_id
    from asyncq.core.jobs import Job, JobSpec, Ticket
    from asyncq.core.jsontext import JSON
    from asyncq.core.lifecycle import Outcome
    from asyncq.core.schedules import Schedule, ScheduleEvent, ScheduleSpec
    from asyncq.delivery.fake import FakeTransport
    from asyncq.delivery.http import HttpTransport
    from asyncq.errors import (
        AsyncqError,
        BadAck,
        Conflict,
        InvalidArguments,
        JobFailed,
        Permanent,
        Retryable,
        UniqueConflict,
    )
    from asyncq.inbox import Inbox
    from asyncq.outbox import Outbox, Relay
    from asyncq.queue import Queue
    from asyncq.sqlite import enqueue_sync
    from asyncq.tasks import App, Task, TaskGroup, TaskJob, open
    from asyncq.worker.cancelling import shield
    from asyncq.worker.context import JobContext, deliver_with
    from asyncq.worker.pool import Pool

__all__ = [  # noqa: RUF022 (plain sorted order, as tests/test_exported_members.py pins it)
    "App",
    "AsyncqError",
    "BadAck",
    "Conflict",
    "Dependency",
    "FakeTransport",
    "Group",
    "GroupOutcome",
    "HttpTransport",
    "Inbox",
    "InvalidArguments",
    "JSON",
    "Job",
    "JobContext",
    "JobFailed",
    "JobSpec",
    "Outbox",
    "Outcome",
    "Permanent",
    "Pool",
    "Queue",
    "Relay",
    "RetryPolicy",
    "Retryable",
    "Schedule",
    "ScheduleEvent",
    "ScheduleSpec",
    "Task",
    "TaskGroup",
    "TaskJob",
    "Ticket",
    "UniqueConflict",
    "WaitsFor",
    "deliver_with",
    "enqueue_sync",
    "group_callback_id",
    "open",
    "shield",
]

_WHERE = {
    "App": "asyncq.tasks",
    "AsyncqError": "asyncq.errors",
    "BadAck": "asyncq.errors",
    "Conflict": "asyncq.errors",
    "Dependency": "asyncq.core.dependencies",
    "FakeTransport": "asyncq.delivery.fake",
    "Group": "asyncq.core.groups",
    "GroupOutcome": "asyncq.core.groups",
    "HttpTransport": "asyncq.delivery.http",
    "Inbox": "asyncq.inbox",
    "InvalidArguments": "asyncq.errors",
    "JSON": "asyncq.core.jsontext",
    "Job": "asyncq.core.jobs",
    "JobContext": "asyncq.worker.context",
    "JobFailed": "asyncq.errors",
    "JobSpec": "asyncq.core.jobs",
    "Outbox": "asyncq.outbox",
    "Outcome": "asyncq.core.lifecycle",
    "Permanent": "asyncq.errors",
    "Pool": "asyncq.worker.pool",
    "Queue": "asyncq.queue",
    "Relay": "asyncq.outbox",
    "RetryPolicy": "asyncq.core.backoff",
    "Retryable": "asyncq.errors",
    "Schedule": "asyncq.core.schedules",
    "ScheduleEvent": "asyncq.core.schedules",
    "ScheduleSpec": "asyncq.core.schedules",
    "Task": "asyncq.tasks",
    "TaskGroup": "asyncq.tasks",
    "TaskJob": "asyncq.tasks",
    "Ticket": "asyncq.core.jobs",
    "UniqueConflict": "asyncq.errors",
    "WaitsFor": "asyncq.core.dependencies",
    "deliver_with": "asyncq.worker.context",
    "enqueue_sync": "asyncq.sqlite",
    "group_callback_id": "asyncq.core.groups",
    "open": "asyncq.tasks",
    "shield": "asyncq.worker.cancelling",
}


if not TYPE_CHECKING:  # hidden from mypy, so that a name asyncq does not have is an error there too

    def __getattr__(name: str) -> Any:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'asyncq' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
