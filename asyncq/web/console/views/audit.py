"""The Audit screen: every console action (who, their role, why, on what filter, how many and which), searchable by
actor, action, a job or queue it named, and text in its note; beside it the moves on queues and on jobs made
elsewhere (the command line, the API), which the queue's own audit keeps. One entry's page lists all its ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from asyncq.core.operations import ACTIONS, OperationEntry
from asyncq.web.console import forms
from asyncq.web.console.http import Response

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

PAGE = 50


async def page(ctx: Ctx) -> Response:
    found = await values(ctx)
    return ctx.render("audit.html", 400 if found["error"] else 200, **found)


async def values(ctx: Ctx) -> dict[str, Any]:
    get = ctx.request.arg
    error, more = None, None
    entries: list[OperationEntry] = []
    try:
        entries, more = await ctx.console.audit(forms.audit_query(get, PAGE))
    except ValueError as refused:
        error = str(refused)
    kept = [(name, get(name) or "") for name in ("actor", "action", "subject", "text") if get(name)]
    queue = ctx.console.queue
    return {
        "entries": entries,
        "error": error,
        "given": {name: get(name) or "" for name in ("actor", "action", "subject", "text")},
        "searched": bool(kept),
        "actions": ACTIONS,
        "older_url": None if more is None else ctx.request.url("/audit") + "?" + urlencode([*kept, ("before", more)]),
        "queue_moves": await queue.queue_audit(limit=PAGE),
        "job_moves": await queue.audit_log(PAGE),
    }


async def entry_page(ctx: Ctx) -> Response:
    seq = int(ctx.params["seq"])
    found = await ctx.console.operations([seq])
    if seq not in found:
        return ctx.message("No such entry", f"no console action #{seq}", 404)
    return ctx.render("audit_entry.html", entry=found[seq])
