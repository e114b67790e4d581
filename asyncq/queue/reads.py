"""Reading a ``Queue``'s jobs, audit and stats, and its store-wide chores: prune, backup, describe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from asyncq.core.jobs import (
    MAX_BATCH,
    MAX_TTL_MS,
    AuditEntry,
    Job,
)
from asyncq.core.lifecycle import STATUSES
from asyncq.core.stats import Stats
from asyncq.core.values import (
    Duration,
    check_choice,
    check_flag,
    check_identifier,
    check_int,
    duration_ms,
)
from asyncq.store.facade import StoreFacade
from asyncq.store.port.queue import JobFilter, QueueStore
from asyncq.store.port.reports import BackupReport, PruneReport, StoreDescription


class Prunable(NamedTuple):
    """What ``prune`` would delete now: counts by status, and the first ids."""

    by_status: dict[str, int]
    ids: list[str]


class ReadCalls(StoreFacade[QueueStore]):
    """What reads a queue's jobs and records, and the store-wide chores (prune, backup) (``Queue`` has them)."""

    async def get(self, job_id: str) -> Job | None:
        """One job's stored record, or ``None``."""
        return await self.store.get(check_identifier(job_id, "job_id"))

    async def list_jobs(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        after: int = 0,
        limit: int = 100,
        newest: bool = False,
        body: bool = True,
        errors: bool = False,
    ) -> list[Job]:
        """Jobs filtered by status, queue and reason (``None``: any), oldest first after ``seq = after``, or
        ``newest`` first; at most ``limit`` (1-1001). ``errors`` fills each job's newest failed attempt's error."""
        if status is not None:
            check_choice(status, "status", STATUSES)
        if queue is not None:
            check_identifier(queue, "queue")
        if reason is not None:
            check_identifier(reason, "reason")
        check_int(after, "after", 0, 2**63 - 1)
        check_int(limit, "limit", 1, MAX_BATCH + 1)
        flags = check_flag(newest, "newest"), check_flag(body, "body"), check_flag(errors, "errors")
        which = JobFilter(status, queue, reason, after, limit, *flags)
        return await self.store.list_jobs(which)

    async def history(self, job_id: str) -> list[AuditEntry]:
        """One job's audit rows (redrives, cancels), oldest first."""
        return await self.store.history(check_identifier(job_id, "job_id"))

    async def audit_log(self, limit: int = 100) -> list[AuditEntry]:
        """The newest audit rows of the whole queue, newest first."""
        return await self.store.audit_log(check_int(limit, "limit", 1, MAX_BATCH))

    async def stats(self) -> Stats:
        """Counts by status and dead reason, oldest pending age, leases by owner."""
        return await self.store.stats(self.now())

    async def prunable(
        self, older_than: Duration, statuses: Sequence[str] = ("done", "dead"), limit: int = -1
    ) -> Prunable:
        """What ``prune`` would delete now: counts by status, and the first ``limit`` ids (``-1``: all)."""
        check_int(limit, "limit", -1, 2**31)
        return Prunable(*await self.store.prunable(self._cutoff(older_than), _prune_statuses(statuses), limit))

    async def prune(
        self, older_than: Duration, statuses: Sequence[str] = ("done", "dead"), *, vacuum: bool = False
    ) -> PruneReport:
        """Delete the done/dead jobs that ended longer than ``older_than`` seconds ago (audit rows stay), with their
        tasks' results, and every result kept past its task's retention (its job stays until its own prune)."""
        cutoff = self._cutoff(older_than)
        checked = _prune_statuses(statuses)
        return await self.store.prune(cutoff, checked, vacuum=check_flag(vacuum, "vacuum"), now_ms=self.now())

    async def backup(self, target: str, *, force: bool = False) -> BackupReport:
        """An online, checked copy of the store at ``target`` (stores with ``capabilities.backup``)."""
        return await self.store.backup(target, force=check_flag(force, "force"))  # others say what to use instead

    async def describe(self) -> StoreDescription:
        """What the store is: its kind, schema version and settings."""
        return await self.store.describe()

    def _cutoff(self, older_than: Duration) -> int:
        return self.now() - duration_ms(older_than, "older_than", 0, 0, MAX_TTL_MS * 100)


def _prune_statuses(statuses: Sequence[str]) -> tuple[str, ...]:
    checked = tuple(check_choice(status, "statuses", ("done", "dead")) for status in statuses)
    if not checked:
        raise ValueError("statuses must name done, dead or both")
    return checked
