"""``ConsoleApp``: the operator's console, one object whatever serves it (``adapters``: an aiohttp sub-app, an ASGI
app, ``asyncq dashboard``). It holds the queue (its own, opened from a path or URL, or the app's), the facade it
reads and acts through (``asyncq.queue.console.OperatorConsole``), the sampler, the templates and the sessions;
``handle`` answers one ``Request``: the host check, the session and identity, CSRF on every change, the route."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncq.errors import StoreError
from asyncq.queue import Queue
from asyncq.queue.console import OperatorConsole
from asyncq.web.console import views
from asyncq.web.console.auth import Identity, Session, Sessions, resolve
from asyncq.web.console.http import Request, Response, match
from asyncq.web.console.rendering import environment, is_loopback
from asyncq.web.console.settings import ConsoleSettings

log = logging.getLogger("asyncq.web.console")

#: What a console is given: an open ``Queue`` (the app's: never closed by the console), a callable returning one
#: when the console starts (an app that opens its queue in its own lifespan), or a path or URL the console opens.
Target = Queue | Callable[[], Queue] | str | os.PathLike[str]
READ_TIMEOUT = 5.0


@dataclass
class Ctx:
    """One request being answered: the app, the request, who sent it, their session, the route's path values."""

    app: ConsoleApp
    request: Request
    identity: Identity
    session: Session
    params: dict[str, Any] = field(default_factory=dict)
    cookies: list[str] = field(default_factory=list)

    @property
    def console(self) -> OperatorConsole:
        return self.app.console

    @property
    def csrf(self) -> str:
        return self.app.sessions.csrf_token(self.session)

    def values(self, **more: Any) -> dict[str, Any]:
        """What every template sees."""
        return {
            "ctx": self, "request": self.request, "identity": self.identity, "csrf": self.csrf,
            "url": self.request.url, "screens": views.SCREENS, "settings": self.app.settings,
            "now_ms": self.console.queue.now(), "location": self.console.queue.path, **more,
        }  # fmt: skip

    def render(self, template: str, status: int = 200, **values: Any) -> Response:
        text = self.app.templates.get_template(template).render(self.values(**values))
        return Response(status, text.encode(), cookies=self.cookies)

    def render_block(self, template: str, block: str, **values: Any) -> str:
        """One block of a template (a live screen's region), rendered alone."""
        found = self.app.templates.get_template(template)
        context = found.new_context(self.values(**values))
        return "".join(found.blocks[block](context))

    def message(self, title: str, text: str, status: int, **more: Any) -> Response:
        """A short page saying what happened (a refusal says that nothing changed)."""
        return self.render("message.html", status, title=title, message=text, **more)


class ConsoleApp:
    """The console over one queue (see the module's docstring). ``async with`` (or ``start``/``close``) runs its
    sampler; ``handle`` starts it on first use when nobody did."""

    def __init__(self, target: Target, settings: ConsoleSettings | None = None) -> None:
        if not (isinstance(target, Queue | str | os.PathLike) or callable(target)):
            raise TypeError(f"a console needs a Queue, a callable returning one, or a path or URL, not {target!r}")
        self.settings = (settings or ConsoleSettings()).checked()
        self.sessions = Sessions(self.settings.secret)
        self.templates = environment()
        self._target = target
        self._console: OperatorConsole | None = None
        self._owned: Queue | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self.sampled = asyncio.Event()  # set (and replaced) when this console wrote a sample
        self.stopping = asyncio.Event()  # set when the server stops: live streams end

    @property
    def console(self) -> OperatorConsole:
        if self._console is None:
            raise RuntimeError("the console has not started")
        return self._console

    async def start(self) -> None:
        """Open the queue (a path or URL: an existing queue, ``StoreError`` otherwise) and start sampling."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._console is not None:
                return
            queue = await self._open()
            self._console = OperatorConsole(queue)
            self.stopping = asyncio.Event()
            if self.settings.sample_ms is not None:
                self._sampler = asyncio.create_task(self._sample_forever(), name="asyncq-console-sampler")

    async def _open(self) -> Queue:
        target = self._target
        if isinstance(target, Queue):
            return target
        if isinstance(target, str | os.PathLike):
            self._owned = await Queue.open_existing(target, busy_timeout=READ_TIMEOUT)
            return self._owned
        found = target()
        if not isinstance(found, Queue):
            raise TypeError(f"the console's target returned {type(found).__name__}, not a Queue")
        return found

    def stop_streams(self) -> None:
        """End every live stream (a server stopping: it waits for its handlers)."""
        self.stopping.set()

    async def close(self) -> None:
        """End the live streams, stop sampling, and close the queue if the console opened it."""
        self.stop_streams()
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._owned is not None:
            await self._owned.close()
            self._owned = None
        self._console = None

    async def __aenter__(self) -> ConsoleApp:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def sample_once(self) -> bool:
        """Take one sample now (``False``: another console took one less than half an interval ago)."""
        every = self.settings.sample_ms or 10_000
        written = await self.console.sample(every, self.settings.keep_ms)
        if written:
            done, self.sampled = self.sampled, asyncio.Event()
            done.set()
        return written

    async def _sample_forever(self) -> None:
        """``sample_once`` every ``sample_seconds``; a failure is logged and the next sample tries again."""
        assert self.settings.sample_seconds is not None
        while True:
            try:
                await self.sample_once()
            except Exception as error:  # a busy or restarting store: the next sample tries again
                log.warning("console: cannot sample %s: %s", self.console.queue.path, error)
            await asyncio.sleep(self.settings.sample_seconds)

    # -- answering ------------------------------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        """Answer one request (never raises for what a request holds: a refusal or failure is a page)."""
        if not self.settings.allow_remote and not is_loopback(request.host):
            return Response(403, b"this console answers loopback host names only", "text/plain; charset=utf-8")
        try:
            await self.start()
        except (StoreError, OSError) as error:
            return Response(503, f"cannot open the queue: {error}".encode(), "text/plain; charset=utf-8")
        now_s = self.console.queue.now() // 1000  # sessions expire by the queue's (injected) clock
        session = self.sessions.read(request, now_s)
        cookies = []
        if session is None:
            session = self.sessions.new(now_s)
            cookies.append(self.sessions.cookie(session, request))
        ctx = Ctx(self, request, await resolve(self.settings.resolver, request, session), session, cookies=cookies)
        response = await self._dispatch(ctx)
        response.cookies = [*ctx.cookies, *(c for c in response.cookies if c not in ctx.cookies)]
        return response

    async def _dispatch(self, ctx: Ctx) -> Response:
        request = ctx.request
        found = match(views.ROUTES, request.method, request.path)
        if found is None:
            return ctx.message("Not found", f"nothing at {request.path}", 404)
        if found == "method":
            return ctx.message("Not allowed", f"{request.method} is not allowed here", 405)
        assert not isinstance(found, str)
        route, params = found
        ctx.params = params
        if request.method == "POST":
            refused = self.sessions.csrf_refusal(request, ctx.session)
            if refused is not None:
                log.warning("console: %s %s refused: %s", request.method, request.path, refused)
                return ctx.message("Refused", f"{refused}: nothing changed", 403)
        if ctx.identity.role is None and route.handler not in views.OPEN:
            return views.sign_in_first(ctx)
        try:
            return await route.handler(ctx)
        except StoreError as error:  # busy, restarting, read-only: nothing changed
            log.warning("console: %s %s: %s", request.method, request.path, error)
            return ctx.message("The store is not available", f"{error}: nothing changed", 503)
        except Exception:  # a fault of the console's own: logged whole, the page says only that
            log.exception("console: %s %s failed", request.method, request.path)
            return Response(500, b"the console failed to answer: see its log", "text/plain; charset=utf-8")
