"""Retention's calls on a ``Queue`` (``docs/flow-control.md``, "Retention"): the rules, per task in a queue, per
queue, and one default for every queue, each stored and audited like a pause; and the run that removes what is past
them in bounded steps (``core.retention`` decides what; the store seeks and removes)."""

from __future__ import annotations

import logging

from asyncq.core.flow import QueueAuditEntry
from asyncq.core.jobs import MAX_BATCH
from asyncq.core.retention import (
    MAX_RETENTION_MS,
    RETENTION_BATCH,
    RETENTION_MAX_BATCHES,
    Expiry,
    Removed,
    RetentionReport,
    RetentionRule,
    Windows,
    expiries,
    queues_to_scan,
    retention_text,
    scope_text,
)
from asyncq.core.values import Duration, check_identifier, check_int, check_note, check_task_name, duration_ms
from asyncq.queue.operators import actor_of
from asyncq.store.facade import StoreFacade
from asyncq.store.port.queue import QueueStore

log = logging.getLogger("asyncq.queue")


class RetentionCalls(StoreFacade[QueueStore]):
    """How long finished jobs are kept, and the run that removes the rest (``Queue`` has them)."""

    async def set_retention(
        self,
        queue: str,
        *,
        task: str | None = None,
        done: Duration | None = None,
        dead: Duration | None = None,
        cancelled: Duration | None = None,
        note: str | None = None,
        by: str | None = None,
    ) -> QueueAuditEntry:
        """How long ``queue`` keeps its finished jobs (only ``task``'s jobs there, if named), per state: ``done``,
        ``cancelled`` (dead, reason ``cancelled``) and ``dead`` (every other reason), each seconds (or a
        ``timedelta``) from the job's end, or ``None`` to keep them for ever (the default of each: a call sets all
        three). A task's rule replaces its queue's for its jobs, and a queue's replaces the default
        (``set_default_retention``). Stored and audited like a pause; the pools (and ``apply_retention``) remove
        what is past its window."""
        check_identifier(queue, "queue")
        if task is not None:
            check_task_name(task)
        return await self._set(queue, task, _windows(done, dead, cancelled), note, by)

    async def set_default_retention(
        self,
        *,
        done: Duration | None = None,
        dead: Duration | None = None,
        cancelled: Duration | None = None,
        note: str | None = None,
        by: str | None = None,
    ) -> QueueAuditEntry:
        """The retention of every queue that has no rule of its own (``set_retention``'s windows); audited under
        queue ``"*"``."""
        return await self._set(None, None, _windows(done, dead, cancelled), note, by)

    async def clear_retention(
        self, queue: str, *, task: str | None = None, note: str | None = None, by: str | None = None
    ) -> QueueAuditEntry:
        """Remove ``queue``'s own rule (``task``'s in ``queue``, if named): its jobs follow the wider rule again (the
        queue's, the default, or none: kept for ever). Audited (``retention_clear``); ``ValueError`` if there is
        no such rule (nothing written)."""
        check_identifier(queue, "queue")
        if task is not None:
            check_task_name(task)
        return await self._set(queue, task, None, note, by)

    async def clear_default_retention(self, *, note: str | None = None, by: str | None = None) -> QueueAuditEntry:
        """Remove the default rule: queues without their own keep everything again (``clear_retention``'s rules)."""
        return await self._set(None, None, None, note, by)

    async def retention_rules(self) -> list[RetentionRule]:
        """Every stored rule (``RetentionRule``: ``queue`` ``None`` is the default, ``task`` ``None`` the whole
        queue): the default first, then by queue, a queue's own before its tasks'."""
        return await self.store.retention_rules()

    async def _set(
        self, queue: str | None, task: str | None, windows: Windows | None, note: str | None, by: str | None
    ) -> QueueAuditEntry:
        what = "cleared" if windows is None else retention_text(windows)
        checked = check_note(note) if note is not None else f"retention {what}"
        entry = await self.store.set_retention(queue, task, windows, self.now(), checked, actor_of(by))
        log.info("retention of %s set by %s: %s", scope_text(queue, task), entry.actor, what)
        return entry

    async def apply_retention(
        self, *, max_batches: int = RETENTION_MAX_BATCHES, batch: int = RETENTION_BATCH
    ) -> RetentionReport:
        """Remove the finished jobs past the retention that applies to them (``core.retention.rule_for``), in steps
        of at most ``batch`` jobs of one queue, task and state, each its own transaction, at most ``max_batches``
        steps (``complete`` is ``False`` if expired jobs were left for the next run). What it removed."""
        check_int(max_batches, "max_batches", 1, 1_000_000)
        check_int(batch, "batch", 1, MAX_BATCH)
        now = self.now()
        rules = await self.store.retention_rules()
        queues = queues_to_scan(rules)
        groups = await self.store.ended_groups(queues) if rules else []
        removed: list[Removed] = []
        batches = 0
        for expiry in expiries(rules, groups, now):
            jobs, count = 0, batch
            while count == batch:
                if batches == max_batches:
                    return _retention_report(removed, expiry, jobs, batches, complete=False)
                count = await self.store.remove_expired(
                    expiry.queue, expiry.task, expiry.state, expiry.cutoff_ms, now, batch
                )
                jobs, batches = jobs + count, batches + 1
            if jobs:
                removed.append(Removed(expiry.queue, expiry.state, jobs, expiry.task))
        return RetentionReport(tuple(removed), batches, complete=True)


def _windows(done: Duration | None, dead: Duration | None, cancelled: Duration | None) -> Windows:
    return Windows(_window(done, "done"), _window(dead, "dead"), _window(cancelled, "cancelled"))


def _window(value: Duration | None, name: str) -> int | None:
    return None if value is None else duration_ms(value, name, 0, 0, MAX_RETENTION_MS)


def _retention_report(
    removed: list[Removed], expiry: Expiry, jobs: int, batches: int, *, complete: bool
) -> RetentionReport:
    """The report of a run that stopped in the middle of ``expiry`` (``jobs`` removed from it so far)."""
    last = [Removed(expiry.queue, expiry.state, jobs, expiry.task)] if jobs else []
    return RetentionReport((*removed, *last), batches, complete)
