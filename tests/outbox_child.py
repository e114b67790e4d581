"""A publisher process for the outbox lab's crash tests, and the table dump those tests compare.

Run as a script: open the source file, ``dispatch`` one batch through ``send_http`` to URL, print the number
marked sent as JSON. ``--exit N --at K`` makes the ``after-delivery`` hook end the process with ``os._exit(N)`` on
its K-th call: right after a verified ACK, before ``sent`` is stored, with no ``finally`` and no close.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from pathlib import Path
from typing import Any


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (``sqlite_sequence`` included), read through an independent connection."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        names = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {name: con.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall() for name in names}
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("url")
    parser.add_argument("--exit", type=int, default=None, help="exit code for os._exit in the hook")
    parser.add_argument("--at", type=int, default=1, help="which after-delivery call exits")
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()

    from asyncq.lab.outbox import dispatch, open_source, send_http

    calls = 0

    def fault(point: str) -> None:
        nonlocal calls
        calls += 1
        if args.exit is not None and point == "after-delivery" and calls == args.at:
            os._exit(args.exit)

    con = open_source(args.source)
    try:
        marked = dispatch(con, lambda event: send_http(args.url, event, timeout=args.timeout), fault=fault)
    finally:
        con.close()
    print(json.dumps({"marked": marked}), flush=True)


if __name__ == "__main__":
    main()
