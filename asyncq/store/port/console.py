"""The console store's port: what the operator's console (``asyncq.web.console``, through
``asyncq.queue.console.Console``) asks of a queue store beyond the queue's own port. A queue store hands one out
(``QueueStore.console()``) on its own connection or pool.

What every store guarantees (``tests/conformance/test_console_*.py`` checks each):

- **Bounded reads.** A search walks the one index ``core.search.plan_search`` picked, in its order, and looks at
  no more than ``scan`` rows of it; what it returns is exactly the jobs among those rows that
  ``JobQuery.matches``.
- **The previewed set or nothing.** ``operate`` finds the action's set again in its own transaction, exactly as
  ``select`` did, and raises ``SetChanged`` (nothing changed) unless the count and digest are the preview's.
  Every member then moves by the lifecycle's rule, fenced by its status in that transaction; any member that
  cannot (a unique key held, a job that moved) rolls the whole action back. A member that ended in that same
  transaction because an earlier member's cancel settled its graph counts as ended by its graph, not as moved.
- **Graphs kept whole.** A delete's set leaves out every job a graph still needs (``core.operations.SPARES_GRAPHS``;
  the store's ``NEEDED_BY_GRAPH``, as prune's) and removes the edges of what it deletes; a cancel settles the
  cancelled jobs' dependants and groups as ``QueueStore.cancel`` does, and wakes this process's idle workers for
  the jobs that released (a NOTIFY wakes the other hosts').
- **Schedules** are paused, resumed and run now as their own calls do (``ScheduleStore``), each with its schedule
  event under the operator's name, on the set of named schedules the preview found (by name and ``paused_at``).
- **Audited.** Each member's move writes its job audit row (``redrive``, ``cancel``, ``cancel_request``,
  ``delete``, ``priority``) or queue audit row (``pause``, ``resume``), and the action one operator audit row
  (``OperationEntry``) that the job audit rows name; all in the action's transaction.
- **Samples kept, bounded.** ``write_sample`` writes a sample only if none is newer than half an interval, and
  deletes those older than ``keep_ms`` in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from asyncq.core.dependencies import DependencyState
from asyncq.core.operations import AuditQuery, Operation, OperationEntry, Selection
from asyncq.core.samples import Figures, Sample, Totals, WorkerLook, WorkerSeen
from asyncq.core.search import DeadGroup, JobPage, JobQuery, Position, SearchPlan


class ConsoleStore(Protocol):
    """The console's reads and writes on one queue store (every method one transaction)."""

    async def search(self, plan: SearchPlan, after: Position | None, page: int, scan: int) -> JobPage:
        """One page of ``plan``'s jobs past ``after`` (``None``: from the start), at most ``page`` of them, found
        among at most ``scan`` rows of its path; each job with its newest error (``Job.errors``), without body
        beyond what the page shows."""
        ...

    async def select(self, action: str, query: JobQuery, now_ms: int) -> Selection:
        """A job action's set: the first ``MAX_IDS`` of ``core.operations.selection_plan(action, query)``'s jobs,
        oldest first, among at most ``BULK_SCAN`` rows of its path, whether either limit was reached, and (for an
        action in ``SPARES_GRAPHS``) those of them a graph still needs, left out of the set."""
        ...

    async def queue_states(self, queues: Sequence[str]) -> dict[str, int | None]:
        """Each named queue's ``paused_at`` (``None``: it runs, or has no settings)."""
        ...

    async def operate(self, operation: Operation, now_ms: int) -> OperationEntry:
        """Carry out ``operation`` on its set, checked against the preview, in one transaction (see above)."""
        ...

    async def operations(self, query: AuditQuery) -> tuple[list[OperationEntry], int | None]:
        """The operator audit entries ``query`` finds among the ``scan`` newest before ``before``, newest first,
        and the ``before`` to go on from when that scan was cut short (``None``: it reached the oldest)."""
        ...

    async def operations_by_seq(self, seqs: Sequence[int]) -> dict[int, OperationEntry]:
        """The operator audit entries of these seqs (a job's audit rows name theirs: ``AuditEntry.op_seq``)."""
        ...

    async def dead_groups(self, queue: str | None, scan: int) -> tuple[list[DeadGroup], int]:
        """The newest ``scan`` dead jobs (of ``queue`` if named) grouped by ``(queue, reason, last error type)``
        with their counts, most first; and how many dead jobs were looked at."""
        ...

    async def dependants(self, job_id: str, limit: int) -> list[DependencyState]:
        """The jobs that depend on ``job_id`` (at most ``limit``, oldest first), each as its edge stands: the
        dependant's id and status, the edge's policy and state."""
        ...

    async def totals(self, now_ms: int) -> Totals:
        """The store's counts and live figures (``Stats`` without its attempts histogram), one read snapshot."""
        ...

    async def read_figures(self, now_ms: int) -> Figures:
        """Every queue's figures now, since the newest sample (one read snapshot; ``core.samples``)."""
        ...

    async def write_sample(self, figures: Figures, workers: Sequence[WorkerLook], every_ms: int, keep_ms: int) -> bool:
        """Write ``figures`` as a sample and record the workers seen, unless a sample newer than half of
        ``every_ms`` exists (``False``: nothing written); delete samples and workers older than ``keep_ms``."""
        ...

    async def samples(self, since_ms: int) -> list[Sample]:
        """The samples taken at or after ``since_ms``, oldest first."""
        ...

    async def workers_seen(self) -> list[WorkerSeen]:
        """Every lease holder the samples saw (within their ``keep``), the most recently seen first."""
        ...
