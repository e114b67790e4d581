"""The status page: ``python -m asyncq.web.dashboard --db PATH`` (``asyncq dashboard``), on loopback by default.

One server-rendered page (``asyncq.web.page``): jobs by status, queue depth over time (an inline SVG
chart of samples taken in the background into a ring buffer), dead jobs with their reasons, the redrive
audit log and the leases in flight. It reloads itself every few seconds, except while the operator types.

Reads open the file read-only (``asyncq.store.sqlite.admin``), in a worker thread. The one write, a redrive, goes
through ``Queue.redrive`` (the rules live there, once): ``POST /redrive`` with the job id, a note and the
token printed at start-up, compared in constant time; a wrong or missing token is ``403`` and changes
nothing. The token never appears in the page, so another site cannot forge the form, and the ``Host``
header must be a loopback name (against DNS rebinding) unless the server was started with ``--allow-remote``.
``GET /stats.json`` gives the counts and the samples to scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from asyncq.core.clock import Clock, wall_clock_ms
from asyncq.core.stats import Stats
from asyncq.core.values import check_identifier
from asyncq.inbox.receiver import serve
from asyncq.queue import Queue
from asyncq.store.sqlite.admin import CliError, list_jobs, probe_for_writing, reading, snapshot
from asyncq.store.sqlite.schema import PRODUCT
from asyncq.store.sqlite.stats import read_stats
from asyncq.web.page import Sample, Snapshot, render_message, render_page

log = logging.getLogger("asyncq.web.dashboard")

AUDIT_LOG = f"SELECT seq, id, token, at_ms, note, action, reason FROM {PRODUCT.audit} ORDER BY seq DESC LIMIT :limit"
AUDIT_COLUMNS = ("seq", "id", "token", "at_ms", "note", "action", "reason")
LIST_LIMIT = 100
READ_TIMEOUT = 5.0
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


def read_depth(path: str, now_ms: int) -> Stats:
    """The queue's counts, read-only."""
    with reading(path, READ_TIMEOUT) as (con, _file):
        return read_stats(con, PRODUCT, now_ms)


def read_snapshot(path: str, now_ms: int, limit: int = LIST_LIMIT) -> Snapshot:
    """Counts, the newest dead jobs, the newest audit rows and the leases in flight, read-only."""
    everything: dict[str, Any] = {"queue": None, "reason": None, "after": 0, "limit": limit}
    with reading(path, READ_TIMEOUT) as (con, _file):
        stats = read_stats(con, PRODUCT, now_ms)
        with snapshot(con):
            dead = list_jobs(con, everything | {"status": "dead"}, newest=True, body=True)
            leases = list_jobs(con, everything | {"status": "leased"}, newest=False, body=False)
            audit = [dict(zip(AUDIT_COLUMNS, row, strict=True)) for row in con.execute(AUDIT_LOG, {"limit": limit})]
    leases.sort(key=lambda job: int(job["lease_until"]))
    return Snapshot(stats, dead, audit, leases)


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
    """The page's state: the queue file, the token, and the recent depth samples."""

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
        self._queue: Queue | None = None

    @property
    def queue(self) -> Queue:
        """The queue redrives go through (open while the app runs)."""
        if self._queue is None:
            raise RuntimeError("the dashboard app is not running")
        return self._queue

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """A ``cleanup_ctx`` entry: open the queue (keeping the file's journal mode), sample until cleanup."""
        file = await asyncio.to_thread(probe_for_writing, self.path, READ_TIMEOUT)
        self._queue = await Queue.open(self.path, durability=file.durability, clock=self.clock)
        sampler = asyncio.create_task(self.sample_forever())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await self._queue.close()
            self._queue = None

    async def sample_once(self) -> Sample:
        """Read the counts now and keep them for the chart."""
        now = self.clock()
        stats = await asyncio.to_thread(read_depth, self.path, now)
        sample = Sample(now, dict(stats.by_status))
        self.samples.append(sample)
        return sample

    async def sample_forever(self) -> None:
        """``sample_once`` every ``sample_seconds``; a failed read is logged and skipped."""
        while True:
            try:
                await self.sample_once()
            except (sqlite3.Error, CliError) as error:
                log.warning("dashboard: cannot sample %s: %s", self.path, error)
            await asyncio.sleep(self.sample_seconds)

    async def page(self, request: web.Request) -> web.Response:
        """``GET /``: the status page."""
        try:
            found = await asyncio.to_thread(read_snapshot, self.path, self.clock())
        except (sqlite3.Error, CliError) as error:
            log.warning("dashboard: cannot read %s: %s", self.path, error)
            return html_response(render_message("Cannot read the queue", str(error)), 503)
        found = Snapshot(found.stats, found.dead_jobs, found.audit, found.leases, list(self.samples))
        nonce = secrets.token_urlsafe(16)
        text = render_page(self.path, found, refresh_seconds=self.refresh_seconds, nonce=nonce)
        return html_response(text, nonce=nonce)

    async def stats_json(self, request: web.Request) -> web.Response:
        """``GET /stats.json``: the counts now and the samples, for scripts."""
        try:
            stats = await asyncio.to_thread(read_depth, self.path, self.clock())
        except (sqlite3.Error, CliError) as error:
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
            job_id, note = check_identifier(form.get("job"), "job"), check_identifier(form.get("note"), "note")
        except ValueError as error:
            return html_response(render_message("Not redriven", f"{error}: nothing changed"), 400)
        try:
            await self.queue.redrive(job_id, note)
        except ValueError as error:
            return html_response(render_message("Not redriven", f"{error}: nothing changed"), 409)
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line of ``asyncq dashboard``."""
    parser = argparse.ArgumentParser(prog="asyncq dashboard", description="Serve a queue's status page.")
    parser.add_argument("--db", required=True, help="the queue file (must exist)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: any free port)")
    parser.add_argument("--token", default=os.environ.get("ASYNCQ_DASHBOARD_TOKEN"), help="redrive token")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host (plain HTTP!)")
    parser.add_argument("--sample-seconds", type=float, default=2.0, help="chart sampling period")
    parser.add_argument("--refresh-seconds", type=float, default=5.0, help="page reload period")
    args = parser.parse_args(argv)
    if not args.allow_remote and not is_loopback(args.host):
        parser.error(f"refusing to bind {args.host}, not a loopback address (add --allow-remote to mean it)")
    if args.token == "":
        parser.error("--token must not be empty")
    if not 0.05 <= args.sample_seconds <= 3600 or not 0.5 <= args.refresh_seconds <= 3600:
        parser.error("--sample-seconds must be 0.05-3600 and --refresh-seconds 0.5-3600")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Print ``dashboard: URL`` and ``token: TOKEN`` once listening, then serve until SIGINT or SIGTERM."""
    args = parse_args(argv)
    try:
        probe_for_writing(args.db, READ_TIMEOUT)
    except CliError as error:
        print(f"asyncq dashboard: {error}", file=sys.stderr)
        return error.code
    token = args.token or secrets.token_urlsafe(24)
    app = make_dashboard_app(
        args.db,
        token=token,
        sample_seconds=args.sample_seconds,
        refresh_seconds=args.refresh_seconds,
        allow_remote=args.allow_remote,
    )

    def ready(url: str) -> None:
        print(f"dashboard: {url}\ntoken: {token}", flush=True)

    asyncio.run(serve(app, args.host, args.port, "/", ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
