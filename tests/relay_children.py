"""Child processes for the outbox relay tests: each one opens the outbox file afresh, as a restarted relay would.

``python tests/relay_children.py MODE CONFIG_JSON`` (the repository root is put on ``sys.path`` here, so the
child imports ``asyncq`` from this checkout from any working directory). Every mode prints JSON lines:

- ``until-alarm``: a relay on a scripted clock that jumps over each backoff, ``run_once`` until the head item
  is in alarm (one line per pass), then releases the lease and exits 0;
- ``once``: one ``run_once`` on the wall clock, then the figures, then releases the lease;
- ``run``: ``Relay.run()`` on the wall clock, one line per pass, until SIGTERM (a graceful stop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncq.core.clock import wall_clock_ms
from asyncq.delivery.http import HttpTransport
from asyncq.outbox import Outbox, Relay, RelayResult
from asyncq.worker.pool import RetryPolicy

PASSES_MAX = 50


def say(kind: str, value: Any) -> None:
    print(json.dumps({"kind": kind, **dataclasses.asdict(value)}), flush=True)


class PrintingRelay(Relay):
    """A relay that prints every pass's result, so the parent can follow it."""

    async def run_once(self) -> RelayResult:
        result = await super().run_once()
        say("pass", result)
        return result


def make_relay(outbox: Outbox, transport: HttpTransport, config: dict[str, Any]) -> PrintingRelay:
    return PrintingRelay(
        outbox,
        transport,
        owner=config.get("owner"),
        lease_ms=config.get("lease_ms", 10_000),
        alarm_after=config.get("alarm_after", 5),
        retry=RetryPolicy(base=0.1, cap=1, jitter=lambda: 1.0),
        poll_ms=config.get("poll_ms", 200),
    )


async def until_alarm(config: dict[str, Any]) -> None:
    now = [wall_clock_ms()]
    async with await Outbox.open(config["db"], clock=lambda: now[0]) as outbox:
        transport = HttpTransport(config["url"], timeout=5)
        relay = make_relay(outbox, transport, config)
        try:
            for _ in range(PASSES_MAX):
                result = await relay.run_once()
                if result.stopped == "alarm":
                    break
                now[0] += result.wait_ms
        finally:
            await relay.release()
            await transport.close()


async def once(config: dict[str, Any]) -> None:
    async with await Outbox.open(config["db"]) as outbox:
        transport = HttpTransport(config["url"], timeout=5)
        relay = make_relay(outbox, transport, config)
        try:
            await relay.run_once()
            say("figures", await relay.figures())
        finally:
            await relay.release()
            await transport.close()


async def run(config: dict[str, Any]) -> None:
    async with await Outbox.open(config["db"]) as outbox:
        transport = HttpTransport(config["url"], timeout=30)
        relay = make_relay(outbox, transport, config)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, relay.stop)
        try:
            await relay.run()
        finally:
            await transport.close()


MODES = {"until-alarm": until_alarm, "once": once, "run": run}

if __name__ == "__main__":
    asyncio.run(MODES[sys.argv[1]](json.loads(sys.argv[2])))
