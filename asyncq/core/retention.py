"""Retention per terminal state (no I/O here): how long finished jobs are kept, which jobs a maintenance step may
remove, and what a run removed (``docs/flow-control.md``, "Retention").

A retention rule is three stored windows, one per terminal state: ``done``, ``cancelled`` (a dead job whose reason
is ``cancelled``) and ``dead`` (every other dead job); ``None`` keeps that state for ever. A rule belongs to a
scope (``RetentionRule``): one task's jobs in one queue, a queue, or every queue (the default). A job follows the
narrowest rule there is (``rule_for``): its task's in its queue, else its queue's, else the default, else none (kept
for ever). A rule replaces the wider one whole: a task's ``dead=None`` keeps its dead jobs even where its queue's
rule removes them. A window counts from when the job ended (the stores' rule, the one ``prune`` uses: finish and
cancel stamp ``available_at``; a job the sweep parked, reason ``deadline`` or ``exhausted``, is dated by its
deadline).

A run removes, for each group of ended jobs that share a queue and a task (``None``: no task) and have a rule,
each state past its window (``expiries``): a group is one range of the stores' index of ended jobs by ``(queue,
task, status, reason, available_at)``, so each step is one bounded seek per cell, whatever the other groups hold.
The stores find the groups by skipping through that index (one seek per group), of every queue when a default
rule exists, else of the queues that have rules (``queues_to_scan``).

What a step never removes, whatever the windows say (each driver's statement states it again in SQL):
- a ``pending`` or ``leased`` job: only ``done`` and ``dead`` rows are candidates, re-checked in the statement that
  deletes them, so a job redriven or retried after it was selected stays;
- a ``done`` job whose task's result is still kept (its ``expires_at`` is in the future): a caller may be waiting
  for it (``asyncq.tasks``' results); it goes at the first step after its result expired.
Audit rows stay (as with ``prune``): the audit is the record of operators' moves, kept whatever became of the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from asyncq.core.lifecycle import DEAD, DEAD_REASONS, DONE, REASON_CANCELLED
from asyncq.core.limits import DAY_MS

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

#: How the stores key a rule's scope (a primary key holds no NULL): ``*`` for every queue (no queue name is one),
#: an empty task for the whole queue (no task name is empty).
EVERY_QUEUE = "*"
WHOLE_QUEUE = ""


class RetentionRule(NamedTuple):
    """A stored retention rule: ``queue`` (``None``: every queue, the default), ``task`` (``None``: the whole queue;
    else only that task's jobs in that queue) and its windows."""

    queue: str | None
    task: str | None
    windows: Windows

    @property
    def key(self) -> tuple[str, str]:
        """The scope as the stores key it (``EVERY_QUEUE``, ``WHOLE_QUEUE``)."""
        return stored_scope(self.queue, self.task)


def stored_scope(queue: str | None, task: str | None) -> tuple[str, str]:
    """A scope as the stores key it: ``(queue or EVERY_QUEUE, task or WHOLE_QUEUE)``."""
    return (EVERY_QUEUE if queue is None else queue, WHOLE_QUEUE if task is None else task)


def rule_of_row(
    queue: str, task: str, done_ms: int | None, dead_ms: int | None, cancelled_ms: int | None
) -> RetentionRule:
    """A rule from its stored row (the scope's keys back to ``None``)."""
    return RetentionRule(
        None if queue == EVERY_QUEUE else queue,
        None if task == WHOLE_QUEUE else task,
        Windows(done_ms, dead_ms, cancelled_ms),
    )


def scope_text(queue: str | None, task: str | None) -> str:
    """``every queue``, ``queue mail`` or ``task send in queue mail``: a rule's scope for an operator."""
    if queue is None:
        return "every queue"
    return f"queue {queue}" if task is None else f"task {task} in queue {queue}"


def rule_for(rules: Iterable[RetentionRule], queue: str, task: str | None) -> Windows | None:
    """The windows a job of ``queue`` and ``task`` follows: its task's rule in its queue, else its queue's, else the
    default (``None``: no rule, kept for ever)."""
    return _narrowest({(rule.queue, rule.task): rule.windows for rule in rules}, queue, task)


def _narrowest(
    by_scope: Mapping[tuple[str | None, str | None], Windows], queue: str, task: str | None
) -> Windows | None:
    for scope in ((queue, task), (queue, None), (None, None)):
        if scope in by_scope:
            return by_scope[scope]
    return None


def queues_to_scan(rules: Sequence[RetentionRule]) -> tuple[str, ...] | None:
    """The queues whose groups of ended jobs a run looks for: ``None`` (every queue) when a default rule exists,
    else the queues that have a rule of their own or for one of their tasks (none: nothing to look for)."""
    if any(rule.queue is None for rule in rules):
        return None
    return tuple(sorted({rule.queue for rule in rules if rule.queue is not None}))


class Expiry(NamedTuple):
    """One removal a run has to do: the jobs of ``queue`` and ``task`` (``None``: those without a task) in
    ``state`` that ended before ``cutoff_ms``."""

    queue: str
    state: str
    cutoff_ms: int
    task: str | None = None


def expiries(rules: Sequence[RetentionRule], groups: Iterable[tuple[str, str | None]], now_ms: int) -> list[Expiry]:
    """What a run at ``now_ms`` removes: for each group of ended jobs (``(queue, task)``, as the store found them),
    each state its rule (``rule_for``) keeps for a window rather than for ever."""
    by_scope = {(rule.queue, rule.task): rule.windows for rule in rules}
    found = []
    for queue, task in groups:
        windows = _narrowest(by_scope, queue, task)
        for state in RETENTION_STATES:
            window = None if windows is None else windows.of(state)
            if window is not None:
                found.append(Expiry(queue, state, now_ms - window, task))
    return found


class Removed(NamedTuple):
    """How many jobs of ``queue`` (of ``task``; ``None``: those without one) in ``state`` a run removed."""

    queue: str
    state: str
    jobs: int
    task: str | None = None


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
