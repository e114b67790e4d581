"""The status page's sections for dependencies and groups: the jobs waiting and what each waits for, and the groups
with their progress (``asyncq.web.page`` renders the rest)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from asyncq.core.dependencies import WaitsFor
from asyncq.core.groups import Group
from asyncq.core.jobs import Job
from asyncq.web.page import _cells, _table, utc


def waits_text(waits: WaitsFor | None) -> str:
    """``a (leased), b (pending)``: what a job waits for now (its edges not met; ``group G`` for a callback)."""
    if waits is None:
        return ""
    parts = [f"{each.id} ({each.status or 'removed'}{', ' + each.state if each.state != 'open' else ''})"
             for each in waits.unmet]  # fmt: skip
    if waits.group is not None:
        parts.append(f"group {waits.group}")
    return ", ".join(parts)


def render_waiting(jobs: Sequence[Job], waits: Mapping[str, WaitsFor]) -> str:
    """The jobs waiting for dependencies (or their group), oldest first, with what each still waits for."""
    rows = []
    for job in jobs:
        values = (job.id, job.queue, job.priority, job.waits, waits_text(waits.get(job.id)), utc(job.deadline))
        rows.append(f"<tr>{_cells(values, (2, 3))}</tr>")
    headers = ("job", "queue", "priority", "unmet", "waits for", "deadline")
    return _table("waiting", headers, rows, "no job waits for another")


def render_groups(groups: Sequence[Group]) -> str:
    """Groups with their progress: members, done, dead, still running; sealed, complete, the callback's status."""
    rows = []
    for group in groups:
        state = "complete" if group.complete else "sealed" if group.sealed else "open"
        values = (group.name, state, group.members, group.done, group.dead, group.running, utc(group.created_at),
                  utc(group.completed_at), group.callback_id or "", group.callback_status or "")  # fmt: skip
        rows.append(f"<tr>{_cells(values, (2, 3, 4, 5))}</tr>")
    headers = ("group", "state", "members", "done", "dead", "running", "created", "completed", "callback", "status")
    return _table("groups", headers, rows, "no groups")


def render_graphs(waiting: Sequence[Job], waits: Mapping[str, WaitsFor], groups: Sequence[Group]) -> str:
    """Both sections, with their headings."""
    return f"<h2>Waiting jobs</h2>{render_waiting(waiting, waits)}<h2>Groups</h2>{render_groups(groups)}"
