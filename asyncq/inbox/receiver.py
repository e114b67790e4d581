"""The receiver side: an aiohttp endpoint that applies each event's effect once, with its inbox row, in its store.

``POST /events`` (the path is configurable) takes a JSON body. The event's id is the ``Idempotency-Key``
header if sent (the body is then any JSON value; an ``id`` in an object body must equal it), else the
``id`` of a JSON object body. Ids are identifiers (1-64 ASCII letters, digits, ``_``, ``-``).

=================================  ======  ==============================================================
request                            status  body, and what changes
=================================  ======  ==============================================================
new id                             200     ``{"id", "status": "applied"}``: effect and inbox row committed
same id, same canonical body       200     ``{"id", "status": "duplicate"}``: the same ACK; no effect,
                                           the row's ``duplicates`` counter goes up
same id, other body                409     ``{"id", "status": "conflict"}``: the row's ``conflicts`` goes up
not UTF-8 JSON, no or bad id, …    400     ``{"error"}``: nothing changes
body over ``max_body_bytes``       413     ``{"error"}``: nothing changes (Content-Length checked first)
the effect raises ``Permanent``    422     ``{"id", "status": "refused", "error"}``: rolled back
the effect or SQLite fails         500     ``{"id", "status": "failed"}``: rolled back, the sender retries
=================================  ======  ==============================================================

"Same body" means the same canonical JSON (sorted keys, compact separators, ASCII escapes): key order and
whitespace do not matter, ``1`` and ``1.0`` differ. ``GET /events/stats`` shows the counters.

Effects: ``effect(tx, event_id, body)`` runs synchronously inside the event's write transaction, in the store's
writer thread; ``tx`` is an ``EffectTransaction`` (``tx.execute(statement, parameters)`` returns the rows), so the
app's rows and the inbox row commit together. ``add_to_stock`` (``asyncq.inbox.stock``) is the example.

Durability: the store's (SQLite: asyncq's ``full`` level, WAL with ``synchronous=FULL``, as ``Queue`` opens its
files; PostgreSQL: ``synchronous_commit=on``), and the ACK goes out only after the commit returned, so an
acknowledged effect survives a power loss. On PostgreSQL, receivers on several hosts can share one inbox: an id is
still applied once (``asyncq.store.postgres.inbox``).

Group commit: requests that arrive while a transaction is being written wait for the next one, which
records all of them, each on its own (a failing effect rolls back only its own event). Under load one
fsync serves many requests; alone, a request still gets its own commit at once. The store's rules are
``asyncq.store.port.inbox``'s; on SQLite one thread owns the only connection, so concurrent requests queue in
memory, in arrival order, instead of contending in SQLite's busy handler.

Counters: the table is the durable record (rows = applied, ``sum(duplicates)``, ``sum(conflicts)``);
:attr:`Inbox.counters` also counts, since start, rejected (400/413) and failed requests, which leave no row.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from asyncq.core.clock import wall_clock_ms
from asyncq.core.jsontext import canonical_json, loads_strict
from asyncq.core.values import check_identifier, check_int, check_time
from asyncq.errors import Conflict, Permanent
from asyncq.inbox.stock import STOCK_TABLES, add_to_stock
from asyncq.store.opening import open_inbox_store, read_inbox_totals, store_target
from asyncq.store.port.inbox import InboxEffect as Effect
from asyncq.store.port.inbox import InboxEvent, InboxResult, InboxStore
from asyncq.web.serving import serve

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 65536


@dataclass
class InboxCounters:
    """Requests seen since this process started (the table holds the durable counts)."""

    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    rejected: int = 0
    failed: int = 0
    #: Transactions written (each one fsync): ``applied + duplicates`` over this is the group commit's size.
    commits: int = 0


class Inbox:
    """The durable receiver state: an inbox store (on SQLite, one file and one writer thread owning its only
    connection; on PostgreSQL, ``db`` is a ``postgresql://`` URL and its schema holds the inbox) and the group
    commit in front of it.

    ``ddl`` adds the effect's own ``CREATE … IF NOT EXISTS`` statements, run with the inbox's on open.
    Use as ``async with Inbox(db, effect=…) as inbox:`` or call :meth:`open` and :meth:`close`.
    """

    def __init__(
        self,
        db: object,
        *,
        effect: Effect | None = None,
        ddl: Iterable[str] = (),
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.db = store_target(db, "db")
        if effect is not None and not callable(effect):
            raise ValueError("effect must be None or callable")
        self.effect = effect
        self.counters = InboxCounters()
        self._ddl = tuple(ddl)
        self._clock = clock
        self._store: InboxStore | None = None
        self._waiting: list[tuple[InboxEvent, asyncio.Future[InboxResult]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Open the store (tables created if missing, rows kept)."""
        if self._store is not None:
            raise RuntimeError("the inbox is already open")
        self._store = await open_inbox_store(self.db, ddl=self._ddl)

    async def close(self) -> None:
        """Close the store, after the writes already queued."""
        store = self._store
        if store is None:
            return
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        self._store = None
        await store.close()

    async def __aenter__(self) -> Inbox:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def receive(self, event_id: str, body: Any) -> str:
        """Apply ``body`` under ``event_id`` once: ``'applied'`` or ``'duplicate'``; ``Conflict`` for the
        same id with another body. ``ValueError`` (bad id, body not strict JSON) before any change; an
        effect's exception rolls everything back and propagates."""
        event = InboxEvent(check_identifier(event_id, "event_id"), canonical_json(body), body)
        future: asyncio.Future[InboxResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((event, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting())
        outcome = await future
        if isinstance(outcome, Exception):
            self.counters.failed += 1
            raise outcome
        if outcome == "conflict":
            self.counters.conflicts += 1
            raise Conflict(f"event {event_id} was already received with another body")
        if outcome == "applied":
            self.counters.applied += 1
        else:
            self.counters.duplicates += 1
        return outcome

    async def totals(self) -> dict[str, int]:
        """The durable counts from the table: ``applied`` rows, ``duplicates`` and ``conflicts``."""
        return asdict(await self._opened().totals())

    async def _write_waiting(self) -> None:
        """Commit everything waiting, batch after batch, until nothing waits (the group commit)."""
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                results = await self._record([event for event, _future in batch])
                self.counters.commits += 1
            except Exception as error:  # the whole transaction failed: every event in it gets the error
                results = [error] * len(batch)
            except BaseException:
                for _event, future in batch:
                    future.cancel()
                raise
            for (_event, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    async def _record(self, events: list[InboxEvent]) -> list[InboxResult]:
        store = self._opened()
        return await store.record(events, check_time(self._clock(), "clock()"), self.effect)

    def _opened(self) -> InboxStore:
        if self._store is None:
            raise RuntimeError("the inbox is not open")
        return self._store


# --- HTTP --------------------------------------------------------------------------------------------------------


class BodyTooLarge(Exception):
    """The request body is over the cap (413)."""


async def read_body(request: web.Request, cap: int) -> bytes:
    """The request body, refused (``BodyTooLarge``) by its Content-Length or while reading at most cap+1."""
    if request.content_length is not None and request.content_length > cap:
        raise BodyTooLarge(f"the body announces {request.content_length} bytes, more than {cap}")
    received = bytearray()
    while len(received) <= cap:
        chunk = await request.content.read(cap + 1 - len(received))
        if not chunk:
            break
        received += chunk
    if len(received) > cap:
        raise BodyTooLarge(f"the body is over {cap} bytes")
    return bytes(received)


def parse_event(raw: bytes, idempotency_keys: Sequence[str]) -> tuple[str, Any]:
    """``(event_id, body)`` from a request body and its ``Idempotency-Key`` headers; ``ValueError`` if the
    body is not strict UTF-8 JSON, or no valid id can be found, or the header and the body's id differ."""
    if len(idempotency_keys) > 1:
        raise ValueError("more than one Idempotency-Key header")
    try:
        body = loads_strict(raw)
        canonical_json(body)
    except RecursionError:
        raise ValueError("the body nests too deeply") from None
    except ValueError as exc:
        raise ValueError(f"the body is not strict UTF-8 JSON: {exc}") from None
    has_id = type(body) is dict and "id" in body
    body_id = check_identifier(body["id"], "id") if has_id else None
    if not idempotency_keys:
        if body_id is None:
            raise ValueError("the body must be a JSON object with an id (or send an Idempotency-Key header)")
        return body_id, body
    key = check_identifier(idempotency_keys[0], "Idempotency-Key")
    if body_id is not None and body_id != key:
        raise ValueError("the body's id and the Idempotency-Key header differ")
    return key, body


class _InboxHandler:
    def __init__(self, inbox: Inbox, max_body_bytes: int) -> None:
        self.inbox = inbox
        self.max_body_bytes = check_int(max_body_bytes, "max_body_bytes", 1, 64 * 1024 * 1024)

    async def post(self, request: web.Request) -> web.Response:
        try:
            raw = await read_body(request, self.max_body_bytes)
            event_id, body = parse_event(raw, request.headers.getall("Idempotency-Key", []))
        except BodyTooLarge as exc:
            self.inbox.counters.rejected += 1
            return web.json_response({"error": str(exc)}, status=413)
        except ValueError as exc:
            self.inbox.counters.rejected += 1
            return web.json_response({"error": str(exc)}, status=400)
        try:
            status = await self.inbox.receive(event_id, body)
        except Conflict:
            return web.json_response({"id": event_id, "status": "conflict"}, status=409)
        except Permanent as exc:
            return web.json_response({"id": event_id, "status": "refused", "error": str(exc)}, status=422)
        except Exception:
            log.exception("inbox: event %s failed and was rolled back", event_id)
            return web.json_response({"id": event_id, "status": "failed"}, status=500)
        return web.json_response({"id": event_id, "status": status})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"since_start": asdict(self.inbox.counters), "table": await self.inbox.totals()})


def inbox_routes(inbox: Inbox, *, path: str = "/events", max_body_bytes: int = MAX_BODY_BYTES) -> list[web.RouteDef]:
    """``POST path`` (the receiver) and ``GET path/stats`` (the counters), to add to an app that opens and
    closes ``inbox`` itself (for instance with :func:`inbox_lifecycle` in ``app.cleanup_ctx``)."""
    if type(path) is not str or not path.startswith("/"):
        raise ValueError("path must be a str starting with '/'")
    handler = _InboxHandler(inbox, max_body_bytes)
    return [web.post(path, handler.post), web.get(path.rstrip("/") + "/stats", handler.stats)]


def inbox_lifecycle(inbox: Inbox) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry: opens ``inbox`` on startup, closes it on cleanup."""

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with inbox:
            yield

    return lifecycle


INBOX_KEY = web.AppKey("asyncq_inbox", Inbox)


def make_inbox_app(
    db: object,
    *,
    effect: Effect | None = None,
    ddl: Iterable[str] = (),
    path: str = "/events",
    max_body_bytes: int = MAX_BODY_BYTES,
    clock: Callable[[], int] = wall_clock_ms,
) -> web.Application:
    """A ready app: the inbox on ``db`` (at ``app[INBOX_KEY]``), its routes, opened and closed with the app."""
    inbox = Inbox(db, effect=effect, ddl=ddl, clock=clock)
    app = web.Application()
    app[INBOX_KEY] = inbox
    app.add_routes(inbox_routes(inbox, path=path, max_body_bytes=max_body_bytes))
    app.cleanup_ctx.append(inbox_lifecycle(inbox))
    return app


# --- standalone: python -m asyncq.inbox --------------------------------------------------------------------------

EFFECTS: dict[str, tuple[Effect | None, tuple[str, ...]]] = {"none": (None, ()), "stock": (add_to_stock, STOCK_TABLES)}


def spawn(db: object, *, effect: str = "none", env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m asyncq.inbox`` on ``db`` in a child process on a free loopback port; returns the process
    and the URL it printed. The caller stops it (SIGTERM stops it cleanly)."""
    command = [sys.executable, "-m", "asyncq.inbox", "--db", store_target(db, "db"), "--effect", effect]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http://"):
        process.kill()
        process.wait()
        raise RuntimeError(f"the inbox receiver did not start (it said {url!r})")
    return process, url


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asyncq.inbox --db PATH [--host H] [--port P]``: prints the URL first, then serves."""
    parser = argparse.ArgumentParser(prog="python -m asyncq.inbox", description="Run an asyncq inbox receiver.")
    parser.add_argument("--db", required=True, help="the SQLite file (created if missing) or a postgresql:// URL")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: any free port)")
    parser.add_argument("--path", default="/events", help="the receiver's path (default /events)")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    parser.add_argument("--effect", choices=sorted(EFFECTS), default="none", help="'stock' adds qty to stock")
    args = parser.parse_args(argv)
    effect, ddl = EFFECTS[args.effect]
    app = make_inbox_app(args.db, effect=effect, ddl=ddl, path=args.path, max_body_bytes=args.max_body_bytes)
    asyncio.run(serve(app, args.host, args.port, args.path, lambda url: print(url, flush=True)))
    return 0


async def read_totals(path: str, timeout: float) -> dict[str, int]:
    """A receiver's durable counts (``applied`` rows, ``duplicates``, ``conflicts``) read from its store (a file
    or a ``postgresql://`` URL) without an ``Inbox``: read-only, so nothing is created or changed; ``StoreError`` if
    ``path`` is missing or not an inbox. (For ``asyncq status --inbox``.)"""
    totals = await read_inbox_totals(path, timeout=timeout)
    return {"applied": totals.applied, "duplicates": totals.duplicates, "conflicts": totals.conflicts}


if __name__ == "__main__":
    sys.exit(main())
