"""A producer process for the unique-key tests: enqueues one job per unique key, all at once with its siblings.

    python tests/unique_children.py --store QUEUE --name P --keys K

opens the store (a SQLite path or a ``postgresql://`` URL), prints ``ready``, waits for a line on stdin (the test
writes it to every child once all are ready: they start together), then enqueues job ``P-k<i>`` with unique key
``k<i>`` for each ``i`` in an order of its own, one enqueue each, and prints ``{job id: result}`` as one JSON
line (``true``: inserted; a ``str``: the holder's id).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


async def produce(args: argparse.Namespace) -> dict[str, object]:
    from asyncq.queue import Queue

    keys = [f"k{i}" for i in range(args.keys)]
    random.Random(args.name).shuffle(keys)
    async with await Queue.open(args.store) as queue:
        print("ready", flush=True)
        sys.stdin.readline()
        results: dict[str, object] = {}
        for key in keys:
            job_id = f"{args.name}-{key}"
            results[job_id] = await queue.enqueue(job_id, {"key": key}, unique_key=key)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="unique_children.py")
    parser.add_argument("--store", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--keys", type=int, required=True)
    print(json.dumps(asyncio.run(produce(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
