"""``OperatorConsole``: the facade the operator's console (``asyncq.web.console``) reads and acts through, over a
``Queue``'s store (``QueueStore.console()``). Like every facade it checks each argument before the store is called
and reads the queue's injected clock; the rules are ``core``'s: which index a search walks (``core.search``), which
jobs an action applies to and how a previewed set is pinned (``core.operations``), what a sample is
(``core.samples``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncq.core.dependencies import DependencyState
from asyncq.core.jobs import AuditEntry, Job
from asyncq.core.operations import (
    CANCEL,
    JOB_ACTIONS,
    QUEUE_ACTIONS,
    SAMPLE_SIZE,
    SCHEDULE_ACTIONS,
    AuditQuery,
    Operation,
    OperationEntry,
    check_queue_names,
    check_schedule_names,
    queue_set,
    schedule_set,
    set_digest,
)
from asyncq.core.samples import (
    MAX_KEEP_MS,
    MIN_SAMPLE_MS,
    Sample,
    Totals,
    WorkerSeen,
    lease_map,
    look_at_workers,
)
from asyncq.core.search import (
    MAX_PAGE,
    MAX_SCAN,
    DeadGroup,
    JobPage,
    JobQuery,
    Order,
    decode_cursor,
    plan_search,
)
from asyncq.core.values import check_choice, check_identifier, check_int
from asyncq.queue.facade import Queue
from asyncq.store.port.console import ConsoleStore


@dataclass(frozen=True)
class Preview:
    """A bulk action's set as found now: its ``count`` members (at most ``MAX_IDS``), a ``sample`` of the jobs (or
    the ``queues`` or ``schedules`` named), the ``digest`` the action must find again, and whether a limit cut the
    set short (``capped``: it is the first ``count`` matches; act, then preview again for the rest). ``spared``: the
    jobs the filter found that the action leaves out because a graph still needs them (a delete's), at most
    ``SAMPLE_SIZE`` of them, and how many there are (``spared_count``)."""

    action: str
    count: int
    digest: str
    capped: bool
    query: JobQuery = field(default_factory=JobQuery)
    sample: list[Job] = field(default_factory=list)
    queues: tuple[str, ...] = ()
    schedules: tuple[str, ...] = ()
    spared: list[Job] = field(default_factory=list)
    spared_count: int = 0


@dataclass(frozen=True)
class JobStory:
    """One job's whole story as stored: the job (``None`` once deleted or pruned), its audit rows oldest first, and
    the operator audit entries behind them by seq."""

    job_id: str
    job: Job | None
    history: list[AuditEntry]
    operations: dict[int, OperationEntry]


class OperatorConsole:
    """The console's reads and actions on one ``Queue`` (which it does not close)."""

    def __init__(self, queue: Queue) -> None:
        if not isinstance(queue, Queue):
            raise TypeError(f"queue must be an asyncq.Queue, not {type(queue).__name__}")
        self.queue = queue
        self.store: ConsoleStore = queue.store.console()
        self._leases: dict[tuple[str, int], int] = {}

    # -- reads ------------------------------------------------------------------------------------------------

    async def search(
        self,
        query: JobQuery,
        *,
        order: Order = Order.NEWEST,
        cursor: str | None = None,
        page: int = 50,
        scan: int = MAX_SCAN,
    ) -> JobPage:
        """One page of the jobs ``query`` finds, listed in ``order`` from ``cursor`` (a page's ``next``), found among
        at most ``scan`` rows of the index ``core.search.plan_search`` picks."""
        check_choice(order, "order", tuple(Order))
        plan = plan_search(query.checked(), Order(order))
        after = None if cursor is None else decode_cursor(cursor, plan)
        check_int(page, "page", 1, MAX_PAGE)
        check_int(scan, "scan", page, 1_000_000)
        return await self.store.search(plan, after, page, scan)

    async def story(self, job_id: str) -> JobStory:
        """A job, its audit rows and the console actions behind them (a deleted job keeps its audit rows)."""
        check_identifier(job_id, "job_id")
        job = await self.queue.get(job_id)
        history = await self.queue.history(job_id)
        seqs = sorted({entry.op_seq for entry in history if entry.op_seq is not None})
        operations = await self.store.operations_by_seq(seqs) if seqs else {}
        return JobStory(job_id, job, history, operations)

    async def dead_groups(self, queue: str | None = None, *, scan: int = MAX_SCAN) -> tuple[list[DeadGroup], int]:
        """The newest ``scan`` dead jobs (of ``queue``) grouped by queue, reason and newest error type, the largest
        groups first; and how many dead jobs were looked at."""
        if queue is not None:
            check_identifier(queue, "queue")
        check_int(scan, "scan", 1, 1_000_000)
        groups, looked = await self.store.dead_groups(queue, scan)
        groups.sort(key=lambda g: (-g.count, g.queue, g.reason, g.error_type or ""))
        return groups, looked

    async def audit(self, query: AuditQuery) -> tuple[list[OperationEntry], int | None]:
        """The console actions ``query`` finds, newest first, and where an older search goes on from."""
        return await self.store.operations(query.checked())

    async def operations(self, seqs: list[int]) -> dict[int, OperationEntry]:
        """The console actions of these seqs (an audit entry's page, a job's timeline), by seq."""
        for seq in seqs:
            check_int(seq, "seq", 1, 2**63 - 1)
        return await self.store.operations_by_seq(seqs)

    async def totals(self) -> Totals:
        """The store's counts and live figures now, as the console shows them on every refresh."""
        return await self.store.totals(self.queue.now())

    async def samples(self, since_ms: int) -> list[Sample]:
        """The samples kept since ``since_ms``, oldest first."""
        return await self.store.samples(check_int(since_ms, "since_ms", 0, 2**62))

    async def workers_seen(self) -> list[WorkerSeen]:
        """The lease holders the samples saw, the most recently seen first."""
        return await self.store.workers_seen()

    # -- actions ----------------------------------------------------------------------------------------------

    async def preview(
        self,
        action: str,
        query: JobQuery | None = None,
        queues: tuple[str, ...] = (),
        schedules: tuple[str, ...] = (),
    ) -> Preview:
        """The set ``action`` would act on now: ``query``'s jobs in the action's statuses (a delete's without those a
        graph still needs), the named ``queues`` a pause (resume) would change, or the named ``schedules`` a pause,
        resume or run now would."""
        check_choice(action, "action", (*JOB_ACTIONS, *QUEUE_ACTIONS, *SCHEDULE_ACTIONS))
        if action in QUEUE_ACTIONS:
            held = queue_set(action, await self.store.queue_states(check_queue_names(queues)))
            names = tuple(queue for queue, _at in held)
            return Preview(action, len(held), set_digest(action, held), False, queues=names)
        if action in SCHEDULE_ACTIONS:
            named = check_schedule_names(schedules)
            stored = {schedule.name: schedule for schedule in await self.queue.schedules()}
            moved = schedule_set(action, {name: stored.get(name) for name in named})
            found = tuple(name for name, _at in moved)
            return Preview(action, len(moved), set_digest(action, moved), False, schedules=found)
        checked = (query or JobQuery()).checked()
        found_set = await self.store.select(action, checked, self.queue.now())
        jobs = found_set.jobs
        members = [(job.seq, job.id, job.status, job.token) for job in jobs]
        return Preview(
            action, len(jobs), set_digest(action, members), found_set.capped, checked, jobs[:SAMPLE_SIZE],
            spared=found_set.spared[:SAMPLE_SIZE], spared_count=len(found_set.spared),
        )  # fmt: skip

    async def operate(self, operation: Operation) -> OperationEntry:
        """Carry out ``operation`` on the set its preview showed: ``SetChanged`` (nothing changed) if the set is
        not that one any more; ``UniqueConflict`` (nothing changed) if a redriven job's key is held; ``ValueError``
        (nothing changed) if a redriven dependant's dependency is still dead under policy ``dead``. A cancel that
        stored requests wakes this process's pools holding those jobs, a schedule action its schedule keepers,
        as ``Queue.cancel`` and the schedule calls do."""
        entry = await self.store.operate(operation.checked(), self.queue.now())
        if operation.action == CANCEL and entry.outcome.get("requested"):
            self.queue._cancel_requested()
        if operation.action in SCHEDULE_ACTIONS:
            self.queue._schedules_changed()
        return entry

    async def dependants(self, job_id: str, limit: int = 100) -> tuple[list[DependencyState], bool]:
        """The jobs that depend on ``job_id`` (at most ``limit``, oldest first), each as its edge stands, and
        whether there are more."""
        check_identifier(job_id, "job_id")
        check_int(limit, "limit", 1, 1000)
        found = await self.store.dependants(job_id, limit + 1)
        return found[:limit], len(found) > limit

    # -- sampling -----------------------------------------------------------------------------------------------

    async def sample(self, every_ms: int, keep_ms: int) -> bool:
        """Read every queue's figures and keep them as a sample (unless another console wrote one less than half of
        ``every_ms`` ago: ``False``); samples older than ``keep_ms`` are deleted."""
        check_int(every_ms, "every_ms", MIN_SAMPLE_MS, MAX_KEEP_MS)
        check_int(keep_ms, "keep_ms", every_ms, MAX_KEEP_MS)
        figures = await self.store.read_figures(self.queue.now())
        looks = look_at_workers(self._leases, figures.leases)
        self._leases = lease_map(figures.leases)
        return await self.store.write_sample(figures, looks, every_ms, keep_ms)
