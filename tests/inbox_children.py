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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncq.inbox import EffectTransaction, make_inbox_app
from asyncq.web.serving import serve

EFFECTS_DDL = {
    "postgresql": ("CREATE TABLE IF NOT EXISTS effects (id text NOT NULL)",),
    "sqlite": ("CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL)",),
}
ADD_EFFECT = {"postgresql": "INSERT INTO effects (id) VALUES ($1)", "sqlite": "INSERT INTO effects (id) VALUES (?)"}
BACKEND = {"postgresql": "SELECT pg_backend_pid()", "sqlite": "SELECT 0"}


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def effect(tx: EffectTransaction, event_id: str, body: Any) -> None:
    tx.execute(ADD_EFFECT[tx.dialect], (event_id,))
    if type(body) is dict and body.get("hang"):
        [(backend,)] = tx.execute(BACKEND[tx.dialect])
        say(in_effect=event_id, backend=backend)
        threading.Event().wait()  # until SIGKILL


def main(config: dict[str, Any]) -> None:
    dialect = "postgresql" if config["db"].startswith("postgresql://") else "sqlite"
    app = make_inbox_app(config["db"], effect=effect, ddl=EFFECTS_DDL[dialect])
    asyncio.run(serve(app, "127.0.0.1", 0, "/events", lambda url: say(url=url)))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
