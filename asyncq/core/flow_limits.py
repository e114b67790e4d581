"""A queue's concurrency and rate limits (no I/O here): the stored values, what a claim may take under them, and
the rate's stored state (``docs/flow-control.md``, "Limits").

- **Concurrency** is the count of live leases: leased rows of the queue whose ``lease_until`` is still ahead of the
  claim's ``now`` (a lease that expired frees its slot by itself: a worker killed mid-job leaks nothing). The queue's
  limit bounds every live lease of the queue; the per-key limit bounds the live leases of each ``limit_key`` (jobs
  without a key are bound by the queue's limits only). Nothing counts beside the rows: the claim counts them.
- **Rate** is GCRA (the generic cell rate algorithm): the queue's settings row keeps a theoretical arrival time
  (``rate_tat_us``, microseconds), advanced by the claim that takes jobs, in its transaction. A claim at ``now``
  may take ``k`` jobs while ``now >= tat + (k - 1) * interval - tolerance``; ``interval`` is ``per / rate`` rounded
  up to a microsecond, ``tolerance`` is ``(burst - 1) * interval``. So in any span of ``t`` ms at most
  ``burst + t / interval`` jobs start: with the default ``burst`` of 1, at most ``rate`` in any window of ``per``.

The claim takes ``allowance``'s count at most (``core.claim_plan.limited_take``); the per-key limit is applied per row
by the claim statements: a window of the queue's claim order (``claim_window``) leaves out the jobs of keys at their
limit (they keep their place and priority), and when it comes back short (``by_keys``) each key's best jobs are found
by one seek a key, so a full key's backlog is never walked.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import NamedTuple

from asyncq.core.limits import (
    DEFAULT_RATE_PER_MS,
    MAX_LIMIT_SLOTS,
    MAX_RATE,
    MAX_RATE_PER_MS,
    MIN_RATE_PER_MS,
)
from asyncq.core.values import duration_ms

#: At most this many jobs a claim takes when no count bounds it (only a per-key limit): ``core.jobs.MAX_BATCH``.
UNBOUNDED = 1000


class Limits(NamedTuple):
    """A queue's limits as stored (``None``: no such limit): ``concurrency`` (live leases of the queue),
    ``per_key_concurrency`` (live leases of one ``limit_key``), ``rate`` jobs started per ``per_ms``, with up to
    ``burst`` at once (``per_ms`` and ``burst`` are set exactly when ``rate`` is)."""

    concurrency: int | None = None
    per_key_concurrency: int | None = None
    rate: int | None = None
    per_ms: int | None = None
    burst: int | None = None

    @property
    def limited(self) -> bool:
        """Whether any limit is set: the claim then counts (and, on a server, serialises) this queue's claims."""
        return self.concurrency is not None or self.per_key_concurrency is not None or self.rate is not None

    @property
    def interval_us(self) -> int | None:
        """The rate's spacing in microseconds (``per / rate``, rounded up: never faster than the rate)."""
        if self.rate is None or self.per_ms is None:
            return None
        return -(-self.per_ms * 1000 // self.rate)

    @property
    def tolerance_us(self) -> int:
        interval = self.interval_us
        return 0 if interval is None or self.burst is None else (self.burst - 1) * interval


#: No limit at all (a queue never set, or cleared).
UNLIMITED = Limits()


def check_slots(value: object, name: str) -> int | None:
    """A concurrency limit: ``None`` (none) or an exact ``int`` (``TypeError`` otherwise; a ``bool`` is not one) from 1
    to ``MAX_LIMIT_SLOTS`` (``ValueError`` otherwise: a limit of 0 is a pause, ``Queue.pause``)."""
    if value is None:
        return None
    if type(value) is not int:
        raise TypeError(f"{name} must be an int or None, not {type(value).__name__}")
    if not 1 <= value <= MAX_LIMIT_SLOTS:
        raise ValueError(f"{name} must be between 1 and {MAX_LIMIT_SLOTS} (pause a queue to stop it), got {value}")
    return value


def check_limits(
    concurrency: object = None,
    per_key_concurrency: object = None,
    rate: object = None,
    per: object = None,
    burst: object = None,
) -> Limits:
    """The limits ``Queue.set_limits`` stores, checked: ``TypeError`` for a value of the wrong type, ``ValueError``
    for one out of range or a ``per``/``burst`` without a ``rate``. ``per`` is seconds (or a ``timedelta``; default
    1 s), ``burst`` a count (default 1, at most ``rate``)."""
    slots = check_slots(concurrency, "concurrency")
    per_key = check_slots(per_key_concurrency, "per_key_concurrency")
    if rate is None:
        if per is not None or burst is not None:
            raise ValueError("per and burst shape a rate: give rate too (or neither)")
        return Limits(slots, per_key)
    if type(rate) is not int:
        raise TypeError(f"rate must be an int or None, not {type(rate).__name__}")
    if not 1 <= rate <= MAX_RATE:
        raise ValueError(f"rate must be between 1 and {MAX_RATE} jobs per period, got {rate}")
    if per is not None and type(per) not in (int, float, timedelta):
        raise TypeError(f"per must be seconds (an int, a float or a timedelta), not {type(per).__name__}")
    per_ms = duration_ms(per, "per", DEFAULT_RATE_PER_MS, MIN_RATE_PER_MS, MAX_RATE_PER_MS)
    if rate > per_ms * 1000:
        raise ValueError(f"rate {rate} per {per_ms} ms is more than one job a microsecond")
    if burst is not None and type(burst) is not int:
        raise TypeError(f"burst must be an int or None, not {type(burst).__name__}")
    if burst is not None and not 1 <= burst <= rate:
        raise ValueError(f"burst must be between 1 and the rate ({rate}), got {burst}")
    return Limits(slots, per_key, rate, per_ms, 1 if burst is None else burst)


def limits_text(limits: Limits) -> str:
    """One line naming every limit in force (``none`` for none), for notes, logs and the CLI."""
    parts = []
    if limits.concurrency is not None:
        parts.append(f"concurrency {limits.concurrency}")
    if limits.per_key_concurrency is not None:
        parts.append(f"per key {limits.per_key_concurrency}")
    if limits.rate is not None and limits.per_ms is not None:
        parts.append(f"rate {limits.rate} per {limits.per_ms / 1000:g} s" + _burst(limits.burst))
    return ", ".join(parts) or "none"


def _burst(burst: int | None) -> str:
    return "" if burst in (None, 1) else f" (burst {burst})"


class Hold(NamedTuple):
    """A queue a claim could take nothing from because of its limits: ``until_ms`` is the earliest time it may
    (the next job the rate allows; for slots, the first live lease to expire: a finish may free one sooner), and
    ``by_rate`` whether only time frees it (a finish does not)."""

    queue: str
    until_ms: int
    by_rate: bool


class LimitState(NamedTuple):
    """What a limited claim reads first, in its transaction: the queue's ``limits``, its rate state ``tat_us``
    (``None``: no job started under the rate yet), whether it is ``paused``, and its ``live`` leases now with the
    first of them to expire (``first_expiry``, ``None`` without one)."""

    limits: Limits
    tat_us: int | None
    paused: bool
    live: int
    first_expiry: int | None


class Allowance(NamedTuple):
    """How many jobs a claim may take now (``jobs``), and when it may take none, what holds the queue (``hold``)."""

    jobs: int
    hold: Hold | None


def rate_room(limits: Limits, tat_us: int | None, now_ms: int) -> tuple[int, int]:
    """How many jobs the rate lets start at ``now_ms`` (``UNBOUNDED`` without a rate), and when it lets the next one
    (ms; ``now_ms`` while there is room)."""
    interval = limits.interval_us
    if interval is None:
        return UNBOUNDED, now_ms
    now_us = now_ms * 1000
    tat = now_us if tat_us is None else max(tat_us, now_us)
    earliest = tat - limits.tolerance_us
    if now_us < earliest:
        return 0, -(-earliest // 1000)
    return min((now_us - earliest) // interval + 1, UNBOUNDED), now_ms


def allowance(queue: str, state: LimitState, now_ms: int) -> Allowance:
    """What a claim of ``queue`` may take at ``now_ms`` under ``state``: the room the queue's slots and its rate leave
    (the per-key limit is applied by the claim statement, row by row)."""
    limits = state.limits
    slots = UNBOUNDED if limits.concurrency is None else max(0, limits.concurrency - state.live)
    room, due_ms = rate_room(limits, state.tat_us, now_ms)
    if room == 0:
        return Allowance(0, Hold(queue, due_ms, True))
    if slots == 0:
        assert state.first_expiry is not None  # a full queue has live leases
        return Allowance(0, Hold(queue, state.first_expiry, False))
    return Allowance(min(slots, room), None)


def rate_after(limits: Limits, tat_us: int | None, now_ms: int, started: int) -> int | None:
    """The rate state once ``started`` jobs started at ``now_ms`` (``None`` without a rate)."""
    interval = limits.interval_us
    if interval is None:
        return None
    now_us = now_ms * 1000
    return (now_us if tat_us is None else max(tat_us, now_us)) + started * interval


def rate_state_kept(limits: Limits, tat_us: int | None, now_ms: int) -> int | None:
    """The rate state ``set_limits`` keeps: none without a rate; else the stored one, brought no further ahead than
    one job started now would put it under the new limits (a slower rate set before holds the queue no longer than
    the new one would). Setting the same limits again keeps it as it is."""
    interval = limits.interval_us
    if interval is None or tat_us is None:
        return None
    return min(tat_us, now_ms * 1000 + limits.tolerance_us + interval)


def per_seconds(limits: Limits) -> float | None:
    """The rate's period in seconds (``None`` without a rate)."""
    return None if limits.per_ms is None else limits.per_ms / 1000


def rate_per_second(limits: Limits) -> float | None:
    """The rate as jobs per second (``None`` without one): what metrics report."""
    if limits.rate is None or limits.per_ms is None:
        return None
    return limits.rate * 1000 / limits.per_ms


class LimitUsage(NamedTuple):
    """One limited queue now, for operators: its ``limits``, the live leases (``slots_used``), how many limit keys
    hold a live lease (``keys_busy``) and how many of them are at the per-key limit (``keys_full``), and when the rate
    lets the next job start (``rate_next_ms``; the reading's ``now`` while it has room, ``None`` without a rate)."""

    queue: str
    limits: Limits
    slots_used: int
    keys_busy: int
    keys_full: int
    rate_next_ms: int | None


def usage_of(
    queue: str, limits: Limits, tat_us: int | None, now_ms: int, live: int, per_key: dict[str, int]
) -> LimitUsage:
    """``LimitUsage`` from what a store read: the live leases of the queue and of each key holding one."""
    full = 0 if limits.per_key_concurrency is None else sum(n >= limits.per_key_concurrency for n in per_key.values())
    rate_next = None if limits.rate is None else rate_room(limits, tat_us, now_ms)[1]
    return LimitUsage(queue, limits, live, len(per_key), full, rate_next)


#: The fewest jobs of each branch of its index a limited claim reads before it leaves out the jobs of full keys.
CLAIM_WINDOW = 128


def claim_window(limits: Limits, asked: int) -> int:
    """How many jobs of each branch's index the window walk of a limited claim reads (the first of the queue's claim
    order), before it leaves out the jobs of keys at their limit: a bounded walk, whatever the keys' backlogs. Without
    a per-key limit nothing is left out: the ``asked`` first jobs, as the plain claim reads."""
    return asked if limits.per_key_concurrency is None else max(CLAIM_WINDOW, 4 * asked)


def by_keys(limits: Limits, asked: int, got: int) -> bool:
    """Whether a limited claim walks the keys after its window walk: under a per-key limit, when the window (the
    first jobs of the claim order) held fewer claimable jobs than it asked, the keys' own best jobs may be further
    down, behind a full key's backlog: one seek a key finds them (``CLAIM_BY_KEYS``), not a walk of that backlog."""
    return limits.per_key_concurrency is not None and got < asked


def held_by_keys(queue: str, state: LimitState) -> Hold | None:
    """A per-key-limited claim that found no job: its ready jobs (if any) belong to keys at their limit, which the
    first live lease to expire may free (a finish may free one sooner); ``None`` without a live lease."""
    if state.limits.per_key_concurrency is None or state.first_expiry is None:
        return None
    return Hold(queue, state.first_expiry, False)


def held_wait(
    holds: Sequence[Hold], served: Collection[str], now_ms: int, poll: float, poll_max: float
) -> tuple[float, bool]:
    """How long an idle pool waits before it claims again, and whether a wake-up from the store (an enqueue, another
    process's commit) may end the wait sooner. Without holds: its ``poll``, woken by the store. Held: no later than
    the first hold ends (a lease expires, the rate lets a job start); and when a rate holds every queue it serves, only
    time frees them: it sleeps until then (at most ``poll_max``, to see a limit changed), not woken by the store's
    commits, which would make it claim again and again for nothing."""
    if not holds:
        return poll, True
    until = max(0.0, (min(hold.until_ms for hold in holds) - now_ms) / 1000)
    if not woken_by_the_store(holds, served):
        return min(until, poll_max), False
    return min(until, poll), True


def woken_by_the_store(holds: Sequence[Hold], served: Collection[str]) -> bool:
    """Whether new rows may let a pool claim something (``held_wait``): not while a rate holds every queue it serves."""
    return not holds or not set(served) <= {hold.queue for hold in holds if hold.by_rate}
