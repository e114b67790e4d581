"""What a pool tells its operator as it works: the counters, the observer (which must never raise: if it does, it is
logged and counted, and the pool carries on), and the log of the pool (``asyncq.worker.pool``), routine events
at debug, a problem for an operator at warning, the pool's own failures at error."""

from __future__ import annotations

import logging
from collections import Counter

from asyncq.core.backoff import RetryPolicy
from asyncq.core.failures import ErrorText, classify, error_text
from asyncq.core.jobs import Ticket
from asyncq.core.lifecycle import DEAD, PERMANENT, RETRY, OutcomeName
from asyncq.core.retention import RetentionReport
from asyncq.core.schedules import ScheduleRun
from asyncq.worker.context import job_fields
from asyncq.worker.flight import Finish
from asyncq.worker.observer import NoObserver, PoolCounters, PoolObserver

log = logging.getLogger("asyncq.worker.pool")

#: The events of ``PoolObserver``: an observer must have each as a method.
OBSERVER_EVENTS = tuple(name for name in vars(PoolObserver) if name.startswith("on_"))


def check_observer(observer: object) -> PoolObserver | None:
    """``observer`` if it is ``None`` or has every ``PoolObserver`` method; ``TypeError`` otherwise."""
    if observer is None:
        return None
    missing = [name for name in OBSERVER_EVENTS if not callable(getattr(observer, name, None))]
    if missing:
        raise TypeError(f"observer must be a PoolObserver, but a {type(observer).__name__} has no {', '.join(missing)}")
    checked: PoolObserver = observer  # type: ignore[assignment]  # every method checked above
    return checked


class PoolReport:
    """The counters, the observer and the log of one pool. A pool given no observer skips telling it (twice a
    job: the cost showed in the no-op benchmark): callers on the per-job path test ``observed`` first."""

    def __init__(self, observer: object) -> None:
        checked = check_observer(observer)
        self.counters = PoolCounters()
        self.observer: PoolObserver = checked if checked is not None else NoObserver()
        self.observed = checked is not None

    def observe(self, event: str, *args: object) -> None:
        """Tell the observer, if any; an observer that raises is logged and counted, never propagated."""
        if not self.observed:
            return
        try:
            getattr(self.observer, event)(*args)
        except Exception as error:
            self.counters.internal_errors += 1
            log.error("pool observer failed in %s: %r", event, error, exc_info=error)

    def store_busy(self, error: Exception, what: str) -> None:
        """A store call found another process holding the lock past the busy timeout: nothing changed."""
        self.counters.store_busy += 1
        self.observe("on_store_busy")
        log.warning("store busy (%s): %s", error, what)

    def retention(self, done: RetentionReport) -> None:
        """A retention run removed ``done``: counted, told to an observer that has ``on_retention``, logged."""
        counters = self.counters
        counters.retention_runs += 1
        for state, jobs in done.by_state().items():
            counters.retention_removed[state] = counters.retention_removed.get(state, 0) + jobs
            if jobs and self.observed and callable(getattr(self.observer, "on_retention", None)):
                self.observe("on_retention", state, jobs)
        if done.total:
            log.info("retention removed %d job(s) in %d batch(es)%s", done.total, done.batches,
                     "" if done.complete else ", more left for the next run")  # fmt: skip

    def schedules(self, done: ScheduleRun) -> None:
        """An evaluation of the schedules: its ticks counted (fired, skipped, missed), failures too, each logged."""
        counters = self.counters
        for outcome, ticks in (("fired", len(done.jobs)), ("skipped", done.skipped), ("missed", done.missed)):
            counters.schedule_ticks[outcome] = counters.schedule_ticks.get(outcome, 0) + ticks
        counters.internal_errors += done.failed
        if done.jobs or done.skipped or done.missed:
            log.debug("schedules: %d tick(s) fired, %d skipped, %d missed", len(done.jobs), done.skipped, done.missed)

    def claimed(self, count: int) -> None:
        self.counters.claimed += count
        self.observe("on_claimed", count)

    def lost(self, ticket: Ticket) -> None:
        """A job's lease was lost: its result is never written."""
        self.counters.leases_lost += 1
        self.observe("on_lease_lost")
        log.warning(
            "lease lost for job %s token %d: result discarded", ticket.id, ticket.token, extra=_fields(ticket, "lost")
        )

    def finishes(self, results: list[Finish], statuses: list[str | None], debug: bool) -> None:
        """Count (and log, and tell the observer of) each finish of a commit. When all landed and none is dead,
        with no observer and no debug log, only the counts change: counted per status, not per job."""
        if debug or self.observed or None in statuses or DEAD in statuses:
            for (ticket, outcome, *_rest), status in zip(results, statuses, strict=True):
                self._log_finish(ticket, status, debug)
                self.observe("on_finished", outcome, status)
            return
        finished = self.counters.finished
        for status, count in Counter(statuses).items():
            assert status is not None  # checked above
            finished[status] = finished.get(status, 0) + count

    def _log_finish(self, ticket: Ticket, status: str | None, debug: bool) -> None:
        self.counters.count_status(status)
        if status is None:
            log.warning(
                "stale finish rejected for job %s token %d", ticket.id, ticket.token, extra=_fields(ticket, "stale")
            )
        elif status == DEAD:  # a problem for an operator: it waits for a redrive
            log.warning(
                "job %s token %d -> dead after attempt %d", ticket.id, ticket.token, ticket.attempt,
                extra=_fields(ticket, status),
            )  # fmt: skip
        elif debug:
            log.debug("job %s token %d -> %s", ticket.id, ticket.token, status)

    def failed(self, ticket: Ticket, error: Exception, retry: RetryPolicy) -> tuple[OutcomeName, int, ErrorText]:
        """A handler's failure as an outcome, a delay and the error kept with the job. A policy that fails here
        (a jitter out of range) must not lose the job: its base delay is used, and the failure is logged."""
        try:
            outcome, delay_ms = classify(error, ticket.attempt, retry)
        except Exception as policy_error:
            self.counters.internal_errors += 1
            log.error(
                "retry policy failed for job %s: %r", ticket.id, policy_error, exc_info=policy_error,
                extra=_fields(ticket, RETRY),
            )  # fmt: skip
            outcome, delay_ms = RETRY, retry.base_ms
        if outcome == PERMANENT:
            log.warning("job %s failed permanently: %r", ticket.id, error, extra=_fields(ticket, outcome))
        else:
            self.counters.handler_errors += 1
            log.warning(
                "job %s attempt %d failed: %r", ticket.id, ticket.attempt, error, extra=_fields(ticket, outcome)
            )
        return outcome, delay_ms, error_text(error)

    def machinery_failed(self, ticket: Ticket, error: Exception) -> None:
        """Not the handler but the pool failed around a job: loudly."""
        self.counters.internal_errors += 1
        log.error("internal error around job %s: %r", ticket.id, error, exc_info=error, extra=_fields(ticket, RETRY))


def _fields(ticket: Ticket, outcome: str) -> dict[str, object]:
    return job_fields(ticket.id, ticket.queue, ticket.attempt, outcome)
