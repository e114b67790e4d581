"""Reading the console's forms and query strings into ``core``'s values (``ValueError`` naming the field for what
does not fit), and writing a query back as form fields (a filter carried from the list to its bulk preview)."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

from asyncq.core.operations import AuditQuery
from asyncq.core.search import MAX_IDS, JobQuery, Order, parse_body_match

#: The query fields a job filter has, as the forms name them.
FILTER_FIELDS = ("status", "queue", "task", "priority", "reason", "error_type", "since", "until", "body", "ids")


def job_query(get: Callable[[str], str | None]) -> JobQuery:
    """A ``JobQuery`` from form or query values (``get(name)``: the value or ``None``), checked."""
    priority = get("priority")
    ids = get("ids")
    query = JobQuery(
        status=get("status"),
        queue=get("queue"),
        task=get("task"),
        priority=None if priority is None else _integer(priority, "priority"),
        reason=get("reason"),
        error_type=get("error_type"),
        since_ms=_time(get("since"), "since"),
        until_ms=_time(get("until"), "until"),
        body=None if get("body") is None else parse_body_match(get("body") or ""),
        ids=() if ids is None else tuple(dict.fromkeys(part for part in ids.replace(",", " ").split() if part)),
    )
    if len(query.ids) > MAX_IDS:
        raise ValueError(f"a selection names at most {MAX_IDS} jobs")
    return query.checked()


def filter_fields(query: JobQuery) -> dict[str, str]:
    """``query`` as the form fields ``job_query`` reads back."""
    found: dict[str, str] = {}
    for name in ("status", "queue", "task", "reason", "error_type"):
        if getattr(query, name) is not None:
            found[name] = str(getattr(query, name))
    if query.priority is not None:
        found["priority"] = str(query.priority)
    if query.since_ms is not None:
        found["since"] = time_text(query.since_ms)
    if query.until_ms is not None:
        found["until"] = time_text(query.until_ms)
    if query.body is not None:
        found["body"] = query.body.text
    if query.ids:
        found["ids"] = " ".join(query.ids)
    return found


def order(text: str | None, default: Order = Order.NEWEST) -> Order:
    if text is None:
        return default
    if text not in tuple(Order):
        raise ValueError(f"order must be one of {', '.join(Order)}")
    return Order(text)


def audit_query(get: Callable[[str], str | None], limit: int) -> AuditQuery:
    before = get("before")
    return AuditQuery(
        actor=get("actor"),
        action=get("action"),
        subject=get("subject"),
        text=get("text"),
        before=None if before is None else _integer(before, "before"),
        limit=limit,
    ).checked()


def time_text(ms: int) -> str:
    """Epoch ms as a ``datetime-local`` input's value (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000))


def _time(text: str | None, name: str) -> int | None:
    """A ``datetime-local`` value (UTC: ``YYYY-MM-DDTHH:MM[:SS]``) or epoch milliseconds, as epoch milliseconds."""
    if text is None:
        return None
    if text.isdigit():
        return _integer(text, name)
    for shape in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return calendar.timegm(time.strptime(text, shape)) * 1000
        except ValueError:
            continue
    raise ValueError(f"{name} must be a UTC time like 2024-05-01T12:30 (or epoch milliseconds)")


def whole(text: str, name: str) -> int:
    """A whole number from a query value (``ValueError`` naming ``name`` otherwise)."""
    return _integer(text, name)


def _integer(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {text!r}") from None


def typed_count(text: str | None) -> int:
    """The count the operator typed to confirm a set."""
    if text is None:
        raise ValueError("type the number of jobs (or queues) shown to confirm")
    return _integer(text, "the confirmed count")


def as_values(fields: dict[str, str]) -> list[tuple[str, Any]]:
    return sorted(fields.items())
