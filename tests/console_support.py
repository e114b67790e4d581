"""What the console's tests share: a queue in every state (with markup in a body, to see it escaped), a real aiohttp
server of the console on loopback port 0, and an HTTP client that keeps its session cookie and reads each form's CSRF
token the way a browser would."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from asyncq.core.dependencies import Dependency
from asyncq.core.groups import group_callback_id
from asyncq.core.jobs import JobSpec
from asyncq.core.schedules import ScheduleSpec
from asyncq.core.search import JobQuery
from asyncq.queue import Queue
from asyncq.queue.console import OperatorConsole
from asyncq.web.console import ConsoleApp, ConsoleSettings, console_aiohttp

T0 = 1_700_000_000_000
XSS = "<script>alert(1)</script>"
TOKENS = {
    "read_only": "read-token-0123456789",
    "operator": "operator-token-0123456789",
    "admin": "admin-token-0123456789",
}


async def seed(queue: Queue) -> None:
    """mail: m-pending-1, m-pending-2 (pending), m-busy (leased by worker-7, long lease), m-done (done), m-bad-1 and
    m-bad-2 (dead, permanent, a ValueError each), m-tired (dead, exhausted after a TimeoutError); web: w-1 pending
    with markup in its body, w-gone (dead, cancelled)."""
    mail = [JobSpec(job_id, {"order": n, "customer": {"id": n % 2}}, "mail", max_attempts=1 if "tired" in job_id else 3)
            for n, job_id in enumerate(["m-busy", "m-done", "m-bad-1", "m-bad-2", "m-tired", "m-pending-1",
                                        "m-pending-2"])]  # fmt: skip
    await queue.enqueue_many([*mail, JobSpec("w-1", {"html": XSS}, "web"), JobSpec("w-gone", {}, "web")])
    busy, done, bad1, bad2, tired = await queue.claim("worker-7", queue="mail", limit=5, lease=3600)
    assert busy.id == "m-busy"
    await queue.finish(done, "ok")
    for ticket in (bad1, bad2):
        await queue.finish(ticket, "permanent", error=ValueError("bad order"))
    await queue.finish(tired, "retry", error=TimeoutError("slow"))
    await queue.cancel("w-gone", "customer left")


def task(name: str, **args: Any) -> dict[str, Any]:
    """A task's body (the ``task`` column an enqueue sets from it)."""
    return {"task": name, "args": args}


async def seed_graphs(queue: Queue, clock: list[int]) -> None:
    """Schedules and graphs, ``clock`` (the queue's) ending where it started. Schedules: ``beat`` (every minute, queue
    ops: fired, then ticks skipped as its run still waits, then missed ticks), ``nightly`` (cron, paused by bob with
    markup in the note), ``gone`` (retired). Graphs: ``merge`` waiting for ``fetch-1`` (pending) and ``fetch-2``
    (done, policy run); group ``import-7`` (``row-0`` done, ``row-1`` dead, ``row-2`` and ``row-3`` pending; sealed,
    its callback waiting); group ``import-6`` complete (``old-0`` done, its callback pending). Each job a task's."""
    end = clock[0]
    clock[0] = end - 600_000
    specs = [
        ScheduleSpec("beat", task("ops.beat"), every=60, queue="ops", task="ops.beat"),
        ScheduleSpec("nightly", task("reports.nightly"), cron="0 3 * * *", tz="Europe/Berlin", queue="reports",
                     task="reports.nightly"),
        ScheduleSpec("gone", task("ops.gone"), every=3600, queue="ops", task="ops.gone"),
    ]  # fmt: skip
    await queue.declare_schedules(specs, scope=["ops", "reports"], by="deploy-41")
    await queue.declare_schedules(specs[:2], scope=["ops", "reports"], by="deploy-42")  # gone retired
    for minutes in (1, 2, 3):  # fires, then skips (its run is still pending: overlap)
        clock[0] = end - 600_000 + minutes * 60_000 + 1
        await queue.run_schedules()
    await queue.pause_schedule("nightly", note=f"ERP migration {XSS}", by="bob")
    clock[0] = end
    await queue.run_schedules()  # six ticks due at once: the newest overlaps, the others are missed
    await queue.enqueue("fetch-2", task("fetch", url="b"), queue="fetch")
    [ticket] = await queue.claim("worker-1", queue="fetch")
    await queue.finish(ticket, "ok")
    await queue.enqueue("fetch-1", task("fetch", url="a"), queue="fetch")
    await queue.enqueue("merge", task("merge", key="report-7"), after=["fetch-1", Dependency("fetch-2", "run")])
    rows = [JobSpec(f"row-{n}", task("import.row", n=n), "import", group="import-7") for n in range(4)]
    await queue.enqueue_many([*rows, JobSpec("old-0", task("import.row", n=0), "archive", group="import-6")])
    for name in ("import-7", "import-6"):
        callback = JobSpec(group_callback_id(name), task("import.summarize", batch=name), "reports")
        await queue.seal_group(name, callback=callback)
    done, dead = await queue.claim("worker-1", queue="import", limit=2)
    await queue.finish(done, "ok")
    await queue.finish(dead, "permanent", error=ValueError("bad row"))
    [old] = await queue.claim("worker-1", queue="archive")
    await queue.finish(old, "ok")


@asynccontextmanager
async def serving(
    target: Any, settings: ConsoleSettings | None = None, *, mount: str = ""
) -> AsyncIterator[tuple[str, ConsoleApp]]:
    """The console (alone, or as a sub-app at ``mount``) on a real aiohttp server on 127.0.0.1, port 0."""
    console = ConsoleApp(target, settings or ConsoleSettings(sample_seconds=None))
    app = console_aiohttp(console)
    if mount:
        outer = web.Application()
        outer.add_subapp(mount, app)
        app = outer
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}{mount}", console
    finally:
        await runner.cleanup()


@dataclass
class Page:
    status: int
    text: str
    headers: Any
    url: str

    def csrf(self) -> str:
        found = re.search(r'name="csrf(?:-token)?" (?:value|content)="([0-9a-f]{64})"', self.text)
        assert found is not None, "no CSRF token on the page"
        return found.group(1)

    def field(self, name: str, form_id: str | None = None) -> str:
        text = self.text
        if form_id is not None:
            found_form = re.search(rf'<form[^>]*id="{form_id}".*?</form>', text, re.S)
            assert found_form is not None, form_id
            text = found_form.group(0)
        found = re.search(rf'name="{name}" value="([^"]*)"', text)
        assert found is not None, name
        return found.group(1)

    def cell(self, element_id: str) -> str:
        found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', self.text)
        assert found is not None, element_id
        return found.group(1).strip()


@dataclass
class Client:
    """A browser's HTTP side: one cookie jar (``unsafe``: cookies for an IP address), no redirects followed."""

    base: str
    session: aiohttp.ClientSession = field(init=False)

    async def __aenter__(self) -> Client:
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    async def get(self, path: str, **headers: str) -> Page:
        async with self.session.get(self.base + path, headers=headers, allow_redirects=False) as response:
            return Page(response.status, await response.text(), response.headers, str(response.url))

    async def post(self, path: str, form: dict[str, str], **headers: str) -> Page:
        async with self.session.post(self.base + path, data=form, headers=headers, allow_redirects=False) as response:
            return Page(response.status, await response.text(), response.headers, str(response.url))

    async def sign_in(self, role: str, name: str = "ada") -> None:
        page = await self.get("/login")
        done = await self.post("/login", {"csrf": page.csrf(), "name": name, "token": TOKENS[role]})
        assert done.status == 303, done.text

    async def act(self, form: dict[str, str]) -> Page:
        """Preview an action, then confirm it with the count shown (``note`` given)."""
        csrf = (await self.get("/jobs")).csrf()
        preview = await self.post("/preview", {"csrf": csrf, **form})
        assert preview.status == 200, preview.text
        count = preview.field("count", "confirm")
        confirm = {"csrf": csrf, **form, "count": count, "confirm": count, "note": form.get("note", "ops-fix")}
        return await self.post("/act", confirm | {"digest": preview.field("digest", "confirm")})


def dump(path: Any) -> str:
    """A SQLite queue file's whole content, to compare before and after a refusal."""
    with closing(sqlite3.connect(path)) as con:
        return "\n".join(con.iterdump())


async def an_hour_of_work(queue: Queue, clock: list[int], minutes: int = 60) -> None:
    """A queue's last hour, sampled each minute as a running console would: orders, mail and billing (tasks' jobs)
    enqueued in waves, worked by three workers, most done, some retried after an error, a few dead; ``clock`` (the
    queue's) moves a minute a step and ends at its start plus ``minutes``. Schedules evaluated each minute (a
    heartbeat that runs, a rollup whose run waits so its ticks are skipped, then paused through the console, an
    export paused, one retired); two import groups (one complete, one under way) and a report waiting for its
    fetches. Then: billing paused, the mail queue's retention and a concurrency limit set, a burst of mail waiting, a
    few leases held."""
    from asyncq.queue.working import Attempt

    console = OperatorConsole(queue)
    errors = (ValueError("card declined"), TimeoutError("smtp timeout"), KeyError("sku-404"))
    await _declare_hour_schedules(queue)
    n = 0
    for minute in range(minutes):
        clock[0] += 1  # the minute's work just after the sample before (a sample counts what ended after it)
        await queue.run_schedules()
        if minute in (5, 40):
            await _an_import(queue, f"import-2026-12-0{4 if minute == 5 else 5}", 30 if minute == 5 else 150)
        wave = 20 + (minute * 7) % 25 + (30 if 35 <= minute <= 42 else 0)
        specs = []
        for k in range(wave):
            n += 1
            queue_name = ("orders", "mail", "billing")[k % 3]
            body = task(f"{queue_name}.{('charge', 'send', 'invoice')[k % 3]}", order=10_000 + n,
                        customer={"id": n % 97, "tier": ("gold", "free")[n % 2]})  # fmt: skip
            specs.append(JobSpec(f"{queue_name}-{n}", body, queue_name, max_attempts=3, priority=(n % 5) - 2))
        await queue.enqueue_many(specs)
        for queue_name in ("orders", "mail", "billing"):
            if 38 <= minute <= 41 and queue_name == "mail":
                continue  # a stall: mail piles up for four minutes
            tickets = await queue.claim(f"worker-{queue_name}", queue=queue_name, limit=wave // 3 + 3)
            attempts = []
            for index, ticket in enumerate(tickets):
                if (index + minute) % 11 == 0:
                    attempts.append(Attempt(ticket, "retry", 0, errors[index % 3]))
                elif (index + minute) % 29 == 0:
                    attempts.append(Attempt(ticket, "permanent", 0, errors[(index + 1) % 3]))
                else:
                    attempts.append(Attempt(ticket, "ok"))
            await queue.finish_many(attempts)
        clock[0] += 59_999
        await console.sample(60_000, 7 * 86_400_000)
        if minute == 30:  # an operator redrives the orders a missing SKU killed, through the console
            await act(console, "redrive", JobQuery(queue="orders", error_type="KeyError"), "sku catalogue fixed")
        if minute == 45:
            await act(console, "pause_schedule", None, "report DB maintenance", schedules=("rollup",))
    await act(console, "pause", None, "card processor outage INC-412", queues=("billing",))
    await queue.enqueue("fetch-us", task("reports.fetch", region="us"), queue="fetch")
    [fetched] = await queue.claim("worker-fetch", queue="fetch", limit=1)
    await queue.finish(fetched, "ok")
    await queue.enqueue("fetch-eu", task("reports.fetch", region="eu"), queue="reports")
    await queue.enqueue("merge-report", task("reports.merge", day="2026-12-05"), queue="reports",
                        after=["fetch-eu", Dependency("fetch-us", "run")])  # fmt: skip
    await queue.set_retention("mail", done=7 * 86400, cancelled=86400, by="ops")
    await queue.set_limits("mail", concurrency=8, by="ops")
    await queue.claim("worker-7f3a", queue="mail", limit=3, lease=1800)
    waiting = await queue.list_jobs(status="pending", queue="mail", limit=1)
    await queue.cancel(waiting[0].id, "customer left")


async def _declare_hour_schedules(queue: Queue) -> None:
    specs = [
        ScheduleSpec("heartbeat", task("ops.heartbeat"), every=60, queue="orders", task="ops.heartbeat"),
        ScheduleSpec("rollup", task("reports.rollup"), cron="*/15 * * * *", queue="reports", task="reports.rollup"),
        ScheduleSpec("invoice-export", task("billing.export"), cron="0 2 * * *", tz="Europe/Berlin", queue="billing",
                     task="billing.export"),
        ScheduleSpec("legacy-sync", task("ops.legacy_sync"), every=600, queue="orders", task="ops.legacy_sync"),
    ]  # fmt: skip
    scope = ["orders", "reports", "billing"]
    await queue.declare_schedules(specs, scope=scope, by="deploy-117")
    await queue.declare_schedules(specs[:3], scope=scope, by="deploy-118")  # legacy-sync retired
    await queue.pause_schedule("invoice-export", note="waiting for the ERP migration (INC-398)", by="ops")


async def _an_import(queue: Queue, name: str, rows: int) -> None:
    """A group of ``rows`` rows to import (queue orders, worked with the rest) and its callback (queue reports)."""
    members = [JobSpec(f"{name}-row-{n}", task("catalog.import_row", row=n), "orders", group=name) for n in range(rows)]
    await queue.enqueue_many(members)
    callback = JobSpec(group_callback_id(name), task("catalog.import_done", batch=name), "reports")
    await queue.seal_group(name, callback=callback)


async def act(
    console: Any,
    action: str,
    query: Any,
    note: str,
    *,
    queues: tuple[str, ...] = (),
    schedules: tuple[str, ...] = (),
    actor: str = "olga",
) -> Any:
    """Preview ``action`` and carry it out on what the preview found, as an operator does."""
    from asyncq.core.operations import OPERATOR, Operation

    preview = await console.preview(action, query, queues, schedules)
    operation = Operation(action, preview.count, preview.digest, actor, OPERATOR, note, query or JobQuery(), queues,
                          schedules=schedules)  # fmt: skip
    return await console.operate(operation)
