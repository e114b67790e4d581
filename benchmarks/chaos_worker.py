"""A chaos worker process: an ``asyncq.Pool`` delivering over HTTP (``HttpTransport`` + ``deliver_with``).

    python benchmarks/chaos_worker.py --store sqlite --queue Q --url URL --owner W --events FILE [...]

runs ``Pool.serve`` until SIGTERM (the harness forks it from a fork server instead: ``forked_main``). What
the checker cannot read from the stores afterwards is appended to ``--events`` (shared by all workers, opened
``O_APPEND``), one ``os.write`` per line, so every line is in the kernel before the step it records goes on,
and survives the SIGKILL of this process:

- ``S <job id> <token> <owner>`` when a handler starts a delivery, before its request is sent;
- ``F <job id> <token> <owner> <error type>`` when a delivery fails (the receiver down, an error answer);
- ``X <owner>`` for each finish the queue rejected as stale, ``L <owner>`` for each lease lost.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_store import open_queue

from asyncq import HttpTransport, Pool, deliver_with
from asyncq.worker.pool import PoolSettings


class EventLog:
    """Appends one line per event with a single ``write`` on an ``O_APPEND`` descriptor."""

    def __init__(self, path: str, owner: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.owner = owner

    def write(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


class StartLogged:
    """A transport that records each delivery's start (and failure) in the event log, delivering through
    ``inner``."""

    def __init__(self, inner: HttpTransport, events: EventLog) -> None:
        self.inner = inner
        self.events = events

    async def deliver(self, job_id: str, body: Any, headers: Mapping[str, str]) -> None:
        token = headers["Asyncq-Token"]
        self.events.write(f"S {job_id} {token} {self.events.owner}")
        try:
            await self.inner.deliver(job_id, body, headers)
        except Exception as error:
            self.events.write(f"F {job_id} {token} {self.events.owner} {type(error).__name__}")
            raise

    async def close(self) -> None:
        await self.inner.close()


class LoggingObserver:
    """A pool observer that records stale finishes and lost leases in the event log."""

    def __init__(self, events: EventLog) -> None:
        self.events = events

    def on_claimed(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str, status: str | None) -> None:
        if status is None:
            self.events.write(f"X {self.events.owner}")

    def on_delivery(self, seconds: float, outcome: str) -> None:
        pass

    def on_lease_lost(self) -> None:
        self.events.write(f"L {self.events.owner}")

    def on_store_busy(self) -> None:
        pass


async def work(args: argparse.Namespace) -> None:
    """Serve a pool on the queue until SIGTERM."""
    events = EventLog(args.events, args.owner)
    transport = StartLogged(HttpTransport(args.url, timeout=args.delivery_timeout), events)
    settings = PoolSettings(
        concurrency=args.concurrency, owner=args.owner, lease=args.lease_ms / 1000, poll_max=args.poll_max
    )
    try:
        # The open waits out a store that is busy or (PostgreSQL) not up yet, as a running pool does.
        pool = await Pool.open(lambda: open_queue(args.store, args.queue), settings, observer=LoggingObserver(events))
    except BaseException:
        await transport.close()
        raise
    try:
        pool.register("default", deliver_with(transport))
        await pool.serve(grace=2.0)
    finally:
        await transport.close()
        await pool.queue.close()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--queue", required=True, help="the store's location (a file for SQLite)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease-ms", type=int, default=1000)
    parser.add_argument("--poll-max", type=float, default=0.2)
    parser.add_argument("--delivery-timeout", type=float, default=5.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(work(args))


def forked_main(argv: list[str], stderr_path: str, harness_pid: int) -> None:
    """``main`` in a process forked by the harness's fork server (``chaos_fleet``): stderr to ``stderr_path``,
    and a SIGTERM to itself once the harness is gone, so no worker outlives a killed run (the fork server
    itself lives as long as any worker it forked: each holds its liveness pipe)."""
    errors = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(errors, 2)
    os.close(errors)
    threading.Thread(target=stop_when_gone, args=(harness_pid,), daemon=True).start()
    main(argv)


def stop_when_gone(pid: int, every: float = 0.5) -> None:
    """Send this process SIGTERM once process ``pid`` no longer exists."""
    while True:
        time.sleep(every)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGTERM)
            return


if __name__ == "__main__":
    main()
