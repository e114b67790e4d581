"""How a worker pool runs, as one frozen value checked once: ``Pool`` takes it (or its fields as keywords), and
``asyncq work``/``asyncq worker`` build it from their flags, so each default and each range is written here only.

``PoolOptions`` is the same fields as keywords (a ``TypedDict`` for ``**options``), so that ``mypy`` refuses a
misspelt one in ``Pool(queue, …)``, ``App.pool`` and ``App.run_worker``; a test keeps both lists equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TypedDict

from asyncq.core.backoff import RetryPolicy
from asyncq.core.jobs import DEFAULT_LEASE_MS, MAX_BATCH
from asyncq.core.limits import (
    MAX_CONCURRENCY,
    MAX_JOB_TIMEOUT_SECONDS,
    MAX_LEASE_MS,
    MAX_POLL_SECONDS,
    MIN_LEASE_MS,
    MIN_POLL_SECONDS,
)
from asyncq.core.values import (
    Duration,
    check_duration,
    check_flag,
    check_identifier,
    check_int,
    check_seconds,
    duration_ms,
)
from asyncq.worker.results import DEFAULT_RESULT_TTL, MAX_RESULT_TTL

# The results a group commit waits for from 16 slots up (unless a slot is starving or the oldest result has
# lingered): a commit's fsync, its hop to the connection's thread and its statements' fixed cost are shared by
# this many jobs. At 16 tasks a commit per round of the slots (17 jobs) made the pool reach 0.72x a bare aiohttp
# loop; one per 128 jobs 0.84x (docs/benchmarks.md, "Commits of 128 jobs"). Above 128 slots a round is more.
COMMIT_JOBS = 128
# A small pool waits for a few rounds of its slots, not for 128 results: the buffer holds a batch ahead, and
# every buffered job is a lease no other worker process can take (a 1-slot pool would hold 129 of them).
COMMIT_ROUNDS = 8
LINGER_MAX = 0.06  # the default linger: long enough for 128 results at ~2,000 jobs/s
DEFAULT_CONCURRENCY = 16
DEFAULT_RETENTION_EVERY = 60.0  # seconds between a pool's retention runs (each a few bounded transactions)
MAX_RETENTION_EVERY_MS = 86_400_000


@dataclass(frozen=True)
class PoolSettings:
    """A pool's settings. ``lease`` (default 30 s), ``job_timeout`` (default none), ``poll_min``/``poll_max`` (an
        idle pool's poll interval) and ``linger`` (how long a result waits to share a commit) are seconds; ``owner``
        names the pool in leases (default: a random name per pool); ``prefetch`` is how many jobs are claimed ahead of
        the free slots; a handler's return value (not ``None``) is kept with its job ``result_ttl`` seconds (default a
    week: ``asyncq.worker.results``); ``cancel_grace`` is how long a handler whose job's cancel was requested
    (``Queue.cancel``) may go on before it is cancelled (default 0: at once; ``asyncq.shield`` protects a critical
    section); ``retention_every`` is how often (seconds of the queue's clock) the pool removes the finished jobs past
    their queue's retention (``Queue.apply_retention``; default a minute, ``None``: never, another process does it);
    ``schedules``: whether the pool evaluates the store's schedules beside its batcher (``asyncq.worker.schedules``;
    ``False``: never, other processes do; an app's schedules are still declared when it starts).
    A bad value is ``TypeError``/``ValueError`` when the settings are built.

        The fields after ``linger`` are resolved from the others: what the pool runs with."""

    concurrency: int = DEFAULT_CONCURRENCY
    owner: str | None = None
    lease: Duration = DEFAULT_LEASE_MS / 1000
    job_timeout: Duration | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    poll_min: float = 0.05
    poll_max: float = 1.0
    prefetch: int | None = None
    linger: float | None = None
    result_ttl: Duration = DEFAULT_RESULT_TTL
    cancel_grace: Duration = 0.0
    retention_every: Duration | None = DEFAULT_RETENTION_EVERY
    schedules: bool = True
    #: ``lease`` in milliseconds, as the store takes it.
    lease_ms: int = field(init=False)
    #: How many results a commit waits for (fewer when a slot starves or the oldest result has lingered).
    batch: int = field(init=False)
    #: ``prefetch``, or by default a batch and a round of the slots: when a batch's results are in, a round is
    #: still buffered to run while the commit is written.
    claim_ahead: int = field(init=False)
    #: ``linger``, or by default 60 ms, at most a tenth of the lease (a waiting result's lease is not renewed).
    linger_seconds: float = field(init=False)
    #: ``job_timeout`` in seconds, or ``None``.
    job_timeout_seconds: float | None = field(init=False)
    #: ``result_ttl`` in milliseconds.
    result_keep_ms: int = field(init=False)
    #: ``cancel_grace`` in seconds.
    cancel_grace_seconds: float = field(init=False)
    #: ``retention_every`` in milliseconds, or ``None``.
    retention_every_ms: int | None = field(init=False)

    def __post_init__(self) -> None:
        concurrency = check_int(self.concurrency, "concurrency", 1, MAX_CONCURRENCY)
        if self.owner is not None:
            check_identifier(self.owner, "owner")
        lease_ms = duration_ms(self.lease, "lease", DEFAULT_LEASE_MS, MIN_LEASE_MS, MAX_LEASE_MS)
        timeout = self.job_timeout
        if timeout is not None:
            timeout = check_duration(timeout, "job_timeout", MIN_POLL_SECONDS, MAX_JOB_TIMEOUT_SECONDS)
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(self.retry).__name__}")
        poll_min = check_duration(self.poll_min, "poll_min", MIN_POLL_SECONDS, MAX_POLL_SECONDS)
        check_duration(self.poll_max, "poll_max", poll_min, MAX_POLL_SECONDS)
        batch = max(concurrency, min(COMMIT_JOBS, COMMIT_ROUNDS * concurrency))
        ahead = min(batch + concurrency, MAX_BATCH) if self.prefetch is None else self.prefetch
        linger = min(LINGER_MAX, lease_ms / 10_000) if self.linger is None else self.linger
        linger = check_seconds(linger, "linger")
        if linger * 2000 > lease_ms:  # a longer wait lets a result's lease run out before its commit
            raise ValueError(f"linger must be at most half the lease ({lease_ms / 2000} s), got {self.linger!r}")
        resolved = {
            "lease_ms": lease_ms,
            "batch": batch,
            "claim_ahead": check_int(ahead, "prefetch", 0, MAX_BATCH),
            "linger_seconds": linger,
            "job_timeout_seconds": timeout,
            "result_keep_ms": round(check_duration(self.result_ttl, "result_ttl", 0.0, MAX_RESULT_TTL) * 1000),
            "cancel_grace_seconds": check_duration(self.cancel_grace, "cancel_grace", 0.0, MAX_JOB_TIMEOUT_SECONDS),
            "retention_every_ms": None
            if self.retention_every is None
            else duration_ms(self.retention_every, "retention_every", 0, 0, MAX_RETENTION_EVERY_MS),
        }
        check_flag(self.schedules, "schedules")
        for name, value in resolved.items():
            object.__setattr__(self, name, value)


class PoolOptions(TypedDict, total=False):
    """``PoolSettings``' fields as keywords (``Pool(queue, **options)``); each is documented there."""

    concurrency: int
    owner: str | None
    lease: Duration
    job_timeout: Duration | None
    retry: RetryPolicy
    poll_min: float
    poll_max: float
    prefetch: int | None
    linger: float | None
    result_ttl: Duration
    cancel_grace: Duration
    retention_every: Duration | None
    schedules: bool


def settings_fields() -> list[str]:
    """The names ``PoolSettings`` takes (the resolved fields excluded): ``PoolOptions``' keys, in order."""
    return [item.name for item in fields(PoolSettings) if item.init]
