"""The small aiohttp serving helper the dashboard and the inbox receiver run on: serve an app until a signal."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aiohttp import web


async def serve(app: web.Application, host: str, port: int, path: str, ready: Callable[[str], object]) -> None:
    """Serve ``app`` on ``host:port`` until SIGTERM or SIGINT; ``ready`` gets the bound URL (with ``path``) once
    listening. The app's startup (its ``cleanup_ctx``) runs first: if it fails, the error propagates and nothing
    listens."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        ready(f"http://{shown}:{bound_port}{path}")
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
