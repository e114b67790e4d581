"""A Job's page: its body and result, its lease (owner, token, expiry) and cancel request, and one timeline of its
failed attempts (each with its error and traceback), its audit rows (with the operator, role and note of a
console action behind each), its group's moments and where it stands now. What it waits for (each dependency with
its status and its edge's policy and state), what waits for it, and its group (``views.graph``). The actions its
status allows, for the viewer's role, each pinned to the job as shown (a job that moved since is refused, nothing
changed); a delete is not offered for a job a graph still needs, and the page says why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncq.core.jobs import AttemptError, AuditEntry, Job
from asyncq.core.lifecycle import DEAD, DONE, LEASED, PENDING, WAITING
from asyncq.core.operations import JOB_ACTIONS, OperationEntry
from asyncq.core.search import JobQuery
from asyncq.queue.console import JobStory, Preview
from asyncq.web.console.http import Response
from asyncq.web.console.views import graph

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx


@dataclass(frozen=True)
class Event:
    """One moment of a job's timeline."""

    at_ms: int
    kind: str
    title: str
    detail: str = ""
    error: AttemptError | None = None
    audit: AuditEntry | None = None
    operation: OperationEntry | None = None


async def page(ctx: Ctx) -> Response:
    found = await values(ctx)
    if found["story"].job is None and not found["story"].history:
        return ctx.message("No such job", f"no job {found['story'].job_id} (nor any audit row of one)", 404)
    return ctx.render("job.html", **found)


async def values(ctx: Ctx) -> dict[str, Any]:
    job_id = ctx.params.get("job_id") or ctx.request.arg("id") or ""
    story = await ctx.console.story(job_id)
    found = await graph.of_job(ctx, story.job)
    previews = await _actions(ctx, story.job)
    events = timeline(story, ctx.console.queue.now(), graph.waiting_for(found))
    events += [Event(at, "group", title, detail) for at, title, detail in graph.moments(found)]
    events.sort(key=lambda event: (event.kind == "now", event.at_ms))  # where it stands now: last
    return {
        "story": story,
        "job": story.job,
        "timeline": events,
        "actions": [preview for preview in previews if preview.count == 1],
        "spared": [preview.action for preview in previews if preview.count == 0 and preview.spared_count],
        "graph": found,
    }


async def _actions(ctx: Ctx, job: Job | None) -> list[Preview]:
    """A preview of each action the job's status allows and the viewer may take: each pins the job as shown (a
    delete finds nothing, the job spared, when a graph still needs it)."""
    if job is None:
        return []
    found = []
    for action, statuses in JOB_ACTIONS.items():
        if job.status in statuses and ctx.identity.may(action):
            found.append(await ctx.console.preview(action, JobQuery(ids=(job.id,))))
    return found


def timeline(story: JobStory, now_ms: int, waiting_for: str = "") -> list[Event]:
    """The job's moments oldest first: failed attempts, audit rows, and where it stands now (a waiting job: what
    it waits for, ``waiting_for``)."""
    events = [
        Event(error.at_ms, "failed", f"attempt {error.attempt} failed", f"{error.type}: {error.message}", error=error)
        for error in (story.job.errors if story.job else ())
    ]
    for entry in story.history:
        operation = story.operations.get(entry.op_seq) if entry.op_seq is not None else None
        title = entry.action.replace("_", " ")
        events.append(Event(entry.at_ms, entry.action, title, entry.note, audit=entry, operation=operation))
    if story.job is not None:
        events.append(_now(story.job, now_ms, waiting_for))
    events.sort(key=lambda event: (event.at_ms, event.kind == "now"))
    return events


def _now(job: Job, now_ms: int, waiting_for: str) -> Event:
    if job.status == PENDING:
        due = "ready" if job.available_at <= now_ms else "due"
        return Event(job.available_at, "now", f"pending: {due}", f"attempt {job.attempts + 1} of {job.max_attempts}")
    if job.status == LEASED:
        detail = f"held by {job.owner} under token {job.token}, attempt {job.attempts} of {job.max_attempts}"
        return Event(job.lease_until or now_ms, "now", "leased until", detail)
    if job.status == DONE:
        return Event(job.available_at, "now", "done", f"after {job.attempts} attempt(s)")
    if job.status == WAITING:
        return Event(now_ms, "now", "waiting", waiting_for)
    assert job.status == DEAD
    at = job.available_at if job.reason in ("permanent", "cancelled") else min(job.deadline, now_ms)
    return Event(at, "now", f"dead: {job.reason}", f"after {job.attempts} attempt(s)")
