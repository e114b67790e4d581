"""Signing in and out (with ``TokenRoles``), the static assets, and ``/stats.json`` for scripts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from asyncq.core.operations import MAX_ACTOR_CHARS
from asyncq.core.values import check_text
from asyncq.web.console.auth import TokenRoles
from asyncq.web.console.http import Response, redirect
from asyncq.web.console.rendering import static_file

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx


async def static(ctx: Ctx) -> Response:
    found = static_file(ctx.params["name"])
    if found is None:
        return Response(404, b"no such file", "text/plain; charset=utf-8")
    body, kind = found
    return Response(200, body, kind)


def _tokens(ctx: Ctx) -> TokenRoles | None:
    resolver = ctx.app.settings.resolver
    return resolver if isinstance(resolver, TokenRoles) else None


async def login_page(ctx: Ctx) -> Response:
    if _tokens(ctx) is None:
        return ctx.message("No sign-in here", "this console's roles come from its app (or it is read-only)", 404)
    return ctx.render("login.html", error=None)


async def login(ctx: Ctx) -> Response:
    """A token and a name: a session of the token's role, audited under that name."""
    tokens = _tokens(ctx)
    if tokens is None:
        return ctx.message("No sign-in here", "this console's roles come from its app (or it is read-only)", 404)
    role = tokens.role_of(ctx.request.field("token") or "")
    try:
        name = check_text(ctx.request.field("name"), "your name", MAX_ACTOR_CHARS)
    except ValueError as error:
        return ctx.render("login.html", 400, error=str(error))
    if role is None:
        return ctx.render("login.html", 403, error="that token opens no role")
    session = ctx.app.sessions.new(ctx.console.queue.now() // 1000, name, role)
    response = redirect(ctx.request.url("/"))
    response.cookies.append(ctx.app.sessions.cookie(session, ctx.request))
    return response


async def logout(ctx: Ctx) -> Response:
    session = ctx.app.sessions.new(ctx.console.queue.now() // 1000)
    response = redirect(ctx.request.url("/login" if _tokens(ctx) else "/"))
    response.cookies.append(ctx.app.sessions.cookie(session, ctx.request))
    return response


async def stats_json(ctx: Ctx) -> Response:
    """The counts now and the newest sample's queues, for scripts."""
    queue = ctx.console.queue
    stats = await ctx.console.totals()
    samples = await ctx.console.samples(queue.now() - 3_600_000)
    latest = samples[-1] if samples else None
    body = {
        "now_ms": stats.now_ms,
        "by_status": stats.by_status,
        "dead_by_reason": stats.dead_by_reason,
        "oldest_ready_age_ms": stats.oldest_ready_age_ms,
        "sampled_at_ms": latest.at_ms if latest else None,
        "queues": [vars(figures) for figures in latest.queues] if latest else [],
    }
    return Response(200, json.dumps(body).encode(), "application/json", cookies=ctx.cookies)
