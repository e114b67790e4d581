"""What the handlers share: the teaching pause."""

from __future__ import annotations

import sys

#: The checkpoints the lesson's handlers use, in the order a delivery reaches them.
CHECKPOINTS = ("before-write", "inside-transaction", "after-commit")

#: The checkpoints reached in this process, so that the worker can say when ``--pause NAME`` never paused.
reached: set[str] = set()


def checkpoint(pause: str | None, name: str) -> None:
    """Stop at ``name`` when ``worker.py --pause NAME`` asked for it: print ``Paused NAME.`` and wait for
    Enter (carry on) or Ctrl+C (the worker exits with status 130). Otherwise do nothing.

    A checkpoint only waits. It never simulates work or a broker event: what happens after Ctrl+C is
    what RabbitMQ and SQLite really do when a worker stops there.
    """
    reached.add(name)
    if pause != name:
        return
    print(f"Paused {name}.", flush=True)
    sys.stdin.readline()
