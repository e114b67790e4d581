"""The operator's calls on a ``Queue``: redrive, cancel, pause and resume, ``max_wait``, limits, and the stored
settings and moves of queues (each move audited in the store); retention's are ``asyncq.queue.retention``'s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from asyncq.core.flow import QueueAuditEntry, QueueSettings
from asyncq.core.flow_limits import LimitUsage, check_limits, limits_text
from asyncq.core.jobs import (
    DEFAULT_TTL_MS,
    MAX_BATCH,
    MAX_TTL_MS,
    AuditEntry,
    CancelOutcome,
)
from asyncq.core.lifecycle import CancelState
from asyncq.core.limits import MAX_WAIT_MS
from asyncq.core.retention import EVERY_QUEUE
from asyncq.core.values import (
    Duration,
    check_identifier,
    check_int,
    check_note,
    duration_ms,
)
from asyncq.store.facade import StoreFacade
from asyncq.store.port.queue import QueueStore

log = logging.getLogger("asyncq.queue")


class OperatorCalls(StoreFacade[QueueStore]):
    """What an operator calls: redrive, cancel, pause and resume, a queue's stored settings (``Queue`` has them)."""

    _cancels: asyncio.Event

    async def redrive(self, job_id: str, note: str, *, ttl: Duration | None = None) -> AuditEntry:
        """Re-arm a dead job with a fresh budget (a deadline ``ttl`` seconds away, default a day); its audit row.
        ``ValueError`` if it is not dead; ``UniqueConflict`` (nothing changed, nothing audited) if another active
        job of its queue holds its unique key now."""
        check_identifier(job_id, "job_id")
        check_note(note)
        ttl_ms = duration_ms(ttl, "ttl", DEFAULT_TTL_MS, 1, MAX_TTL_MS)
        now = self.now()
        entry = await self.store.redrive(job_id, now, now + ttl_ms, note)
        log.info("job %s dead -> pending (redriven: %s)", job_id, note)
        return entry

    async def cancel(self, job_id: str, note: str) -> CancelOutcome:
        """Cancel a job, whatever it is doing; ``.state`` says what happened. ``cancelled``: it was pending (or its
        lease had expired) and is dead now (reason ``cancelled``). ``requested``: a worker holds it; a cancel
        request is stored on its row, and the pool holding it cancels its handler at its next lease renewal (or
        at once, in this process) and finishes it dead (``cancelled``); if its lease expires first, it is not run
        again. ``too_late``: it had ended (done or dead). Audited (``cancel``, ``cancel_request``); ``ValueError``
        if there is no such job."""
        check_identifier(job_id, "job_id")
        check_note(note)
        outcome = await self.store.cancel(job_id, self.now(), note)
        if outcome.state is CancelState.REQUESTED:
            self._cancel_requested()
        log.info("job %s: cancel %s (%s)", job_id, outcome.state, note)
        return outcome

    def _cancel_requested(self) -> None:
        """A cancel in this process stored a request: a pool of this process holding the job looks at once."""
        requested, self._cancels = self._cancels, asyncio.Event()
        requested.set()

    async def wait_for_cancel_request(self, timeout: float) -> bool:
        """Wait until a cancel in this process asks a running job to stop (``True``), or ``timeout`` seconds
        (``False``; a request from another process is read by the holder's next lease renewal)."""
        requested = self._cancels
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await requested.wait()
        return requested.is_set()

    async def pause(self, queue: str, *, note: str, by: str | None = None) -> QueueAuditEntry:
        """Stop every process on every host from claiming ``queue``'s jobs, from the first claim that begins after
        this returns (jobs in flight finish); stored, so it lasts until ``resume``, across restarts. ``by`` names
        who paused it (default this process: ``pid N on HOST``); its audit row. ``ValueError`` if already paused."""
        return await self._set_paused(queue, True, note, by)

    async def resume(self, queue: str, *, note: str, by: str | None = None) -> QueueAuditEntry:
        """Let ``queue``'s jobs be claimed again; its audit row. ``ValueError`` if it is not paused."""
        return await self._set_paused(queue, False, note, by)

    async def _set_paused(self, queue: str, paused: bool, note: str, by: str | None) -> QueueAuditEntry:
        check_identifier(queue, "queue")
        check_note(note)
        actor = actor_of(by)
        entry = await self.store.set_paused(queue, paused, self.now(), note, actor)
        log.info("queue %s %s by %s: %s", queue, "paused" if paused else "resumed", actor, note)
        return entry

    async def set_max_wait(
        self, queue: str, max_wait: Duration | None, *, note: str | None = None, by: str | None = None
    ) -> QueueAuditEntry:
        """Bound a low priority's wait on ``queue``: a job ready longer than ``max_wait`` seconds (or a
        ``timedelta``) is claimed before fresher higher-priority jobs; ``None`` clears it (strict priorities).
        Stored and audited like a pause."""
        check_identifier(queue, "queue")
        max_wait_ms = None if max_wait is None else duration_ms(max_wait, "max_wait", 0, 1, MAX_WAIT_MS)
        checked = (
            check_note(note) if note is not None else f"max_wait {'none' if max_wait_ms is None else max_wait_ms} ms"
        )
        return await self.store.set_max_wait(queue, max_wait_ms, self.now(), checked, actor_of(by))

    async def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        per_key_concurrency: int | None = None,
        rate: int | None = None,
        per: Duration | None = None,
        burst: int | None = None,
        note: str | None = None,
        by: str | None = None,
    ) -> QueueAuditEntry:
        """Limit ``queue`` across every process and host (docs/flow-control.md, "Limits"): ``concurrency`` jobs at
        once (its live leases), ``per_key_concurrency`` at once per ``limit_key`` (``enqueue(…, limit_key=…)``), and
        ``rate`` jobs started per ``per`` seconds (default 1; or a ``timedelta``), up to ``burst`` at once (default 1:
        never more than ``rate`` in any window of ``per``). Each ``None`` is no such limit (the default of each: a call
        sets them all, ``set_limits(queue)`` clears them). Counted in the claim's transaction from the rows (an expired
        lease frees its slot by itself); a job a limit holds is not claimed, spends no attempt and keeps its place.
        Stored and audited like a pause; a bad value is ``TypeError``/``ValueError`` before any statement."""
        check_identifier(queue, "queue")
        limits = check_limits(concurrency, per_key_concurrency, rate, per, burst)
        checked = check_note(note) if note is not None else f"limits {limits_text(limits)}"
        entry = await self.store.set_limits(queue, limits, self.now(), checked, actor_of(by))
        log.info("queue %s limits set by %s: %s", queue, entry.actor, limits_text(limits))
        return entry

    async def limits(self) -> list[LimitUsage]:
        """Every queue with limits, by name: its limits and what they hold now (``LimitUsage``: the live leases, the
        keys holding one and those at their limit, when the rate lets the next job start)."""
        return await self.store.limit_usage(self.now())

    async def queue_settings(self) -> list[QueueSettings]:
        """Every queue's stored flow-control settings (paused: since when, by whom, why; ``max_wait``; retention),
        by name."""
        return await self.store.queue_settings()

    async def paused_queues(self) -> list[QueueSettings]:
        """The settings of the queues paused now."""
        return [settings for settings in await self.queue_settings() if settings.paused]

    async def queue_audit(self, queue: str | None = None, *, limit: int = 100) -> list[QueueAuditEntry]:
        """The newest moves on queues (pause, resume, max_wait, retention, limits), of ``queue`` only if named
        (``"*"``: the default retention's), newest first."""
        if queue is not None and queue != EVERY_QUEUE:
            check_identifier(queue, "queue")
        return await self.store.queue_audit(queue, check_int(limit, "limit", 1, MAX_BATCH))


def actor_of(by: str | None) -> str:
    """Who makes an operator's move: ``by`` (a note's text rules), or this process."""
    return f"pid {os.getpid()} on {socket.gethostname()}" if by is None else check_note(by, "by")
