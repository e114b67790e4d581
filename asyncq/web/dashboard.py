"""The status page (``asyncq dashboard --db PATH``), on loopback by default.

One server-rendered page (``asyncq.web.page``): jobs by status, queue depth over time (an inline SVG
chart of samples taken in the background into a ring buffer), dead jobs with their reasons and last errors,
the redrive audit log, the queues' settings, the schedules with their skipped ticks and the leases in flight. It
reloads itself every few seconds, except while the operator types.

Everything goes through the ``Queue`` facade. Reads use one queue opened read-only for the app's life. The one
write, a redrive, opens the existing queue (``Queue.open_existing``) and goes through ``Queue.redrive`` (the rules
live there, once): ``POST /redrive`` with the job id, a note and the token printed at start-up, compared in
constant time; a wrong or missing token is ``403`` and changes nothing. The token never appears in the page, so
another site cannot forge the form, and the ``Host`` header must be a loopback name (against DNS rebinding)
unless the server was started with ``allow_remote``. ``GET /stats.json`` gives the counts and the samples to
scripts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from aiohttp import web

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.values import check_identifier, check_note
from asyncq.errors import StoreError
from asyncq.queue import Queue
from asyncq.web.page import Sample, Snapshot, render_message, render_page
from asyncq.web.serving import serve

log = logging.getLogger("asyncq.web.dashboard")

LIST_LIMIT = 100
READ_TIMEOUT = 5.0
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


async def read_snapshot(queue: Queue, limit: int = LIST_LIMIT) -> Snapshot:
    """Counts, the newest dead jobs (each with its errors), the newest audit rows, the leases in flight, the queues'
    stored settings and the newest moves on queues, the limits in force with what they hold, the schedules and their
    newest skipped ticks."""
    stats = await queue.stats()
    listed = await queue.list_jobs(status="dead", newest=True, limit=limit, body=False)
    dead = [job for job in [await queue.get(found.id) for found in listed] if job is not None]
    leases = await queue.list_jobs(status="leased", limit=limit, body=False)
    leases.sort(key=lambda job: job.lease_until or 0)
    settings, moves = await queue.queue_settings(), await queue.queue_audit(limit=limit)
    rules, audit, limits = await queue.retention_rules(), await queue.audit_log(limit), await queue.limits()
    schedules, skipped = await queue.schedules(), await queue.schedule_events(limit=limit, skipped_only=True)
    waiting = await queue.list_jobs(status="waiting", limit=limit, body=False)
    waits, groups = (
        await queue.waiting_for([job.id for job in waiting]),
        await queue.groups(open_only=True, limit=limit),
    )
    return Snapshot(stats, dead, audit, leases, queues=settings, queue_moves=moves, retention=rules,
                    limits=limits, schedules=schedules, skipped_ticks=skipped, waiting=waiting, waits=waits,
                    groups=groups)  # fmt: skip


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine only."""
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def html_response(text: str, status: int = 200, *, nonce: str | None = None) -> web.Response:
    """An HTML page that may run no script but the one carrying ``nonce``, and may not be framed."""
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    policy = f"default-src 'none'; style-src 'unsafe-inline'; script-src {script}; form-action 'self'; "
    headers = SECURITY_HEADERS | {"Content-Security-Policy": policy + "frame-ancestors 'none'; base-uri 'none'"}
    return web.Response(text=text, status=status, content_type="text/html", headers=headers)


class Dashboard:
    """The page's state: the queue file, the token, the reader queue, and the recent depth samples."""

    def __init__(
        self, path: str, token: str, clock: Clock, *, sample_seconds: float, refresh_seconds: float, history: int
    ) -> None:
        if type(token) is not str or not token:
            raise ValueError("token must be a non-empty str")
        self.path = path
        self.token = token
        self.clock = clock
        self.sample_seconds = sample_seconds
        self.refresh_seconds = refresh_seconds
        self.samples: collections.deque[Sample] = collections.deque(maxlen=history)
        self._reader: Queue | None = None

    @property
    def reader(self) -> Queue:
        """The read-only queue every page reads through (open while the app runs)."""
        if self._reader is None:
            raise RuntimeError("the dashboard app is not running")
        return self._reader

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """A ``cleanup_ctx`` entry: open the queue read-only (``StoreError`` if it is not one), sample until
        cleanup."""
        self._reader = await Queue.open(self.path, read_only=True, clock=self.clock, busy_timeout=READ_TIMEOUT)
        sampler = asyncio.create_task(self.sample_forever())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await self._reader.close()
            self._reader = None

    async def sample_once(self) -> Sample:
        """Read the counts now and keep them for the chart."""
        stats = await self.reader.stats()
        sample = Sample(stats.now_ms, dict(stats.by_status))
        self.samples.append(sample)
        return sample

    async def sample_forever(self) -> None:
        """``sample_once`` every ``sample_seconds``; a failed read is logged and skipped."""
        while True:
            try:
                await self.sample_once()
            except Exception as error:  # a locked or vanished file: the next sample tries again
                log.warning("dashboard: cannot sample %s: %s", self.path, error)
            await asyncio.sleep(self.sample_seconds)

    async def page(self, request: web.Request) -> web.Response:
        """``GET /``: the status page."""
        try:
            found = await read_snapshot(self.reader)
        except Exception as error:  # the store's failure is the page's message, not a 500
            log.warning("dashboard: cannot read %s: %s", self.path, error)
            return html_response(render_message("Cannot read the queue", str(error)), 503)
        found = replace(found, samples=list(self.samples))
        nonce = secrets.token_urlsafe(16)
        text = render_page(self.path, found, refresh_seconds=self.refresh_seconds, nonce=nonce)
        return html_response(text, nonce=nonce)

    async def stats_json(self, request: web.Request) -> web.Response:
        """``GET /stats.json``: the counts now and the samples, for scripts."""
        try:
            stats = await self.reader.stats()
        except Exception as error:
            return web.json_response({"error": str(error)}, status=503, headers=SECURITY_HEADERS)
        samples = [{"at_ms": sample.at_ms, **sample.counts} for sample in self.samples]
        body = {"now_ms": stats.now_ms, "by_status": stats.by_status, "dead_by_reason": stats.dead_by_reason}
        body |= {"oldest_ready_age_ms": stats.oldest_ready_age_ms, "samples": samples}
        return web.json_response(body, headers=SECURITY_HEADERS)

    async def redrive(self, request: web.Request) -> web.Response:
        """``POST /redrive`` (``job``, ``note``, ``token``): re-arm a dead job, then back to the page (303)."""
        form = await request.post()
        given = form.get("token")
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
            log.warning("dashboard: redrive refused: wrong or missing token")
            return html_response(render_message("Refused", "wrong or missing token: nothing changed"), 403)
        try:
            job_id, note = check_identifier(form.get("job"), "job"), check_note(form.get("note"))
        except ValueError as error:
            return html_response(render_message("Not redriven", f"{error}: nothing changed"), 400)
        try:
            async with await Queue.open_existing(self.path, clock=self.clock, busy_timeout=READ_TIMEOUT) as queue:
                await queue.redrive(job_id, note)
        except StoreError as error:
            return html_response(render_message("Not redriven", f"{error}: nothing changed"), 503)
        except ValueError as error:
            return html_response(render_message("Not redriven", f"{error}: nothing changed"), 409)
        except Exception as error:  # a locked file: nothing was written
            log.warning("dashboard: redrive of %s failed: %s", job_id, error)
            return html_response(render_message("Not redriven", f"{error}: nothing changed"), 503)
        log.info("dashboard: job %s redriven, note %s", job_id, note)
        raise web.HTTPSeeOther("/", headers=SECURITY_HEADERS)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def loopback_hosts_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a request whose ``Host`` is not a loopback name: a page of another site, its name rebound
    to 127.0.0.1 (DNS rebinding), must not read the dashboard."""
    try:
        host = request.url.host
    except ValueError:
        host = None
    if not is_loopback(host):
        return html_response(render_message("Refused", "this dashboard answers loopback host names only"), 403)
    return await handler(request)


DASHBOARD_KEY = web.AppKey("asyncq_dashboard", Dashboard)


def make_dashboard_app(
    path: str | os.PathLike[str],
    *,
    token: str,
    clock: Clock | None = None,
    sample_seconds: float = 2.0,
    refresh_seconds: float = 5.0,
    history: int = 300,
    allow_remote: bool = False,
) -> web.Application:
    """The dashboard for the queue file at ``path`` (which must exist), its redrives guarded by ``token``.

    ``clock`` (epoch ms) times the samples, the page and the redrives; ``history`` samples are kept."""
    dashboard = Dashboard(
        os.fspath(path),
        token,
        clock or wall_clock_ms,
        sample_seconds=sample_seconds,
        refresh_seconds=refresh_seconds,
        history=history,
    )
    app = web.Application(client_max_size=64 * 1024, middlewares=[] if allow_remote else [loopback_hosts_only])
    app[DASHBOARD_KEY] = dashboard
    app.add_routes(
        [
            web.get("/", dashboard.page),
            web.get("/stats.json", dashboard.stats_json),
            web.post("/redrive", dashboard.redrive),
        ]
    )
    app.cleanup_ctx.append(dashboard.lifecycle)
    return app


async def serve_dashboard(
    path: str | os.PathLike[str],
    *,
    host: str,
    port: int,
    token: str,
    ready: Callable[[str], object],
    allow_remote: bool = False,
    sample_seconds: float = 2.0,
    refresh_seconds: float = 5.0,
) -> None:
    """Serve the dashboard of the queue at ``path`` on ``host:port`` until SIGINT or SIGTERM; ``ready`` gets its
    URL once listening. ``StoreError`` (nothing served) if ``path`` is not a queue."""
    app = make_dashboard_app(
        path, token=token, sample_seconds=sample_seconds, refresh_seconds=refresh_seconds, allow_remote=allow_remote
    )
    await serve(app, host, port, "/", ready)
