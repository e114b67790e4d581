"""Retention per terminal state (no I/O here): how long a queue keeps its finished jobs, which jobs a
maintenance step may remove, and what a run removed (``docs/flow-control.md``, "Retention").

A queue's retention is three stored windows on its settings row (``QueueSettings``), one per terminal state:
``done``, ``cancelled`` (a dead job whose reason is ``cancelled``) and ``dead`` (every other dead job). ``None``
keeps that state for ever; a queue with no row keeps everything. A window counts from when the job ended (the
stores' rule, the one ``prune`` uses: finish and cancel stamp ``available_at``; a job the sweep parked, reason
``deadline`` or ``exhausted``, is dated by its deadline).

What a step never removes, whatever the windows say (each driver's statement states it again in SQL):
- a ``pending`` or ``leased`` job: only ``done`` and ``dead`` rows are candidates, re-checked in the statement that
  deletes them, so a job redriven or retried after it was selected stays;
- a ``done`` job whose task's result is still kept (its ``expires_at`` is in the future): a caller may be waiting
  for it (``asyncq.tasks``' results); it goes at the first step after its result expired.
Audit rows stay (as with ``prune``): the audit is the record of operators' moves, kept whatever became of the job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from asyncq.core.lifecycle import DEAD, DEAD_REASONS, DONE, REASON_CANCELLED
from asyncq.core.limits import DAY_MS

if TYPE_CHECKING:
    from asyncq.core.flow import QueueSettings

#: The terminal states a retention window applies to, in the order reports list them.
RETENTION_STATES = ("done", "cancelled", "dead")
#: The longest window (ten years); ``None`` is "for ever".
MAX_RETENTION_MS = 3650 * DAY_MS
#: Rows one step removes at most, in one transaction (one index seek of the ended jobs of a queue and state).
RETENTION_BATCH = 500
#: Steps one run takes at most before it returns (the pool runs again at its next turn).
RETENTION_MAX_BATCHES = 20


class Cell(NamedTuple):
    """Rows of one ``(status, reason)``: the prefix a retention step seeks in the ended jobs' index (plain columns,
    so a finish pays one index entry and no expression)."""

    status: str
    reason: str | None


#: The cells of each retention state: a step of a state seeks them in turn, in one transaction.
STATE_CELLS: Mapping[str, tuple[Cell, ...]] = {
    "done": (Cell(DONE, None),),
    "cancelled": (Cell(DEAD, REASON_CANCELLED),),
    "dead": tuple(Cell(DEAD, reason) for reason in DEAD_REASONS if reason != REASON_CANCELLED),
}


class Windows(NamedTuple):
    """A queue's retention in milliseconds per state; ``None`` keeps that state for ever."""

    done_ms: int | None = None
    dead_ms: int | None = None
    cancelled_ms: int | None = None

    def of(self, state: str) -> int | None:
        """The window of ``state`` (one of ``RETENTION_STATES``)."""
        return {"done": self.done_ms, "dead": self.dead_ms, "cancelled": self.cancelled_ms}[state]


#: Every state kept for ever: a queue never set.
FOREVER = Windows()


class Expiry(NamedTuple):
    """One removal a run has to do: ``queue``'s jobs in ``state`` that ended before ``cutoff_ms``."""

    queue: str
    state: str
    cutoff_ms: int


def expiries(settings: Sequence[QueueSettings], now_ms: int) -> list[Expiry]:
    """What a run at ``now_ms`` removes, per queue (by name) and state, from the queues' stored windows."""
    found = []
    for queue in settings:
        for state in RETENTION_STATES:
            window = queue.retention.of(state)
            if window is not None:
                found.append(Expiry(queue.queue, state, now_ms - window))
    return found


class Removed(NamedTuple):
    """How many jobs of ``queue`` in ``state`` a run removed."""

    queue: str
    state: str
    jobs: int


@dataclass(frozen=True)
class RetentionReport:
    """What one run removed (``Queue.apply_retention``): jobs per queue and state (only those with any), how many
    bounded batches (transactions) it took, and whether it finished (``False``: it stopped at its batch limit
    with expired rows left; the next run goes on)."""

    removed: tuple[Removed, ...]
    batches: int
    complete: bool

    @property
    def total(self) -> int:
        return sum(item.jobs for item in self.removed)

    def by_state(self) -> Mapping[str, int]:
        """Jobs removed per state, every state present."""
        counts = dict.fromkeys(RETENTION_STATES, 0)
        for item in self.removed:
            counts[item.state] += item.jobs
        return counts


def retention_text(windows: Windows) -> str:
    """``done 7d, cancelled 1d, dead forever``: a queue's windows for an operator."""
    return ", ".join(f"{state} {_span(windows.of(state))}" for state in RETENTION_STATES)


def _span(ms: int | None) -> str:
    if ms is None:
        return "forever"
    for unit, size in (("d", DAY_MS), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
