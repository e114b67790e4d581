"""The public API is pinned: adding or removing a name is a decision, not an accident."""

from __future__ import annotations

import pytest

import asyncq

pytestmark = pytest.mark.timeout(30)

EXPECTED = [
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


def test_all_is_pinned_and_sorted() -> None:
    assert asyncq.__all__ == EXPECTED
    assert asyncq.__all__ == sorted(asyncq.__all__)


@pytest.mark.parametrize("name", EXPECTED)
def test_every_name_resolves(name: str) -> None:
    assert getattr(asyncq, name) is not None
    assert name in dir(asyncq)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _ = asyncq.NoSuchThing  # type: ignore[attr-defined]
