"""The Nightjar site: ``python3 app.py [--host 127.0.0.1] [--port 8080]`` (loopback unless told otherwise).

Registering commits the registration and its outbox message in one SQLite transaction, then wakes the
outbox relay that runs beside the site and publishes the message with publisher confirms. Saving a
registration is not issuing a ticket: the page says "Your ticket is being prepared" until the worker has
written one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from aiohttp import web

import broker
import pages
import store
from relay import OutboxRelay
from settings import Settings

SETTINGS = web.AppKey("settings", Settings)
RELAY = web.AppKey("relay", OutboxRelay)
MAX_NAME = 100
MAX_TICKET_NO = 2**63 - 1  # SQLite's largest INTEGER: a longer number names no ticket
T = TypeVar("T")


def html(text: str, status: int = 200) -> web.Response:
    """An HTML response."""
    return web.Response(text=text, status=status, content_type="text/html")


async def query(request: web.Request, operation: Callable[..., T], *args: Any) -> T:
    """Read the store in a thread, on a read-only connection: a page works while a worker holds a write
    transaction (paused inside it, say)."""
    return await asyncio.to_thread(store.read, request.app[SETTINGS].db_path, operation, *args)


async def change(request: web.Request, operation: Callable[..., T], *args: Any) -> T:
    """Write to the store in a thread (waiting up to ``store.BUSY_TIMEOUT`` for another writer)."""
    return await asyncio.to_thread(store.write, request.app[SETTINGS].db_path, operation, *args)


def ticket_number(request: web.Request) -> int | None:
    """The ticket number in the path, or ``None`` when it is too large to name a ticket."""
    number = int(request.match_info["no"])
    return number if number <= MAX_TICKET_NO else None


async def static_page(request: web.Request) -> web.Response:
    """The pages without data."""
    return html({"/": pages.home, "/explore": pages.explore, "/visit": pages.visit}[request.path]())


async def evening(request: web.Request) -> web.Response:
    """The workshop page with the form."""
    return html(pages.evening())


async def register(request: web.Request) -> web.Response:
    """Store a registration (and its outbox message), then show its page."""
    form = await request.post()
    name = " ".join(str(form.get("name", "")).split())
    if not name or len(name) > MAX_NAME:
        return html(pages.evening(f"Please enter a guest name of 1 to {MAX_NAME} characters.", name), 400)
    try:
        registration_id = await change(request, store.register, name)
    except sqlite3.OperationalError as exc:
        if not store.is_busy(exc):
            raise
        busy = "The desk is busy (a worker holds the store's write transaction). Please register again shortly."
        return html(pages.evening(busy, name), 503)
    request.app[RELAY].wake()
    raise web.HTTPSeeOther(f"/registrations/{registration_id}")


async def registration_list(request: web.Request) -> web.Response:
    """Your registrations."""
    return html(pages.registration_list(await query(request, store.registrations)))


async def registration(request: web.Request) -> web.Response:
    """One registration and its ticket state."""
    item = await query(request, store.registration, request.match_info["id"])
    if item is None:
        return html(pages.not_found("There is no such registration."), 404)
    return html(pages.registration_page(item))


async def ticket(request: web.Request) -> web.Response:
    """One ticket."""
    number = ticket_number(request)
    item = None if number is None else await query(request, store.ticket, number)
    if item is None:
        return html(pages.not_found("There is no such ticket."), 404)
    return html(pages.ticket_page(item))


async def download(request: web.Request) -> web.Response:
    """The ticket as a text file."""
    number = ticket_number(request)
    item = None if number is None else await query(request, store.ticket, number)
    if item is None:
        return html(pages.not_found("There is no such ticket."), 404)
    headers = {"Content-Disposition": f'attachment; filename="nightjar-ticket-{item.registration_id}.txt"'}
    return web.Response(text=pages.ticket_text(item), content_type="text/plain", headers=headers)


async def run_relay(app: web.Application) -> AsyncIterator[None]:
    """Run the outbox relay for as long as the site runs."""
    relay = app[RELAY]
    task = asyncio.create_task(relay.run_forever())
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await relay.transport.close()


def make_app(settings: Settings) -> web.Application:
    """The site, its store created (with Mina Patel's registration) if it is new, and its relay."""
    store.connect(settings.db_path).close()
    app = web.Application()
    app[SETTINGS] = settings
    app[RELAY] = OutboxRelay(settings.db_path, broker.transport(settings))
    app.cleanup_ctx.append(run_relay)
    app.router.add_get("/", static_page)
    app.router.add_get("/explore", static_page)
    app.router.add_get("/visit", static_page)
    app.router.add_get("/evening", evening)
    app.router.add_post("/registrations", register)
    app.router.add_get("/registrations", registration_list)
    app.router.add_get("/registrations/{id}", registration)
    app.router.add_get(r"/tickets/{no:\d+}", ticket)
    app.router.add_get(r"/tickets/{no:\d+}/download", download)
    return app


async def serve(host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM; print the address once listening (port 0 picks a free one)."""
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    runner = web.AppRunner(make_app(Settings.from_env()))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    print(f"Nightjar is open at http://{host}:{bound_port}/", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    broker.quiet_connect_errors()  # the relay logs its own line for a broker it cannot reach
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
