"""Child processes for the storage fault tests (``test_storage_faults*.py``; their helpers: ``fault_support.py``).

A child runs as ``python tests/fault_children.py MODE CONFIG_JSON`` with the repository root on ``PYTHONPATH``,
prints one JSON object a line on stdout, and ends with ``os._exit``: a connection it left open dies with the
process as in a crash, and no aiosqlite thread left behind can hold the interpreter's exit.

Modes:

- ``fsize``: enqueue into a ``Queue`` under ``RLIMIT_FSIZE`` until a write fails, look, lift the limit, retry.
- ``inject``: every transition with an I/O error at its k-th write (``faultshim/faultshim.c``), for each k.
- ``zygote``: fork a batch writer per line on stdin (the hot-journal test SIGKILLs them); see ``write_batches``.
- ``open-enqueue``: ``Queue.open`` and one enqueue, the outcome as JSON (the read-only tests).
- ``unprivileged``: drop the capabilities that let root ignore mode bits, then exec the rest of the arguments.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fault_support import BATCH, BODY, T0, dump, write_lock_free

MAX_K = 200  # no transition here makes this many writes; reaching it is a failure


def _emit(record: dict[str, Any]) -> None:
    os.write(1, (json.dumps(record) + "\n").encode())  # one write: a line is whole even if the child is killed


def _error(exc: BaseException) -> list[Any]:
    return [type(exc).__name__, str(exc), getattr(exc, "sqlite_errorname", None)]


async def fill_until_full(config: dict[str, Any]) -> None:
    """Enqueue until a write fails under ``RLIMIT_FSIZE``; report the error, whether the rows and the write lock
    are as before, and the same call's result once the limit is lifted."""
    from asyncq import JobSpec, Queue

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    path = config["path"]
    queue = await Queue.open(path, durability=config["durability"], clock=lambda: T0)
    await queue.enqueue_many([JobSpec(f"seed-{i}", BODY) for i in range(20)])
    files = [name for name in (path, path + "-wal", path + "-journal") if os.path.exists(name)]
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max(map(os.path.getsize, files)) + 64 * 1024, hard))
    acked, failure, body = 0, None, {"pad": "y" * 1500}
    while failure is None and acked < 10_000:
        before = dump(path)
        try:
            await queue.enqueue(f"j-{acked}", body)
            acked += 1
        except sqlite3.Error as exc:
            failure = exc
    record: dict[str, Any] = {"acked": acked, "error": None if failure is None else _error(failure)}
    record |= {"unchanged": dump(path) == before, "lock_free": write_lock_free(path)}
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    record["retried"] = await queue.enqueue(f"j-{acked}", body)
    await queue.close()
    _emit(record)


def _shim() -> Any:
    shim = ctypes.CDLL(os.environ["FAULTSHIM"])  # the copy LD_PRELOAD loaded already: dlopen returns it
    shim.faultshim_arm.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int]
    shim.faultshim_failed.restype = ctypes.c_long
    return shim


async def _prepare(path: str, durability: str) -> Any:
    """A closed queue file with a dead job, a held lease (its ticket is returned) and 60 pending jobs."""
    from asyncq import JobSpec, Queue

    async with await Queue.open(path, durability=durability, clock=lambda: T0) as queue:
        await queue.enqueue("dead-1", BODY)
        [doomed] = await queue.claim("w-1")
        await queue.finish(doomed, "permanent")
        await queue.enqueue("held-1", BODY)
        [ticket] = await queue.claim("w-1", lease=60)
        await queue.enqueue_many([JobSpec(f"p-{i}", {"n": i, **BODY}) for i in range(60)])
    return ticket


def _transitions(ticket: Any) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    return {
        "enqueue": lambda q: q.enqueue("new-1", {"n": -1, **BODY}),
        "claim": lambda q: q.claim("w-2", limit=3, lease=60),
        "finish": lambda q: q.finish(ticket, "ok"),
        "extend": lambda q: q.extend(ticket, lease=120),
        "release": lambda q: q.release_many([ticket]),
        "redrive": lambda q: q.redrive("dead-1", "io-error-test"),
        "cancel": lambda q: q.cancel("p-7", "io-error-test"),
        "settle_and_claim": lambda q: q.settle_and_claim([(ticket, "ok", 0)], "w-3", [("default", 2)]),
    }


async def inject_every_k(config: dict[str, Any]) -> None:
    """For each transition and k = 1, 2, …: a fresh copy of the prepared file, the transition with the k-th
    write failing, until a k where no write failed (the transition completed). With ``sticky`` every write
    after the k-th fails too and the connection is left open (a crash); otherwise the queue carries on."""
    from asyncq import Queue

    shim, folder, sticky = _shim(), config["dir"], int(config["sticky"])
    base = os.path.join(folder, "base.db")
    ticket = await _prepare(base, config["durability"])
    left_open = []
    for name, transition in _transitions(ticket).items():
        for k in range(1, MAX_K + 1):
            path = os.path.join(folder, f"{name}-{k}.db")
            shutil.copyfile(base, path)
            queue = await Queue.open(path, durability=config["durability"], clock=lambda: T0)
            shim.faultshim_arm(os.path.realpath(path).encode(), k, sticky)
            try:
                await transition(queue)
                error = None
            except Exception as exc:
                error = _error(exc)
            failed = shim.faultshim_failed()
            shim.faultshim_disarm()
            record = {"transition": name, "k": k, "path": path, "error": error, "failed": failed}
            if sticky:
                left_open.append(queue)
            else:
                record |= {"lock_free": write_lock_free(path), "usable": (await queue.stats()).total > 0}
                await queue.close()
            _emit(record)
            if failed == 0:
                break


async def write_batches(path: str) -> None:
    """Forever: one transaction enqueues ``BATCH`` jobs with the app's row naming the batch, one claims a
    whole batch, one finishes it. Each step is announced before it starts and after it commits."""
    from asyncq import Queue

    queue = await Queue.open(path, durability="full-delete", clock=lambda: T0)
    async with queue.transaction() as tx:
        number = (await tx.execute("SELECT coalesce(max(n), 0) FROM batches"))[0][0] + 1
    while True:
        _emit({"begin": "enqueue", "batch": number})
        async with queue.transaction() as tx:
            await tx.execute("INSERT INTO batches (n) VALUES (?)", (number,))
            for i in range(BATCH):
                await tx.enqueue(f"b{number}-{i}", {"i": i, **BODY})
        _emit({"commit": "enqueue", "batch": number})
        _emit({"begin": "claim"})
        tickets = await queue.claim("writer", limit=BATCH)
        claimed = sorted({int(ticket.id[1:].split("-")[0]) for ticket in tickets})
        _emit({"commit": "claim", "batches": claimed})
        _emit({"begin": "finish", "batches": claimed})
        await queue.finish_many([(ticket, "ok", 0) for ticket in tickets])
        _emit({"commit": "finish", "batches": claimed})
        number += 1


async def _warm_up() -> None:
    """Import now what a writer's first transaction would import lazily (anyio's backend: 40 ms)."""
    from asyncq import Queue

    async with await Queue.open("warm-up.db", durability="full-delete") as queue, queue.transaction() as tx:
        await tx.execute("SELECT 1")
    os.unlink("warm-up.db")


def zygote() -> None:
    """Per line on stdin (a queue file's path), fork a ``write_batches`` child and wait for it to die; then
    report ``{"exit": pid, "status": …}``. Forking a process that has imported everything already costs a few
    ms, where a new interpreter costs 250 ms: hundreds of kills fit in seconds."""
    import asyncio

    asyncio.run(_warm_up())
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            _emit({"pid": os.getpid()})
            try:
                asyncio.run(write_batches(line.strip()))
            except BaseException as exc:  # the child must never return into the zygote's loop
                _emit({"error": _error(exc)})
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        _emit({"exit": pid, "status": status})


async def open_and_enqueue(config: dict[str, Any]) -> None:
    """``Queue.open`` and one enqueue: which step failed, how, and how long it took."""
    from asyncq import Queue
    from asyncq.errors import StoreError

    started = time.monotonic()
    record: dict[str, Any] = {"opened": False, "added": None, "error": None}
    try:
        queue = await Queue.open(config["path"], durability=config["durability"], busy_timeout=2.0)
        record["opened"] = True
        try:
            record["added"] = await queue.enqueue(config["job"], {"n": 1})
        finally:
            await queue.close()
    except (sqlite3.Error, StoreError) as exc:
        record["error"] = _error(exc)
    _emit(record | {"seconds": time.monotonic() - started})


def exec_unprivileged(argv: list[str]) -> None:
    """Drop CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER from the bounding set and exec ``argv``: root's
    new capabilities are the bounding set, so the program meets the mode bits exactly as the files' owner does."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2, 3):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
    os.execv(argv[0], argv)


def main() -> None:
    mode = sys.argv[1]
    if mode == "unprivileged":
        exec_unprivileged(sys.argv[2:])
    import asyncio  # only now: the trampoline above must start fast (asyncio alone takes 60-190 ms to import)

    try:
        if mode == "zygote":
            zygote()
        else:
            run = {"fsize": fill_until_full, "inject": inject_every_k, "open-enqueue": open_and_enqueue}[mode]
            asyncio.run(run(json.loads(sys.argv[2])))
    except BaseException as exc:
        print(f"{mode}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
