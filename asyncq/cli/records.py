"""The facade's values as the JSON objects the ``asyncq`` command prints (``--json``) and renders as text: a job
(its columns, ``redrives``, and its body or errors where the command shows them), an audit row, an error."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from asyncq.core.flow import QueueAuditEntry
from asyncq.core.flow_limits import LimitUsage
from asyncq.core.jobs import AttemptError, AuditEntry, Job
from asyncq.core.retention import RETENTION_STATES, RetentionRule

JOB_FIELDS = (
    "seq", "id", "queue", "status", "attempts", "max_attempts", "token", "available_at", "deadline", "owner",
    "lease_until", "reason", "redrives", "priority", "cancel_requested_at", "unique_key", "task", "group", "waits",
    "limit_key",
)  # fmt: skip


def job_record(job: Job, *, body: bool = False) -> dict[str, Any]:
    """A job's columns, its redrive count and its cancel request's time; its body too if ``body``."""
    record = {name: getattr(job, name) for name in JOB_FIELDS}
    if body:
        record["body"] = job.body
    return record


def error_record(error: AttemptError) -> dict[str, Any]:
    """One failed attempt's error: ``attempt``, ``at_ms``, ``type``, ``message``, ``traceback``."""
    return asdict(error)


def queue_audit_record(entry: QueueAuditEntry) -> dict[str, Any]:
    """One move on a queue: ``seq``, ``queue`` (``*``: the default retention's), ``action``, ``at_ms``, ``actor``,
    ``note``, and the values the move set (``max_wait_ms``, ``retain_*_ms`` and the retention rule's ``task``,
    ``limit_*``)."""
    return asdict(entry)


def limit_record(usage: LimitUsage) -> dict[str, Any]:
    """One limited queue now: ``queue``, its limits (``concurrency``, ``per_key_concurrency``, ``rate``, ``per_ms``,
    ``burst``; ``null``: none), ``slots_used``, ``keys_busy``, ``keys_full`` and ``rate_next_ms``."""
    return {"queue": usage.queue, **usage.limits._asdict(), "slots_used": usage.slots_used} | {
        "keys_busy": usage.keys_busy, "keys_full": usage.keys_full, "rate_next_ms": usage.rate_next_ms,
    }  # fmt: skip


def retention_rule_record(rule: RetentionRule) -> dict[str, Any]:
    """One retention rule: ``queue`` (``None``: every queue, the default), ``task`` (``None``: the whole queue) and
    ``retain_done_ms``, ``retain_cancelled_ms``, ``retain_dead_ms`` (``None``: for ever)."""
    windows = {f"retain_{state}_ms": rule.windows.of(state) for state in RETENTION_STATES}
    return {"queue": rule.queue, "task": rule.task, **windows}


def audit_record(entry: AuditEntry) -> dict[str, Any]:
    """One audit row: ``seq``, ``id``, ``action``, ``token``, ``at_ms``, ``note``, ``reason``."""
    return asdict(entry)


def one_line_error(error: dict[str, Any] | None, width: int = 80) -> str:
    """``Type: message`` on one line, cut to ``width`` characters (``-`` for none)."""
    if error is None:
        return "-"
    text = " ".join(f"{error['type']}: {error['message']}".split())
    return text if len(text) <= width else text[: width - 1] + "…"
