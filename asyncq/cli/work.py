"""``asyncq work``, ``asyncq serve-inbox`` and ``asyncq dashboard``: the long-running subcommands, kept apart so
that the other commands never load aiohttp.

``work`` runs a ``Pool`` on the queue file with one handler: delivery by HTTP POST to ``--url`` (a verified
ACK, ``asyncq.delivery.http``) or an async function ``module:function`` taking ``(body, context)``. It stops
gracefully on SIGINT or SIGTERM (``Pool.serve``), or with ``--burst`` once nothing is ready and nothing runs.
Started while another process holds the write lock, it waits for it as a running pool does (``Pool.open``):
``--timeout`` is how long each store call waits before the pool's backoff, not a limit on the worker's life.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import os
import sys
import time
from dataclasses import asdict
from typing import Any, TextIO

from asyncq.cli import output as out
from asyncq.cli.commands import Report, report, writing
from asyncq.cli.errors import CliError, UsageError
from asyncq.delivery.base import Transport
from asyncq.worker.pool import Handler, Pool, deliver_with
from asyncq.worker.settings import PoolOptions, PoolSettings


def handler_name(spec: str) -> tuple[str, str]:
    """``(module, function)`` from ``module:function`` (a usage error otherwise)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise UsageError(f"--handler must be module:function, got {spec!r}")
    return module_name, name


def load_object(spec: str, module_name: str, name: str, what: str) -> Any:
    """The attribute ``name`` of module ``module_name`` (the working directory is importable); ``CliError``
    saying it cannot load ``what`` otherwise."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise CliError(f"cannot load the {what} {spec}: {error}") from None


def load_handler(spec: str) -> Handler:
    """The async function named by ``module:function`` (the working directory is importable)."""
    function = load_object(spec, *handler_name(spec), "handler")
    if not inspect.iscoroutinefunction(function):
        raise CliError(f"the handler {spec} must be an async function taking (body, context)")
    handler: Handler = function
    return handler


def http_transport(args: argparse.Namespace) -> Transport:
    """The HTTP transport for ``--url`` (a bad URL or host is a usage error)."""
    from asyncq.delivery.http import HttpTransport  # loads aiohttp, which only --url needs

    try:
        return HttpTransport(args.url, allowed_hosts=args.allow_host or None, timeout=args.delivery_timeout)
    except ValueError as error:
        raise UsageError(str(error)) from None


def pool_settings(args: argparse.Namespace) -> PoolSettings:
    """The pool's settings from ``--concurrency``, ``--owner`` and (``work``'s) ``--lease``: a flag not given
    keeps ``PoolSettings``' default, and ``PoolSettings`` checks them (a value it refuses is a usage error)."""
    options: PoolOptions = {"owner": args.owner}
    if args.concurrency is not None:
        options["concurrency"] = args.concurrency
    if getattr(args, "lease", None) is not None:
        options["lease"] = args.lease / 1000
    try:
        return PoolSettings(**options)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None


async def open_pool(args: argparse.Namespace, settings: PoolSettings) -> Pool:
    """A pool on the existing queue ``--db``, opened once another process's write lock lets it (``Pool.open``);
    logging is set up first, so that the waits are logged. The caller closes ``pool.queue``."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return await Pool.open(lambda: writing(args), settings)


async def work(args: argparse.Namespace) -> Report:
    """Run the pool until a signal (or, with ``--burst``, until the queue is drained); print its counters."""
    if args.handler:
        handler_name(args.handler)
    settings = pool_settings(args)  # checked before anything is opened
    transport = http_transport(args) if args.url else None
    started = time.monotonic()
    try:
        pool = await open_pool(args, settings)
        async with pool.queue:
            handler = deliver_with(transport) if transport is not None else load_handler(args.handler)
            for name in args.queue or ["default"]:
                pool.register(name, handler)
            await serve_showing_progress(pool, args)
    finally:
        if transport is not None:
            await transport.close()
    data: dict[str, Any] = {"path": args.db, "owner": pool.owner, "queues": list(args.queue or ["default"])}
    data |= asdict(pool.counters) | {"seconds": round(time.monotonic() - started, 3)}
    return report(data, out.render_work)


async def serve_showing_progress(pool: Pool, args: argparse.Namespace) -> None:
    """``pool.serve`` with ``--grace`` and ``--burst``, its counters redrawn on stderr if it is a terminal."""
    display = asyncio.create_task(show_progress(pool, sys.stderr)) if sys.stderr.isatty() else None
    try:
        await pool.serve(grace=args.grace, burst=args.burst)
    finally:
        if display is not None:
            display.cancel()
            sys.stderr.write("\n")


async def show_progress(pool: Pool, stream: TextIO, interval: float = 0.5) -> None:
    """Redraw the pool's counters on one terminal line every ``interval`` seconds."""
    started = time.monotonic()
    while True:
        counters = pool.counters
        done = sum(counters.finished.values())
        rate = done / max(time.monotonic() - started, 1e-9)
        stream.write(
            f"\rclaimed {counters.claimed}  finished {out.counts(dict(sorted(counters.finished.items())))}  "
            f"running {pool.running}  errors {counters.handler_errors}  {rate:.0f} jobs/s\x1b[K"
        )
        stream.flush()
        await asyncio.sleep(interval)


def serve_inbox(args: argparse.Namespace) -> int:
    """Run the inbox receiver (``python -m asyncq.inbox``) on ``--db``; it prints its URL, then serves."""
    from asyncq.inbox.receiver import main as inbox_main

    argv = ["--db", args.db, "--host", args.host, "--port", str(args.port), "--path", args.path]
    return inbox_main([*argv, "--effect", args.effect])


async def dashboard(args: argparse.Namespace) -> int:
    """Serve the operator's console on ``--host``/``--port``; print ``dashboard: URL`` and who may do what once
    listening, then serve until SIGINT or SIGTERM."""
    from asyncq.web.console import ConsoleApp, ConsoleSettings, console_aiohttp
    from asyncq.web.console.rendering import is_loopback
    from asyncq.web.serving import serve

    resolver, access = console_access(args)
    if not is_loopback(args.host) and not args.allow_remote:
        raise UsageError(f"refusing to bind {args.host}, not a loopback address (add --allow-remote to mean it)")
    if args.allow_remote and resolver is None:
        raise UsageError(f"refusing to serve {args.host} remotely without auth: give role tokens or --role-header")
    settings = ConsoleSettings(
        resolver=resolver, sample_seconds=args.sample_seconds, keep_seconds=args.keep_days * 86_400,
        refresh_seconds=args.refresh_seconds, allow_remote=args.allow_remote,
    )  # fmt: skip

    def ready(url: str) -> None:
        print(f"dashboard: {url}\naccess: {access}", flush=True)

    await serve(console_aiohttp(ConsoleApp(args.db, settings)), args.host, args.port, "/", ready)
    return 0


def console_access(args: argparse.Namespace) -> tuple[Any, str]:
    """The console's resolver from the command's options (tokens, or a proxy's headers), and a line saying it."""
    from asyncq.web.console import HeaderRoles, TokenRoles

    tokens = {}
    for role in ("read_only", "operator", "admin"):
        given = getattr(args, f"{role}_token") or os.environ.get(f"ASYNCQ_CONSOLE_{role.upper()}_TOKEN")
        if given is not None:
            tokens[role] = given
    if tokens and args.role_header:
        raise UsageError("give role tokens or --role-header, not both")
    try:
        if tokens:
            return TokenRoles(tokens), "sign in with a token for " + ", ".join(sorted(tokens))
        if args.role_header:
            headers = HeaderRoles(user_header=args.user_header, role_header=args.role_header)
            return headers, f"roles from the {args.role_header} header, actors from {args.user_header}"
    except ValueError as error:
        raise UsageError(str(error)) from None
    return None, "read-only for everyone (no role configured)"
