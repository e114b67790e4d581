"""Dependencies between jobs: what a dependency's end does to the jobs waiting for it, decided once for every
store (no I/O here; ``docs/dependencies.md`` states the guarantees).

A job enqueued with ``after=[…]`` is stored ``waiting`` with one edge per dependency and a count of the edges not
yet met (``waits``). Each edge carries its policy for a dependency that ends dead (``OnDependencyDead``). The rule
(``edge_effect``) is the same wherever an edge is evaluated:

- at enqueue, against each dependency's status then (a job already done counts as met);
- in the transaction that ends a dependency (a finish, the group commit's included, the sweep, a cancel): a done
  dependency meets the edge; a dead one meets it (``run``), ends the dependant dead with reason ``dependency``
  (``dead``, the default) or leaves it waiting (``wait``: a redrive of the dependency may still meet it);
- when an operator redrives a dependant: its edges not met are evaluated again (``plan_redrive``).

A dependant whose count reaches 0 goes ``pending`` in the same transaction (ready at once, or at the end of its own
delay), keeping its priority and every other column. A job's ``links`` flags (``HAS_DEPENDANTS``, ``IN_GROUP``) say
whether its end must run anything more: a job in no graph has none, and its finish pays one column of RETURNING.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from asyncq.core.lifecycle import DEAD, DONE, PENDING, WAITING
from asyncq.core.limits import MAX_DEPENDENCIES
from asyncq.core.values import check_choice, check_identifier


class OnDependencyDead(StrEnum):
    """What a dependant does when a dependency ends dead (per edge)."""

    DEAD = "dead"  # the dependant ends dead too, reason ``dependency`` (the default)
    RUN = "run"  # the dependency counts as met: the dependant runs anyway
    WAIT = "wait"  # the dependant keeps waiting; a redrive of the dependency that ends done meets it


ON_DEPENDENCY_DEAD = tuple(policy.value for policy in OnDependencyDead)

#: An edge's state: ``open`` (not met yet), ``met``, ``failed`` (its dependency ended dead under policy ``dead``).
OPEN, MET, FAILED = "open", "met", "failed"
EDGE_STATES = (OPEN, MET, FAILED)
#: What evaluating an edge decides: it is met, it fails (the dependant ends dead), or it stays as it is.
FAIL, KEEP = "fail", "keep"

#: The ``links`` flags of a job's row (``NULL`` for a job in no graph). ``HAS_DEPENDANTS``: some job has (had) an edge
#: to it, so its end settles them and retention keeps it while they live; ``IN_GROUP``: its end counts in its group;
#: ``IS_CALLBACK``: a group's callback (retention keeps it until its group completes).
HAS_DEPENDANTS = 1
IN_GROUP = 2
IS_CALLBACK = 4


@dataclass(frozen=True)
class Dependency:
    """One entry of ``after=[…]`` with its own policy: ``Dependency("fetch-1", on_dead="run")``. A plain id takes
    the job's ``on_dependency_dead``."""

    job: str
    on_dead: str = OnDependencyDead.DEAD


def edge_effect(policy: str, status: str) -> str:
    """What a dependency in ``status`` does to an edge with ``policy``: ``met``, ``fail`` or ``keep``."""
    if status == DONE:
        return MET
    if status == DEAD and policy == OnDependencyDead.DEAD:
        return FAIL
    if status == DEAD and policy == OnDependencyDead.RUN:
        return MET
    return KEEP


def check_after(after: object, default: object) -> tuple[tuple[str, str], ...]:
    """``after`` as ``(id, policy)`` pairs: a list or tuple of ids (``default``'s policy) and ``Dependency`` values;
    ``TypeError`` for another container, ``ValueError`` for a bad id or policy, a job named twice, or too many."""
    policy = check_choice(default, "on_dependency_dead", ON_DEPENDENCY_DEAD)
    if type(after) not in (list, tuple):
        raise TypeError(f"after must be a list or tuple of job ids, not {type(after).__name__}")
    assert isinstance(after, list | tuple)
    if len(after) > MAX_DEPENDENCIES:
        raise ValueError(f"after names {len(after)} jobs: at most {MAX_DEPENDENCIES}")
    pairs: dict[str, str] = {}
    for item in after:
        if type(item) is Dependency:
            job_id = check_identifier(item.job, "a dependency's job")
            own = str(check_choice(item.on_dead, "on_dead", ON_DEPENDENCY_DEAD))
        else:
            job_id, own = check_identifier(item, "a dependency's id"), str(policy)
        if job_id in pairs:
            raise ValueError(f"after names job {job_id!r} twice")
        pairs[job_id] = own
    return tuple(pairs.items())


def check_batch(batch: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> None:
    """A batch of ``(id, after)`` refused (``ValueError``, before any statement) if it names an id twice while
    some job of it has dependencies, or if its dependencies inside the batch form a cycle."""
    ids = [job_id for job_id, _after in batch]
    known = set(ids)
    if len(known) != len(ids):
        raise ValueError("a batch with dependencies must name each job once")
    inside = {job_id: [dep for dep, _policy in after if dep in known] for job_id, after in batch}
    done: set[str] = set()
    for start in ids:
        if start in done:
            continue
        path, stack = {start}, [(start, iter(inside[start]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.discard(node)
                done.add(node)
            elif child in path:
                raise ValueError(f"the batch's dependencies form a cycle through job {child!r}")
            elif child not in done:
                path.add(child)
                stack.append((child, iter(inside[child])))


def order_batch(batch: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> list[str]:
    """The batch's ids, each after the batch's jobs it depends on (``check_batch`` refused cycles)."""
    ids = {job_id for job_id, _after in batch}
    needs = {job_id: [dep for dep, _p in after if dep in ids] for job_id, after in batch}
    ordered: list[str] = []
    placed: set[str] = set()

    def place(job_id: str) -> None:
        stack = [job_id]
        while stack:
            node = stack[-1]
            waiting = [dep for dep in needs[node] if dep not in placed]
            if not waiting:
                stack.pop()
                if node not in placed:
                    placed.add(node)
                    ordered.append(node)
            else:
                stack.extend(waiting)

    for job_id, _after in batch:
        place(job_id)
    return ordered


class Arrival(NamedTuple):
    """A new job with dependencies as it is stored: its status (``waiting``, ``pending`` when every edge is met,
    ``dead`` when one failed), its count of edges not met, and each edge ``(dependency seq, policy, state)``."""

    status: str
    waits: int
    edges: tuple[tuple[int, str, str], ...]


def plan_arrival(edges: Sequence[tuple[int, str, str]]) -> Arrival:
    """A new job's edges ``(dependency seq, policy, dependency's status)``, each evaluated by ``edge_effect``."""
    states = []
    for seq, policy, status in edges:
        effect = edge_effect(policy, status)
        states.append((seq, policy, {MET: MET, FAIL: FAILED}.get(effect, OPEN)))
    waits = sum(state != MET for _seq, _policy, state in states)
    failed = any(state == FAILED for _seq, _policy, state in states)
    return Arrival(DEAD if failed else WAITING if waits else PENDING, waits, tuple(states))


class EndsPlan(NamedTuple):
    """What the ends of some dependencies do: the edges now met and failed (``(dependency, dependant)`` seqs), how
    many edges each dependant has met now (its ``waits`` drops by that much: a waiting one reaching 0 goes pending),
    and the dependants that end dead (reason ``dependency``, if still waiting). Seqs in ascending order: the order in
    which a store takes their row locks."""

    met: list[tuple[int, int]]
    failed: list[tuple[int, int]]
    decrements: list[tuple[int, int]]
    kills: list[int]


def plan_ends(ends: Mapping[int, str], edges: Iterable[tuple[int, int, str]]) -> EndsPlan:
    """What ``ends`` (seq → the status it ended in: done or dead) do to their open edges ``(dependency, dependant,
    policy)``."""
    met: list[tuple[int, int]] = []
    failed: list[tuple[int, int]] = []
    for dependency, dependant, policy in edges:
        effect = edge_effect(policy, ends[dependency])
        if effect == MET:
            met.append((dependency, dependant))
        elif effect == FAIL:
            failed.append((dependency, dependant))
    counts = Counter(dependant for _dependency, dependant in met)
    return EndsPlan(
        sorted(met), sorted(failed), sorted(counts.items()), sorted({dependant for _d, dependant in failed})
    )


class Rearm(NamedTuple):
    """A redriven dependant: the dependencies whose edges are met now, and its count of edges not met after (it is
    redriven ``waiting`` if that is more than 0, else ``pending``)."""

    met: list[int]
    waits: int


def plan_redrive(job_id: str, edges: Iterable[tuple[int, str, str, str, str | None]], awaits_group: bool) -> Rearm:
    """A dead dependant redriven: each edge not met ``(dependency seq, dependency id, policy, state, dependency's
    status)`` evaluated again (a dependency removed since, status ``None``, holds it back no more). ``ValueError``
    (the redrive changes nothing) if one would fail again at once: its dependency is dead under policy ``dead``, so
    redrive that first. ``awaits_group``: it is the callback of a group
    not complete yet, which counts as one edge not met."""
    met: list[int] = []
    waits = int(awaits_group)
    for seq, dependency, policy, _state, status in edges:
        if status is None:  # removed by prune or retention: it ended long ago, and nothing waits for it any more
            met.append(seq)
            continue
        effect = edge_effect(policy, status)
        if effect == FAIL:
            raise ValueError(
                f"job {job_id!r} depends on {dependency!r}, which is dead (on_dependency_dead='dead'): redrive it first"
            )
        if effect == MET:
            met.append(seq)
        else:
            waits += 1
    return Rearm(met, waits)


class Ripple:
    """What the ends settled in one transaction moved on: how many jobs went pending (dependants whose last
    dependency was met, callbacks whose group completed), so that a store wakes its waiting workers."""

    __slots__ = ("released",)

    def __init__(self) -> None:
        self.released = 0


@dataclass(frozen=True)
class DependencyState:
    """One dependency of a job as its edge stands: the dependency's id and status (``None``: removed by prune or
    retention after the job stopped needing it), the edge's policy and state (open, met, failed)."""

    id: str
    status: str | None
    on_dead: str
    state: str


@dataclass(frozen=True)
class WaitsFor:
    """What a job waits for: its dependencies (every edge, met or not) and the group it is the callback of."""

    id: str
    dependencies: tuple[DependencyState, ...]
    group: str | None = None

    @property
    def unmet(self) -> tuple[DependencyState, ...]:
        """The dependencies whose edges are not met."""
        return tuple(each for each in self.dependencies if each.state != MET)
