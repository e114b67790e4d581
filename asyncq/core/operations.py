"""An operator's actions on jobs and queues as values and rules (no I/O): which jobs or queues each action applies
to, who may take it, the digest that pins a previewed set, what a store is asked to do (``Operation``) and what it
keeps of it (``OperationEntry``, the operator audit).

A bulk action acts on a previewed set and nothing else: the preview finds the set (the query's jobs in the
action's statuses, the first ``MAX_IDS`` in ``seq`` order, found among at most ``BULK_SCAN`` rows of the path's
index), shows its count and a sample, and hands out its ``set_digest``. The operator confirms that count; the store
finds the set again inside the action's own transaction and refuses (``SetChanged``, nothing changed) unless it
has the same count and digest. Every member is then moved by the lifecycle's own rule (a redrive, a cancel decided
by ``core.lifecycle.decide_cancel``), fenced by its status in the same transaction, each with its job audit row,
and one operator audit row names the actor, their role, the note, the filter, the count and the ids.

Graphs (``docs/dependencies.md``) are kept whole: a delete leaves out every job a graph still needs (``SPARES_GRAPHS``:
a dependency of a job that has not ended, a member of a group whose callback has not ended, a callback of a group
not complete), and its preview names them (``Selection.spared``); a cancel ends a waiting job and settles its
dependants and group as every cancel does; a waiting job's new priority is the one it runs with once released.
Schedules (``docs/schedules.md``) are paused, resumed and run now the same way: a previewed set of named schedules.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncq.core.jobs import Job
from asyncq.core.lifecycle import DEAD, DONE, LEASED, PENDING, WAITING
from asyncq.core.limits import DEFAULT_TTL_MS, MAX_TTL_MS
from asyncq.core.schedules import Schedule, move_refused
from asyncq.core.search import MAX_IDS, JobQuery, Order, SearchPlan, plan_search
from asyncq.core.values import check_choice, check_identifier, check_int, check_note, check_priority, check_text
from asyncq.errors import SetChanged

REDRIVE = "redrive"
CANCEL = "cancel"
DELETE = "delete"
PRIORITY = "priority"
PAUSE = "pause"
RESUME = "resume"
PAUSE_SCHEDULE = "pause_schedule"
RESUME_SCHEDULE = "resume_schedule"
RUN_SCHEDULE = "run_schedule"

#: The statuses each action on jobs applies to: a redrive takes dead jobs; a cancel pending, waiting and leased ones
#: (a live lease gets a request its holder carries out; a waiting job ends at once, its dependants and group settled
#: with it); a delete pending, done and dead ones (a job a worker holds cannot vanish under it, nor can a waiting one
#: leave its graph: cancel it first), never one a graph still needs (``SPARES_GRAPHS``); a new priority a pending
#: job (the claim reads it) or a waiting one (it keeps it when released).
JOB_ACTIONS: dict[str, tuple[str, ...]] = {
    REDRIVE: (DEAD,),
    CANCEL: (PENDING, WAITING, LEASED),
    DELETE: (PENDING, DONE, DEAD),
    PRIORITY: (PENDING, WAITING),
}
#: The actions that leave out of their set every job a graph still needs (each store's ``NEEDED_BY_GRAPH``, the rule
#: that keeps such a job from prune and retention): the set's preview lists them apart.
SPARES_GRAPHS = frozenset({DELETE})
#: In a bulk cancel's outcome: the members that an earlier member's cancel ended in the same transaction (dependants
#: whose edge's policy is ``dead``): not a set that changed.
ENDED_BY_GRAPH = "ended by its graph"
#: The actions on queues: a pause takes running queues, a resume paused ones.
QUEUE_ACTIONS = (PAUSE, RESUME)
#: The actions on schedules: a pause takes running ones, a resume paused ones, a run now any one not retired.
SCHEDULE_ACTIONS = (PAUSE_SCHEDULE, RESUME_SCHEDULE, RUN_SCHEDULE)
ACTIONS = (*JOB_ACTIONS, *QUEUE_ACTIONS, *SCHEDULE_ACTIONS)

#: The console's roles, weakest first: each may do what the ones before it may.
READ_ONLY, OPERATOR, ADMIN = "read_only", "operator", "admin"
ROLES = (READ_ONLY, OPERATOR, ADMIN)
#: The weakest role that may take each action (reading needs ``read_only``).
ACTION_ROLES: dict[str, str] = {
    REDRIVE: OPERATOR,
    CANCEL: OPERATOR,
    PRIORITY: OPERATOR,
    PAUSE: OPERATOR,
    RESUME: OPERATOR,
    PAUSE_SCHEDULE: OPERATOR,
    RESUME_SCHEDULE: OPERATOR,
    RUN_SCHEDULE: OPERATOR,
    DELETE: ADMIN,
}

#: Rows of the path's index a bulk set is looked for in, at most (its members are at most ``MAX_IDS``).
BULK_SCAN = 100_000
#: Members a preview shows.
SAMPLE_SIZE = 20
MAX_ACTOR_CHARS = 200
_DIGEST = re.compile(r"[0-9a-f]{64}")


def may(role: str | None, action: str) -> bool:
    """Whether ``role`` (``None``: no role, nothing) may take ``action`` (or ``read``)."""
    if role is None:
        return False
    needed = READ_ONLY if action == "read" else ACTION_ROLES[action]
    return ROLES.index(role) >= ROLES.index(needed)


def set_digest(action: str, members: Iterable[tuple[Any, ...]]) -> str:
    """The digest of a set as found: the action and each member's identity and state (a job's ``seq``, id, status
    and token; a queue's or a schedule's name and ``paused_at``), in order. Any change to a member's state changes
    it."""
    hashed = hashlib.sha256(action.encode())
    for member in members:
        hashed.update(("\n" + "\t".join("" if part is None else str(part) for part in member)).encode())
    return hashed.hexdigest()


def selection_plan(action: str, query: JobQuery) -> SearchPlan:
    """How a job action's set is found, by its preview and again by the action itself: the query's jobs in the
    action's statuses, oldest first."""
    return plan_search(query, Order.OLDEST, JOB_ACTIONS[action])


@dataclass(frozen=True)
class Selection:
    """A job action's set as a store finds it: its members (``jobs``, oldest first, without bodies), whether a limit
    cut it short (``capped``), and the jobs the query found that the action leaves out because a graph still needs
    them (``spared``: a delete's; ``SPARES_GRAPHS``)."""

    jobs: list[Job]
    capped: bool
    spared: list[Job] = field(default_factory=list)


def check_same_set(action: str, count: int, digest: str, members: list[tuple[Any, ...]]) -> None:
    """``SetChanged`` unless ``members`` (found in the action's transaction) are the set previewed as ``count``
    members with ``digest``."""
    if len(members) != count or set_digest(action, members) != digest:
        raise SetChanged(count, len(members))


@dataclass(frozen=True)
class Operation:
    """One operator action for a store to carry out in one transaction: ``action`` on the set ``query`` (jobs) or
    ``queues`` names, confirmed as ``count`` members with ``digest`` (the preview's). ``priority`` is the new
    priority (``PRIORITY``); ``ttl_ms`` the redriven jobs' budget from now."""

    action: str
    count: int
    digest: str
    actor: str
    role: str
    note: str
    query: JobQuery = field(default_factory=JobQuery)
    queues: tuple[str, ...] = ()
    priority: int | None = None
    ttl_ms: int = DEFAULT_TTL_MS
    schedules: tuple[str, ...] = ()

    def checked(self) -> Operation:
        """This operation if every field is valid (``ValueError``/``TypeError`` otherwise)."""
        check_choice(self.action, "action", ACTIONS)
        check_int(self.count, "count", 1, MAX_IDS)
        if type(self.digest) is not str or _DIGEST.fullmatch(self.digest) is None:
            raise ValueError("digest must be the preview's (64 hex digits)")
        check_text(self.actor, "actor", MAX_ACTOR_CHARS)
        check_choice(self.role, "role", ROLES)
        check_note(self.note)
        if not may(self.role, self.action):
            raise ValueError(f"role {self.role} may not {self.action}")
        self.query.checked()
        if self.action in QUEUE_ACTIONS:
            check_queue_names(self.queues)
        elif self.queues:
            raise ValueError(f"{self.action} does not act on queues")
        if self.action in SCHEDULE_ACTIONS:
            check_schedule_names(self.schedules)
        elif self.schedules:
            raise ValueError(f"{self.action} does not act on schedules")
        if self.action == PRIORITY:
            check_priority(self.priority)
        elif self.priority is not None:
            raise ValueError("priority is given only to change it")
        check_int(self.ttl_ms, "ttl_ms", 1, MAX_TTL_MS)
        return self

    @property
    def statuses(self) -> tuple[str, ...]:
        """The statuses of the jobs the action applies to."""
        return JOB_ACTIONS[self.action]


def check_queue_names(queues: object, name: str = "queues") -> tuple[str, ...]:
    """1-``MAX_IDS`` distinct queue (or schedule) names."""
    if type(queues) is not tuple or not 1 <= len(queues) <= MAX_IDS or len(set(queues)) != len(queues):
        raise ValueError(f"{name} must be a tuple of 1-{MAX_IDS} distinct names")
    for queue in queues:
        check_identifier(queue, name)
    return queues


def check_schedule_names(schedules: object) -> tuple[str, ...]:
    """1-``MAX_IDS`` distinct schedule names."""
    return check_queue_names(schedules, "schedules")


def queue_set(action: str, settings: dict[str, int | None]) -> list[tuple[str, int | None]]:
    """The members of a queue action's set, in name order: of the named queues (``settings``: each name's
    ``paused_at``, ``None`` while it runs), those a pause would pause or a resume resume."""
    wanted_paused = action == RESUME
    return [(queue, at) for queue, at in sorted(settings.items()) if (at is not None) == wanted_paused]


def schedule_set(action: str, schedules: dict[str, Schedule | None]) -> list[tuple[str, int | None]]:
    """The members of a schedule action's set, in name order: of the named schedules (``None``: no such schedule),
    those the action moves (``core.schedules.move_refused`` finds nothing against it: a pause the running ones, a
    resume the paused ones, a run now every one not retired), each as its name and ``paused_at``."""
    pausing = {PAUSE_SCHEDULE: True, RESUME_SCHEDULE: False}.get(action)
    return [
        (name, schedule.paused_at)
        for name, schedule in sorted(schedules.items())
        if schedule is not None and move_refused(name, schedule, pausing=pausing) is None
    ]


@dataclass(frozen=True)
class OperationEntry:
    """One operator action as the operator audit keeps it: when, who (``actor``, ``role``), what, why (``note``),
    on which set (``filter``: the query's filters or the queues; ``count`` and ``ids`` its members; ``digest``)
    and what came of it (``outcome``: how many of the members ended in each way)."""

    seq: int
    at_ms: int
    actor: str
    role: str
    action: str
    note: str
    filter: dict[str, Any]
    count: int
    ids: tuple[str, ...]
    digest: str
    outcome: dict[str, int]


@dataclass(frozen=True)
class AuditQuery:
    """Which operator audit entries a search finds: by ``actor``, ``action``, a job or queue ``subject`` among
    the ids, ``text`` in the note (as typed, case included) (``None``: any), newest first before ``before`` (a
    seq), at most ``limit``; at most ``scan`` entries are looked at."""

    actor: str | None = None
    action: str | None = None
    subject: str | None = None
    text: str | None = None
    before: int | None = None
    limit: int = 100
    scan: int = 10_000

    def checked(self) -> AuditQuery:
        if self.actor is not None:
            check_text(self.actor, "actor", MAX_ACTOR_CHARS)
        if self.action is not None:
            check_choice(self.action, "action", ACTIONS)
        if self.subject is not None:
            check_identifier(self.subject, "subject")
        if self.text is not None:
            check_text(self.text, "text", 200)
        if self.before is not None:
            check_int(self.before, "before", 1, 2**63 - 1)
        check_int(self.limit, "limit", 1, 1000)
        check_int(self.scan, "scan", self.limit, 1_000_000)
        return self

    def matches(self, entry: OperationEntry) -> bool:
        """Whether ``entry`` is one this query finds (every store's definition)."""
        if self.actor is not None and entry.actor != self.actor:
            return False
        if self.action is not None and entry.action != self.action:
            return False
        if self.subject is not None and self.subject not in entry.ids:
            return False
        return self.text is None or self.text in entry.note
