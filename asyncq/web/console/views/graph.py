"""A job's graph as its page shows it (``docs/dependencies.md``): what it waits for (each dependency with its status,
its edge's policy and state; the group it is the callback of), what waits for it (each dependant as its edge
stands), and the group it belongs to, with that group's progress and moments (sealed, completed) for the timeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncq.core.dependencies import DependencyState, WaitsFor
from asyncq.core.groups import Group
from asyncq.core.jobs import Job

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

#: Dependants a job's page lists, at most (it says when there are more).
DEPENDANTS_LISTED = 100


@dataclass(frozen=True)
class JobGraph:
    """A job's place in its graphs: ``waits`` (its dependencies and the group it is the callback of; ``None``: no
    such job), its ``dependants`` (``more``: there are others beyond them), its ``group`` (the one it is a member
    of) and the group whose callback it is (``callback_of``)."""

    waits: WaitsFor | None = None
    dependants: list[DependencyState] = field(default_factory=list)
    more: bool = False
    group: Group | None = None
    callback_of: Group | None = None

    @property
    def empty(self) -> bool:
        """A job in no graph: nothing to show."""
        dependencies = self.waits.dependencies if self.waits else ()
        return not (dependencies or self.dependants or self.group or self.callback_of)


async def of_job(ctx: Ctx, job: Job | None) -> JobGraph:
    """What ``job`` waits for, what waits for it and its groups (an empty graph for no job)."""
    if job is None:
        return JobGraph()
    queue = ctx.console.queue
    waits = await queue.waits_for(job.id)
    dependants, more = await ctx.console.dependants(job.id, DEPENDANTS_LISTED)
    group = await queue.group(job.group) if job.group else None
    callback_of = await queue.group(waits.group) if waits and waits.group else None
    return JobGraph(waits, dependants, more, group, callback_of)


def moments(found: JobGraph) -> list[tuple[int, str, str]]:
    """The moments of the job's groups for its timeline: ``(at_ms, title, detail)``."""
    found_moments = []
    for role, group in (("its group", found.group), ("the group it completes", found.callback_of)):
        if group is None:
            continue
        if group.sealed_at is not None:
            found_moments.append((group.sealed_at, f"{role} {group.name} sealed", f"{group.members} members"))
        if group.completed_at is not None:
            detail = f"{group.done} done, {group.dead} dead of {group.members}"
            found_moments.append((group.completed_at, f"{role} {group.name} completed", detail))
    return found_moments


def waiting_for(found: JobGraph) -> str:
    """What a waiting job waits for, in words (its timeline's last moment)."""
    if found.callback_of is not None:
        group = found.callback_of
        return f"for group {group.name} to complete ({group.running} of {group.members} members running)"
    unmet = [each.id for each in found.waits.unmet] if found.waits else []
    return "for " + (", ".join(unmet) if unmet else "its dependencies")
