"""A receiver child process for the inbox tests: ``python tests/inbox_children.py CONFIG_JSON`` serves an
``asyncq.inbox`` receiver on a free loopback port and prints JSON lines: first ``{"url": …}``, then, from inside
the effect of an event whose body says ``"hang": true``, ``{"in_effect": id, "backend": pid}`` (the effect has
written its row and the server backend holding the transaction is ``pid``), after which the effect blocks until
the process is killed. Other events get the same effect without blocking. The effect's table is ``effects``
(created with the inbox's tables, in the URL's ``search_path``); ``CONFIG_JSON`` holds the inbox's ``db``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncq.inbox import EffectTransaction, make_inbox_app
from asyncq.web.serving import serve

#: The effect's table (the same text on both stores) and its row.
EFFECTS_DDL = ("CREATE TABLE IF NOT EXISTS effects (id text NOT NULL, at bigint NOT NULL)",)
ADD_EFFECT = {
    "postgresql": "INSERT INTO effects (id, at) VALUES ($1, $2)",
    "sqlite": "INSERT INTO effects (id, at) VALUES (?, ?)",
}
BACKEND = {"postgresql": "SELECT pg_backend_pid()", "sqlite": "SELECT 0"}


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def effect(tx: EffectTransaction, event_id: str, body: Any) -> None:
    tx.execute(ADD_EFFECT[tx.dialect], (event_id, time.monotonic_ns()))
    if type(body) is dict and body.get("hang"):
        [(backend,)] = tx.execute(BACKEND[tx.dialect])
        say(in_effect=event_id, backend=backend)
        threading.Event().wait()  # until SIGKILL


def main(config: dict[str, Any]) -> None:
    app = make_inbox_app(config["db"], effect=effect, ddl=EFFECTS_DDL)
    asyncio.run(serve(app, "127.0.0.1", 0, "/events", lambda url: say(url=url)))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
