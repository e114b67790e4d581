"""The Jobs screen: every job findable by status, queue, priority, dead reason, error type, a time range and a body
path, paged by cursor, newest or oldest first (or one queue's pending jobs by when they are due); the page says
which filters the index serves and which are checked on the rows it yields, and when the cap on those rows was
reached. A bulk action is previewed on the selected jobs or on everything the filter finds (``actions``). The task
filter joins the form once jobs carry their task (``FILTER_FIELDS``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from asyncq.core.lifecycle import DEAD_REASONS, STATUSES
from asyncq.core.operations import ACTION_ROLES, JOB_ACTIONS
from asyncq.core.search import JobPage, JobQuery, Order
from asyncq.web.console import forms
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx


async def page(ctx: Ctx) -> Response:
    found = await values(ctx)
    return ctx.render("jobs.html", 400 if found["error"] else 200, **found)


async def values(ctx: Ctx) -> dict[str, Any]:
    """The filter as given, and its page of jobs (or why the filter is refused)."""
    get = ctx.request.arg
    error, result = None, None
    query, order = JobQuery(), Order.NEWEST
    try:
        query = forms.job_query(get)
        default = Order.DUE if query.status == "pending" and query.queue and not query.ids else Order.NEWEST
        order = forms.order(get("order"), default)
        size = ctx.app.settings.page_size
        result = await ctx.console.search(
            query, order=order, cursor=get("cursor"), page=size, scan=ctx.app.settings.scan
        )
    except ValueError as refused:
        error = str(refused)
    return {
        "query": query,
        "order": order,
        "result": result,
        "error": error,
        "fields": forms.filter_fields(query),
        "given": {name: get(name) or "" for name in (*forms.FILTER_FIELDS, "order")},
        "statuses": STATUSES,
        "reasons": DEAD_REASONS,
        "orders": tuple(Order),
        "bulk_actions": [action for action in JOB_ACTIONS if ctx.identity.may(action)],
        "action_roles": ACTION_ROLES,
        "queues": await known_queues(ctx),
        "next_url": _next_url(ctx, result),
        "first_url": _page_url(ctx, None),
    }


async def known_queues(ctx: Ctx) -> list[str]:
    """The queues of the newest sample and of the stored settings (for the filter's suggestions)."""
    queue = ctx.console.queue
    samples = await ctx.console.samples(queue.now() - 3_600_000)
    names = {figures.queue for figures in samples[-1].queues} if samples else set()
    return sorted(names | {each.queue for each in await queue.queue_settings()})


def _next_url(ctx: Ctx, result: JobPage | None) -> str | None:
    if result is None or result.next is None:
        return None
    return _page_url(ctx, result.next)


def _page_url(ctx: Ctx, cursor: str | None) -> str:
    """This search's page at ``cursor`` (``None``: its first page)."""
    query = ctx.request.query
    kept = [(name, values[0]) for name, values in query.items() if name not in ("cursor", "view") and values]
    return ctx.request.url("/jobs") + "?" + urlencode(kept + ([("cursor", cursor)] if cursor else []))
