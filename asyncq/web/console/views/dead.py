"""The Dead screen: the dead jobs grouped by queue, reason and their newest error's type (the newest ones looked at,
at most the console's scan), each group with its jobs and a bulk redrive (or delete) of it; the newest dead jobs
with a redrive of the ones selected."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncq.core.search import JobQuery, Order
from asyncq.web.console import forms
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx


async def page(ctx: Ctx) -> Response:
    return ctx.render("dead.html", **await values(ctx))


async def values(ctx: Ctx) -> dict[str, Any]:
    queue = ctx.request.arg("queue")
    query = forms.job_query(lambda name: queue if name == "queue" else None)
    groups, looked = await ctx.console.dead_groups(query.queue, scan=ctx.app.settings.scan)
    newest = await ctx.console.search(
        JobQuery(status="dead", queue=query.queue), order=Order.NEWEST, page=ctx.app.settings.page_size
    )
    stats = await ctx.console.totals()
    return {
        "queue": query.queue,
        "groups": groups,
        "looked": looked,
        "scan": ctx.app.settings.scan,
        "newest": newest,
        "dead_total": stats.by_status.get("dead", 0),
        "by_reason": stats.dead_by_reason,
    }
