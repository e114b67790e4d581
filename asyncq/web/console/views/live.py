"""Live screens: each screen's live region (a block ``live`` of its template, holding no field the operator types
in) re-rendered and sent when it changed, by server-sent events (``GET /events?view=…``), or fetched by the
browser's polling when those fail (``GET /fragment/VIEW``). The overview is sent again as soon as this console
writes a sample; the others are looked at every ``refresh_seconds``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from asyncq.errors import StoreError
from asyncq.web.console.http import Response
from asyncq.web.console.views import audit, dead, groups, job, jobs, overview, schedules, workers

if TYPE_CHECKING:
    from asyncq.web.console.app import Ctx

log = logging.getLogger("asyncq.web.console")

Values = Callable[["Ctx"], Awaitable[dict[str, Any]]]
#: Each live view: its template (whose ``live`` block is the region) and what it shows.
VIEWS: dict[str, tuple[str, Values]] = {
    "overview": ("overview.html", overview.values),
    "jobs": ("jobs.html", jobs.values),
    "job": ("job.html", job.values),
    "dead": ("dead.html", dead.values),
    "schedules": ("schedules.html", schedules.values),
    "groups": ("groups.html", groups.values),
    "group": ("group.html", groups.group_values),
    "workers": ("workers.html", workers.values),
    "audit": ("audit.html", audit.values),
}
#: How long one event stream lasts; the browser then opens another (EventSource reconnects by itself).
STREAM_SECONDS = 600
HEARTBEAT_SECONDS = 15


async def render_live(ctx: Ctx, view: str) -> str:
    template, values = VIEWS[view]
    return ctx.render_block(template, "live", **await values(ctx))


async def fragment(ctx: Ctx) -> Response:
    """``GET /fragment/VIEW``: the view's live region now (the polling fallback)."""
    view = ctx.params["view"]
    if view not in VIEWS:
        return Response(404, b"no such view", "text/plain; charset=utf-8")
    return Response(200, (await render_live(ctx, view)).encode(), cookies=ctx.cookies)


async def events(ctx: Ctx) -> Response:
    """``GET /events?view=VIEW&…``: the view's live region each time it changes, as server-sent events."""
    view = ctx.request.arg("view") or ""
    if view not in VIEWS:
        return Response(400, b"view must name a live screen", "text/plain; charset=utf-8")
    headers = {"X-Accel-Buffering": "no"}
    return Response(200, content_type="text/event-stream", headers=headers, stream=_stream(ctx, view))


def event(name: str, data: str) -> bytes:
    """One server-sent event (a line of data each line of ``data``)."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {name}\n{lines}\n".encode()


async def _stream(ctx: Ctx, view: str) -> AsyncIterator[bytes]:
    """The view's region each time it changed; an empty chunk at every look (the adapter checks then whether the
    browser is still there), a comment now and then (proxies keep the stream open); until the console stops."""
    yield b"retry: 2000\n\n"
    last, quiet_since, ends = None, time.monotonic(), time.monotonic() + STREAM_SECONDS
    while time.monotonic() < ends and not ctx.app.stopping.is_set():
        try:
            html = await render_live(ctx, view)
        except (StoreError, OSError) as error:  # a busy store: try again at the next look
            log.warning("console: live %s: %s", view, error)
            html = None
        if html is not None and html != last:
            yield event("update", html)
            last, quiet_since = html, time.monotonic()
        elif time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
            yield b": still here\n\n"
            quiet_since = time.monotonic()
        else:
            yield b""
        await _next_look(ctx, view)


async def _next_look(ctx: Ctx, view: str) -> None:
    """Until the next look: ``refresh_seconds``, or for the overview this console's next sample if sooner; at once
    when the console stops."""
    waits = [asyncio.ensure_future(ctx.app.stopping.wait())]
    if view == "overview":
        waits.append(asyncio.ensure_future(ctx.app.sampled.wait()))
    try:
        await asyncio.wait(waits, timeout=ctx.app.settings.refresh_seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
