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
  cannot (a unique key held, a job that moved) rolls the whole action back.
- **Audited.** Each member's move writes its job audit row (``redrive``, ``cancel``, ``cancel_request``,
  ``delete``, ``priority``) or queue audit row (``pause``, ``resume``), and the action one operator audit row
  (``OperationEntry``) that the job audit rows name; all in the action's transaction.
- **Samples kept, bounded.** ``write_sample`` writes a sample only if none is newer than half an interval, and
  deletes those older than ``keep_ms`` in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from asyncq.core.jobs import Job
from asyncq.core.operations import AuditQuery, Operation, OperationEntry
from asyncq.core.samples import Figures, Sample, Totals, WorkerLook, WorkerSeen
from asyncq.core.search import DeadGroup, JobPage, Position, SearchPlan


class ConsoleStore(Protocol):
    """The console's reads and writes on one queue store (every method one transaction)."""

    async def search(self, plan: SearchPlan, after: Position | None, page: int, scan: int) -> JobPage:
        """One page of ``plan``'s jobs past ``after`` (``None``: from the start), at most ``page`` of them, found
        among at most ``scan`` rows of its path; each job with its newest error (``Job.errors``), without body
        beyond what the page shows."""
        ...

    async def select(self, plan: SearchPlan, now_ms: int) -> tuple[list[Job], bool]:
        """A bulk action's set: the first ``MAX_IDS`` of ``plan``'s jobs, oldest first, among at most
        ``BULK_SCAN`` rows of its path, and whether either limit was reached."""
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
