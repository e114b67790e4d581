"""The Groups screen (``docs/dependencies.md``): every group by name (or the open ones only) with its progress (its
members, done, dead and running, sealed, completed) and its callback's status; and a group's page: its facts and its
members, filtered by status and paged by ``seq``, with the bulk actions of the Jobs screen on the ticked ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from asyncq.core.groups import Group, check_group_name
from asyncq.core.jobs import Job
from asyncq.core.lifecycle import STATUSES
from asyncq.core.operations import JOB_ACTIONS
from asyncq.core.search import JobQuery, Order
from asyncq.core.values import check_choice
from asyncq.web.console import forms
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

#: Groups (or a group's members) a page lists.
PAGE = 50


async def page(ctx: Ctx) -> Response:
    found = await values(ctx)
    return ctx.render("groups.html", 400 if found["error"] else 200, **found)


async def values(ctx: Ctx) -> dict[str, Any]:
    """A page of groups by name after ``?after=`` (the open ones only with ``?open=1``)."""
    queue, get = ctx.console.queue, ctx.request.arg
    open_only, after, error = get("open") == "1", get("after") or "", None
    groups: list[Group] = []
    try:
        groups = await queue.groups(open_only=open_only, after=after, limit=PAGE + 1)
    except ValueError as refused:
        error = str(refused)
    kept = [("open", "1")] if open_only else []
    more = groups[PAGE - 1].name if len(groups) > PAGE else None
    return {
        "groups": groups[:PAGE],
        "open_only": open_only,
        "error": error,
        "open_count": await queue.open_groups(),
        "next_url": None if more is None else ctx.request.url("/groups") + "?" + urlencode([*kept, ("after", more)]),
        "first_url": ctx.request.url("/groups") + ("?open=1" if open_only else "") if after else None,
    }


async def group_page(ctx: Ctx) -> Response:
    found = await group_values(ctx)
    if found["group"] is None and not found["error"]:
        return ctx.message("No such group", f"no group {found['name']}", 404)
    return ctx.render("group.html", 400 if found["error"] else 200, **found)


async def group_values(ctx: Ctx) -> dict[str, Any]:
    """One group (``/groups/NAME``, or ``?name=`` for its live region) and a page of its members."""
    queue, get = ctx.console.queue, ctx.request.arg
    name = ctx.params.get("name") or get("name") or ""
    group, members, error = None, [], None
    status, after = get("status"), get("after")
    try:
        check_group_name(name)
        if status is not None:
            check_choice(status, "status", STATUSES)
        start = 0 if after is None else forms.whole(after, "after")
        group = await queue.group(name)
        members = await queue.group_members(name, status=status, after=start, limit=PAGE + 1) if group else []
        members = await _with_errors(ctx, members)
    except ValueError as refused:
        error = str(refused)
    return {
        "name": name,
        "group": group,
        "members": members[:PAGE],
        "member_status": status or "",
        "statuses": STATUSES,
        "error": error,
        "next_url": _next_url(ctx, name, status, members),
        "bulk_actions": [action for action in JOB_ACTIONS if ctx.identity.may(action)],
    }


async def _with_errors(ctx: Ctx, members: list[Job]) -> list[Job]:
    """The members as a search shows them: each with its newest error (read by their ids, in ``seq`` order)."""
    if not members:
        return members
    ids = tuple(job.id for job in members)
    found = await ctx.console.search(JobQuery(ids=ids), order=Order.OLDEST, page=len(ids), scan=len(ids))
    return found.jobs


def _next_url(ctx: Ctx, name: str, status: str | None, members: list[Job]) -> str | None:
    if len(members) <= PAGE:
        return None
    kept = [("status", status)] if status else []
    return ctx.request.url(f"/groups/{name}") + "?" + urlencode([*kept, ("after", str(members[PAGE - 1].seq))])
