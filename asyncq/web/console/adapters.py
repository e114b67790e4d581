"""Two thin adapters over one ``ConsoleApp``: an aiohttp application (to serve alone, or to mount with
``app.add_subapp("/ops", …)``) and an ASGI application (to mount in FastAPI or Starlette with
``app.mount("/ops", …)``). Each only turns its server's request into a ``Request`` (path inside the console, where
it is mounted, query, form, headers) and the ``Response`` back, streaming server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web

from asyncq.web.console.app import ConsoleApp
from asyncq.web.console.http import MAX_BODY_BYTES, Request, Response, parse_form

CONSOLE_KEY = web.AppKey("asyncq_console", ConsoleApp)


# -- aiohttp ----------------------------------------------------------------------------------------------------


def aiohttp_app(console: ConsoleApp) -> web.Application:
    """The console as an aiohttp application; its startup starts the console and its cleanup closes it."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[CONSOLE_KEY] = console

    async def lifecycle(_app: web.Application) -> Any:
        await console.start()
        yield
        await console.close()

    async def handle(request: web.Request) -> web.StreamResponse:
        return await _answer_aiohttp(console, request)

    async def shutdown(_app: web.Application) -> None:
        console.stop_streams()  # before the server waits for its handlers: live streams end at once

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(shutdown)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _answer_aiohttp(console: ConsoleApp, request: web.Request) -> web.StreamResponse:
    tail = "/" + request.match_info.get("tail", "")
    root = request.path[: len(request.path) - len(tail)] if request.path.endswith(tail) else ""
    try:
        body = await request.read() if request.method == "POST" else b""
        form = parse_form(body, request.headers.get("Content-Type", ""))
    except (ValueError, web.HTTPRequestEntityTooLarge) as error:
        return web.Response(status=400, text=f"cannot read the form: {error}")
    ours = Request(
        method=request.method,
        path=tail,
        root=root,
        query={key: request.query.getall(key) for key in request.query},
        form=form,
        headers={key.lower(): value for key, value in request.headers.items()},
        host=request.host,
        scheme=request.scheme,
    )
    answer = await console.handle(ours)
    headers = answer.header_items()
    if answer.stream is None:
        response = web.Response(status=answer.status, body=answer.body)
        _set_headers(response, headers)
        return response
    streamed = web.StreamResponse(status=answer.status)
    _set_headers(streamed, headers)
    await streamed.prepare(request)
    try:
        async for chunk in answer.stream:
            if request.transport is None or request.transport.is_closing():
                break  # the browser went away
            if chunk:
                await streamed.write(chunk)
    except ConnectionResetError:  # it went away while we wrote
        pass
    return streamed


def _set_headers(response: web.StreamResponse, headers: list[tuple[str, str]]) -> None:
    for name, value in headers:
        if name.lower() == "content-type":
            response.content_type, _, charset = value.partition("; charset=")
            if charset:
                response.charset = charset
        elif name == "Set-Cookie":
            response.headers.add(name, value)
        else:
            response.headers[name] = value


# -- ASGI --------------------------------------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class AsgiConsole:
    """The console as an ASGI application. Mounted in another app (which sends no lifespan events to what it mounts)
    the console starts on its first request; close it in the app's own lifespan (``await asgi.console.close()``)."""

    def __init__(self, console: ConsoleApp) -> None:
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            raise RuntimeError(f"the console answers HTTP only, not {scope['type']}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.console.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.console.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        try:
            body = await _body(receive) if scope["method"] == "POST" else b""
            form = parse_form(body, headers.get("content-type", ""))
        except ValueError as error:
            await _send(send, Response(400, f"cannot read the form: {error}".encode(), "text/plain; charset=utf-8"))
            return
        root = scope.get("root_path", "")
        path = scope["path"]
        inside = path[len(root) :] if root and path.startswith(root) else path
        request = Request(
            method=scope["method"],
            path=inside or "/",
            root=root,
            query=parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True),
            form=form,
            headers=headers,
            host=headers.get("host"),
            scheme=scope.get("scheme", "http"),
        )
        answer = await self.console.handle(request)
        await _send(send, answer, receive)


async def _body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ValueError(f"the body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send(send: Send, answer: Response, receive: Receive | None = None) -> None:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.header_items()]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    if answer.stream is None or receive is None:
        await send({"type": "http.response.body", "body": answer.body})
        return
    gone = asyncio.create_task(_disconnected(receive))
    try:
        async for chunk in _until(answer.stream, gone):
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except OSError:  # the browser went away while we wrote
        pass
    finally:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until(stream: Any, gone: asyncio.Task[None]) -> Any:
    """The stream's chunks until it ends or the client disconnects (``gone`` done)."""
    iterator = stream.__aiter__()
    while True:
        step = asyncio.ensure_future(iterator.__anext__())
        await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gone.done() and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
            return
        try:
            yield step.result()
        except StopAsyncIteration:
            return
