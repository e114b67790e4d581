"""A worker process for the schedule tests (``tests/test_schedule_processes.py``), on a clock of its own.

    python tests/schedule_children.py --store QUEUE --log RUNS --every 0.2 --overlap skip --work 0.5 \
        [--offset-ms N] [--jump-after S --jump-ms M] [--hold]

Worker mode: runs an ``App`` whose one task ``beat`` is ``@app.periodic(every=…, overlap=…)`` in a pool whose queue
clock is the wall clock plus ``--offset-ms`` (plus ``--jump-ms`` once ``--jump-after`` seconds have passed: a clock
moved while it runs). Each run of ``beat`` sleeps ``--work`` seconds and appends ``{"job", "start", "end", "pid"}``
(wall time) to the ``--log`` file. Prints ``ready`` once its pool runs; stops on SIGTERM.

Hold mode (``--hold``): evaluates the schedules once with a fault hook inside the tick's transaction that prints
``in-tick`` and blocks: the test kills it there, with the transaction open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def make_clock(offset_ms: int, jump_after: float | None, jump_ms: int) -> object:
    started = time.monotonic()

    def clock() -> int:
        moved = jump_ms if jump_after is not None and time.monotonic() - started > jump_after else 0
        return time.time_ns() // 1_000_000 + offset_ms + moved

    return clock


async def work(args: argparse.Namespace) -> None:
    from asyncq import App, Queue

    app = App()

    @app.periodic(every=args.every, overlap=args.overlap)
    async def beat() -> None:
        from asyncq.tasks import current

        start = time.time()
        await asyncio.sleep(args.work)
        line = json.dumps({"job": current().job.id, "start": start, "end": time.time(), "pid": os.getpid()})
        with open(args.log, "a") as log:  # one short append per run: whole lines even with three writers
            log.write(line + "\n")

    clock = make_clock(args.offset_ms, args.jump_after, args.jump_ms)
    async with await Queue.open(args.store, clock=clock) as queue:  # type: ignore[arg-type]
        pool = app.pool(queue, poll_max=0.05, concurrency=4)
        asyncio.get_running_loop().call_later(0.05, lambda: print("ready", flush=True))
        await pool.serve(grace=10)


async def hold(args: argparse.Namespace) -> None:
    from asyncq import Queue

    def block(point: str) -> None:
        print(f"in-tick {point}", flush=True)
        time.sleep(3600)  # the test kills this process here, inside the transaction

    if args.store.startswith("postgresql://"):
        from asyncq.store.postgres import schedules
    else:
        from asyncq.store.sqlite import schedules  # type: ignore[no-redef]
    schedules.FAULT = block
    clock = make_clock(args.offset_ms, None, 0)
    async with await Queue.open(args.store, clock=clock) as queue:  # type: ignore[arg-type]
        await queue.run_schedules()
    print("no tick was due", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="schedule_children.py")
    parser.add_argument("--store", required=True)
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--overlap", default="skip")
    parser.add_argument("--work", type=float, default=0.0)
    parser.add_argument("--offset-ms", type=int, default=0)
    parser.add_argument("--jump-after", type=float, default=None)
    parser.add_argument("--jump-ms", type=int, default=0)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    asyncio.run(hold(args) if args.hold else work(args))


if __name__ == "__main__":
    main()
