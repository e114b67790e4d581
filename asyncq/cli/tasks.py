"""``asyncq worker MODULE:APP``: run an app's tasks (``asyncq.App``) on the queue file, until a signal or, with
``--burst``, until nothing is ready and nothing runs; print the pool's counters."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from typing import Any

from asyncq.cli import output as out
from asyncq.cli.commands import Report, report
from asyncq.cli.errors import CliError, UsageError
from asyncq.cli.work import load_object, open_pool, pool_settings, serve_showing_progress
from asyncq.tasks.app import App


def load_app(spec: str) -> App:
    """The ``App`` named by ``module:attribute`` (the working directory is importable)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise UsageError(f"the app must be module:attribute, got {spec!r}")
    app = load_object(spec, module_name, name, "app")
    if not isinstance(app, App):
        raise CliError(f"{spec} is not an asyncq.App but a {type(app).__name__}")
    if not app.tasks:
        raise CliError(f"the app {spec} has no tasks")
    return app


async def worker(args: argparse.Namespace) -> Report:
    """Work the app's queues with a pool (graceful stop on SIGINT or SIGTERM)."""
    app = load_app(args.app)
    settings = pool_settings(args)
    started = time.monotonic()
    pool = await open_pool(args, settings)
    async with pool.queue:
        app.attach(pool, queues=args.queue)
        await serve_showing_progress(pool, args)
    data: dict[str, Any] = {"path": args.db, "owner": pool.owner, "queues": list(args.queue or app.queues)}
    data |= asdict(pool.counters) | {"seconds": round(time.monotonic() - started, 3)}
    return report(data, out.render_work)
