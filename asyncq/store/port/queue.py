"""The queue store's port: what ``Queue`` (and through it the pool, the CLI, the dashboard and the metrics) asks
of a store.

What every store must guarantee (the conformance suite in ``tests/conformance/`` checks each):

- **Atomic claim.** A claim sweeps unclaimable rows (deadline passed, attempts used up) to ``dead`` and leases
  ready jobs in ``core.claim_plan``'s order (priority, then ready time, then ``seq``; a job over its queue's
  ``max_wait`` first), in one transaction; no job is leased twice at once; each claim gives the job a new
  token (``token + 1``) and counts an attempt.
- **Flow control read by the claim.** A queue's stored settings (paused, ``max_wait``) are read by the claim
  statement itself: a claim that begins after a pause committed takes nothing from that queue, on any host.
- **Limits counted in the claim.** A queue's concurrency limits bound its live (unexpired) leases, of the queue and of
  each ``limit_key``, and its rate limit the jobs started, by a rate state the claim advances in its transaction
  (``core.flow_limits``); the count and the claim are serialised per queue (SQLite's write lock; a lock of the
  queue's settings row on a server), so no two claims together exceed a limit. A limited queue is never claimed
  ahead; a job a limit holds is not claimed and spends no attempt.
- **Compare-and-set finish.** A finish, extend or release lands only if id, owner, token, attempt and
  ``lease_until`` all still match and the lease has not expired at ``now_ms``; a stale member of a batch changes
  nothing while the rest land. Decisions are ``asyncq.core.lifecycle``'s, never the store's own.
- **All or nothing.** Every call is one transaction: a failure rolls back all of it, and bad input is refused
  (by the facade, before the store is called) with nothing changed.
- **Unique while active.** At most one job of a queue in ``core.lifecycle.UNIQUE_WHILE`` (pending or leased)
  holds a unique key, enforced by the store's own partial unique index; every transition into those statuses
  keeps it (a retry or release keeps the key its job holds; a redrive whose key is taken is ``UniqueConflict``),
  and no driver's integrity error ever escapes.
- **Retention by the stored rules.** A retention step removes only ended jobs of one queue and task past the window
  the caller computed from the rules (``core.retention``) for their state, at most its batch, in one transaction,
  by an index seek; never a live row, nor one a graph still needs.
- **Schedules as stored state** (``asyncq.store.port.schedules``): one job per tick, whoever evaluates it.
- **Dependencies and groups** (``store/port/graphs.py``): a graph commits whole; a job's end settles its dependants
  and its group in the same transaction; a job in no graph pays nothing more.
- **Time from the caller.** Every ``now_ms`` is the caller's clock; a store never reads a clock of its own.
- **Durability stated.** A call that returned survives power loss at the store's default level (SQLite WAL+FULL
  or DELETE+EXTRA; PostgreSQL ``synchronous_commit=on``); a weaker level is opt-in and says so
  (``Capabilities.survives_power_loss``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from asyncq.core.flow import QueueAuditEntry, QueueSettings
from asyncq.core.flow_limits import Limits, LimitUsage
from asyncq.core.jobs import AuditEntry, CancelOutcome, Enqueued, Finish, Job, NewJob, Settled, Ticket
from asyncq.core.lifecycle import Fence, Renewal
from asyncq.core.offers import Offer
from asyncq.core.retention import RetentionRule, Windows
from asyncq.core.stats import Stats
from asyncq.store.port.console import ConsoleStore
from asyncq.store.port.graphs import GraphStore, GraphTransaction
from asyncq.store.port.reports import BackupReport, PruneReport, StoreDescription
from asyncq.store.port.schedules import ScheduleStore

#: How a store on a database server is named (anything else is a path to a SQLite file).
URL_SCHEMES = ("postgresql://", "postgres://")


def is_store_url(target: object) -> bool:
    """Whether ``target`` names a database server's store by URL (PostgreSQL) rather than a file."""
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


@dataclass(frozen=True)
class Capabilities:
    """Where stores differ. ``backup``: an online copy of the whole store (``QueueStore.backup``);
    ``app_sql``: ``StoreTransaction.execute`` runs the app's own statements; ``survives_power_loss``: the level
    the store was opened at; ``read_only``: opened for reading (every write raises)."""

    backup: bool
    app_sql: bool
    survives_power_loss: bool
    read_only: bool


@dataclass(frozen=True)
class JobFilter:
    """Which jobs ``list_jobs`` returns: ``None`` matches any. ``after`` is a ``seq`` (oldest first from just
    past it); ``newest`` lists newest first instead (``after`` is then ignored)."""

    status: str | None = None
    queue: str | None = None
    reason: str | None = None
    after: int = 0
    limit: int = 100
    newest: bool = False
    body: bool = True
    #: Fill each job's ``errors`` with its newest failed attempt's error (``dead`` listings show it).
    errors: bool = False


class StoreTransaction(GraphTransaction, Protocol):
    """An open transaction of a store, in which the app's own statements and asyncq's rows commit together."""

    async def execute(self, statement: str, parameters: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement of the app's own and return its rows."""
        ...

    async def enqueue_rows(self, rows: Sequence[NewJob]) -> list[Enqueued]:
        """Insert jobs inside this transaction (``QueueStore.enqueue``'s rule for each)."""
        ...


class QueueStore(ScheduleStore, GraphStore, Protocol):
    """A queue's storage. Every method is one transaction; arguments are already checked by the facade."""

    #: Where the store lives, for messages (a file path, a URL without its password).
    location: str
    capabilities: Capabilities

    @property
    def wakeup_losses(self) -> int:
        """How many times wake-ups from other processes were lost since the store opened (a listening connection
        lost or refused, a file watcher's source failed; on SQLite, this process's watchers), each logged: waiting
        fell back to polling until they came back. A pool reports the rise to its observer."""
        ...

    # -- producers ----------------------------------------------------------------------------------------

    async def enqueue(self, rows: Sequence[NewJob], *, connection: Any = None) -> list[Enqueued]:
        """Insert ``rows`` all or none: ``True`` per new job, ``False`` where the id exists with the same payload
        (its row is kept whole); ``Conflict`` (nothing inserted) where it exists with another payload. A row whose
        unique key an active job of its queue holds (an earlier row of the batch included) is not inserted: its
        answer is that job's id, or ``UniqueConflict`` (nothing inserted) if the row asks to raise.
        ``connection``: an app's own connection to the store's database with its transaction open, to insert in
        (the rows then commit or roll back with the app's); a store that cannot join one raises ``TypeError``."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[StoreTransaction]:
        """A transaction for the app's statements and jobs: committed when the block ends, rolled back if it
        raises or is cancelled."""
        ...

    # -- workers ------------------------------------------------------------------------------------------

    async def settle_and_claim(
        self,
        finishes: Sequence[Finish],
        now_ms: int,
        owner: str,
        lease_ms: int,
        wants: Sequence[tuple[str, int]],
        total: int | None,
        *,
        start_now: int | None = None,
        started: Sequence[Ticket] = (),
        resend: bool = False,
        offer: Offer | None = None,
    ) -> Settled:
        """A pool's group commit, one transaction (``resend``: these finishes were sent before by a call whose commit
        may have landed, ``StoreBusy.may_have_landed``: a finish found already in its row, under its token, counts as
        landed, ``core.finish_plan.landed_before``): count the attempt of each job claimed ahead that a handler
        has ``started`` (fenced on its lease), finish ``finishes`` (the new status each, ``None`` if stale), then
        claim up to ``n`` jobs of each ``(queue, n)`` in ``wants`` (at most ``total`` in all). The first
        ``start_now`` claimed (all, if ``None``) count an attempt now; the rest are claimed ahead, uncounted
        (``Ticket.counted`` is ``False``), so that a worker killed with them in its buffer spends none. A queue with
        limits is claimed only for the counted jobs, as many as its limits allow; ``Settled.holds`` names each queue
        its limits let take nothing, and until when. ``offer``, the pool's idle offer (``core.offers``): after the
        claims, withdraw it or write it (a row per queue of ``wants``) as ``core.offers.offer_step`` says, then take
        the jobs enqueues claimed for it that are not in ``offer.picked`` (their tickets come last, claimed ahead)
        and forget every job noted as offered to ``owner``."""
        ...

    async def offered(self, owner: str, now_ms: int) -> list[Ticket]:
        """The jobs enqueues claimed for ``owner``'s offer that its commits have not taken yet and it still holds
        (leased to it, the lease not ended at ``now_ms``): their tickets, claimed ahead, oldest first. A read: it
        takes no lock and writes nothing."""
        ...

    async def finish(self, finishes: Sequence[Finish], now_ms: int) -> list[str | None]:
        """Finish without claiming (``settle_and_claim`` with no wants)."""
        ...

    async def extend(self, leases: Sequence[tuple[str, Fence]], now_ms: int, lease_ms: int) -> list[Renewal | None]:
        """Renew held leases to ``min(now + lease_ms, deadline)``, each with whether a cancel of its job was
        requested (read by the renewal's own fenced statement); ``None`` for each lease no longer held."""
        ...

    async def release(
        self, leases: Sequence[tuple[str, Fence]], now_ms: int, counted: Sequence[bool] | None = None
    ) -> list[bool]:
        """Give back held leases of jobs never started (pending again, an attempt counted at claim returned:
        ``counted`` says which, all by default)."""
        ...

    async def wait_for_work(self, timeout: float) -> None:
        """Return when new work may be ready (rows committed through this store), or after ``timeout`` s."""
        ...

    def host_rides(self, start: Callable[[], bool]) -> Callable[[], None]:
        """A pool offers this process's enqueues a place in its group commit: ``start()`` asks it to run one now,
        and says whether it will (it has room to claim). Returns the function that withdraws the offer. A store
        whose writes each run on a connection of their own ignores the offer (PostgreSQL)."""
        ...

    # -- operators ----------------------------------------------------------------------------------------

    async def redrive(self, job_id: str, now_ms: int, deadline_ms: int, note: str) -> AuditEntry:
        """Re-arm a dead job (attempts 0, deadline ``deadline_ms``) after writing its audit row, which is
        returned; ``ValueError`` (nothing changes) if the job is missing or not dead, ``UniqueConflict`` (nothing
        changes, nothing audited) if another active job of its queue holds its unique key now."""
        ...

    async def cancel(self, job_id: str, now_ms: int, note: str) -> CancelOutcome:
        """Cancel a job as ``core.lifecycle.decide_cancel`` decides on its row read in this transaction: end it
        dead (``cancelled``) if nobody holds it, store a cancel request on its row if a live lease does (the
        holder's renewal returns it; the sweep ends the row once nobody holds it), each with an audit row
        (``cancel``, ``cancel_request``); ``too_late`` for a job that has ended (nothing changes). ``ValueError``
        if it is missing."""
        ...

    async def set_paused(self, queue: str, paused: bool, now_ms: int, note: str, actor: str) -> QueueAuditEntry:
        """Pause (``paused``) or resume ``queue`` with an audit row, which is returned; ``ValueError`` (nothing
        changes) if it is paused already (resuming: if it is not paused). Jobs in flight are not touched."""
        ...

    async def set_max_wait(
        self, queue: str, max_wait_ms: int | None, now_ms: int, note: str, actor: str
    ) -> QueueAuditEntry:
        """Set ``queue``'s ``max_wait`` (``None``: none, strict priorities) with an audit row, which is returned."""
        ...

    async def set_retention(
        self, queue: str | None, task: str | None, windows: Windows | None, now_ms: int, note: str, actor: str
    ) -> QueueAuditEntry:
        """Set the retention rule of one scope to ``windows`` (each ``None``: for ever), or clear it (``windows``
        ``None``), with an audit row (queue ``"*"`` for the default), which is returned. The scope: every queue
        (``queue`` ``None``, the default), a queue, or one ``task``'s jobs in ``queue``. Clearing a scope without a
        rule is a ``ValueError``, nothing written."""
        ...

    async def retention_rules(self) -> list[RetentionRule]:
        """Every stored retention rule: the default first, then by queue, a queue's own before its tasks'."""
        ...

    async def ended_groups(self, queues: Sequence[str] | None) -> list[tuple[str, str | None]]:
        """The ``(queue, task)`` groups of done and dead jobs (``None``: those without a task) of ``queues`` (every
        queue if ``None``), by queue then task, those without one first; one index seek per group."""
        ...

    async def set_limits(self, queue: str, limits: Limits, now_ms: int, note: str, actor: str) -> QueueAuditEntry:
        """Set ``queue``'s limits (each ``None``: no such limit) with an audit row, which is returned; the rate's state
        is kept as ``core.flow_limits.rate_state_kept`` says. Leases in flight are not touched."""
        ...

    async def limit_usage(self, now_ms: int) -> list[LimitUsage]:
        """Every queue with limits, by name: its limits and what they hold at ``now_ms`` (live leases of the queue and
        per key, the rate's next start), in one read."""
        ...

    async def remove_expired(
        self, queue: str, task: str | None, state: str, cutoff_ms: int, now_ms: int, limit: int
    ) -> int:
        """One retention step, one transaction: remove (with their errors and results; audit rows stay) up to
        ``limit`` of the jobs of ``queue`` and ``task`` (``None``: those without a task) in retention ``state``
        (``core.retention.RETENTION_STATES``) that ended before ``cutoff_ms``, found by an index seek; never a
        pending or leased row, nor a done job whose result is kept past ``now_ms``. How many it removed."""
        ...

    async def queue_settings(self) -> list[QueueSettings]:
        """Every queue's stored settings (paused or not, ``max_wait``, retention), by name; a queue never set has
        none."""
        ...

    async def queue_audit(self, queue: str | None, limit: int) -> list[QueueAuditEntry]:
        """The newest ``limit`` moves on queues (pause, resume, max_wait), of ``queue`` only if named, newest first."""
        ...

    async def get(self, job_id: str) -> Job | None:
        """One job's stored record (its redrive count included), or ``None``."""
        ...

    async def list_jobs(self, which: JobFilter) -> list[Job]:
        """Jobs matching ``which``, in ``seq`` order (newest first if asked), at most ``which.limit``."""
        ...

    async def history(self, job_id: str) -> list[AuditEntry]:
        """The audit rows of one job (redrives and cancels), oldest first."""
        ...

    async def audit_log(self, limit: int) -> list[AuditEntry]:
        """The newest ``limit`` audit rows of the whole store, newest first."""
        ...

    async def stats(self, now_ms: int) -> Stats:
        """Every figure of ``Stats`` in one read transaction."""
        ...

    async def prunable(self, cutoff_ms: int, statuses: Sequence[str], limit: int) -> tuple[dict[str, int], list[str]]:
        """What ``prune`` would delete: counts by status of the jobs with a status in ``statuses`` that ended
        before ``cutoff_ms``, and the first ``limit`` of their ids (``-1``: all)."""
        ...

    async def prune(self, cutoff_ms: int, statuses: Sequence[str], *, vacuum: bool, now_ms: int) -> PruneReport:
        """Delete those jobs (audit rows stay) with their tasks' results, and the results kept past their
        retention (``expires_at <= now_ms``) whatever their job's age; give the space back as the
        store can; what it did."""
        ...

    async def backup(self, target: str, *, force: bool) -> BackupReport:
        """An online, checked copy of the whole store at ``target`` (``capabilities.backup`` stores only;
        others raise ``NotImplementedError`` saying what to use instead)."""
        ...

    async def describe(self) -> StoreDescription:
        """What the store is, for an operator: its kind, schema version and settings."""
        ...

    async def close(self) -> None:
        """Close the store (after the transaction in progress)."""
        ...

    def console(self) -> ConsoleStore:
        """The operator console's reads and writes on this store, on its connection or pool
        (``asyncq.store.port.console``)."""
        ...


@dataclass(frozen=True)
class StoreState:
    """What a target holds before a facade opens it (``Queue.inspect``), found without creating or changing
    anything. ``kind``: ``missing`` (nothing there: opening would create it), ``empty`` (a store with no tables
    yet; on PostgreSQL: a schema without tables), ``other`` (an app's tables but no queue) or ``queue`` (asyncq's
    tables, at ``schema_version``). ``settings`` names the store's own settings for messages (a SQLite file's
    ``journal_mode``, ``auto_vacuum``, and ``network_filesystem``: the network file system it lives on, or
    ``None``; a PostgreSQL schema's name and ``synchronous_commit``)."""

    location: str
    kind: str
    schema_version: int
    current_version: int
    settings: dict[str, Any]
    #: Which store: ``sqlite`` (a file) or ``postgresql`` (a schema of a database).
    store: str = "sqlite"

    @property
    def problem(self) -> str | None:
        """Why a command may not open this as an existing queue (``None``: it may; an older schema is
        migrated by a writer's open)."""
        if self.kind == "missing":
            return f"no such queue {'file' if self.store == 'sqlite' else 'schema'}: {self.location}"
        if self.kind != "queue":
            return f"{self.location} is not an asyncq queue (it has no queue tables; `asyncq init` adds them)"
        if self.schema_version > self.current_version:
            return (
                f"{self.location} has schema version {self.schema_version}, newer than this asyncq's "
                f"({self.current_version})"
            )
        return None
