"""The console's own small HTTP vocabulary: a request as every screen reads it, a response as every screen returns
it, and the routes. The console's handlers are written once against these; ``adapters`` turns an aiohttp request
or an ASGI scope into a ``Request`` and a ``Response`` back into the server's (two thin adapters, one set of
handlers)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from asyncq.web.console.app import ConsoleApp

#: The largest request body the console reads (its forms are small; a selection names at most 1000 ids).
MAX_BODY_BYTES = 128 * 1024
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


@dataclass(frozen=True)
class Request:
    """One request as the console's handlers see it: ``path`` inside the console (from ``/``), ``root`` where the
    console is mounted (``""`` at the top), the query and form values, lower-case header names, the cookies."""

    method: str
    path: str
    root: str = ""
    query: Mapping[str, list[str]] = field(default_factory=dict)
    form: Mapping[str, list[str]] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None
    scheme: str = "http"

    @property
    def cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(self.headers.get("cookie", ""))
        except Exception:  # a malformed Cookie header is no cookie at all
            return {}
        return {name: morsel.value for name, morsel in jar.items()}

    def arg(self, name: str) -> str | None:
        """The first query value of ``name``, stripped; ``None`` when missing or blank."""
        return _first(self.query, name)

    def field(self, name: str) -> str | None:
        """The first form value of ``name``, stripped; ``None`` when missing or blank."""
        return _first(self.form, name)

    def fields(self, name: str) -> list[str]:
        """Every non-blank form value of ``name``."""
        return [value.strip() for value in self.form.get(name, []) if value.strip()]

    def url(self, path: str) -> str:
        """``path`` (inside the console) as the browser must ask for it."""
        return self.root + path


def _first(values: Mapping[str, list[str]], name: str) -> str | None:
    found = values.get(name)
    if not found:
        return None
    text = found[0].strip()
    return text or None


def parse_form(body: bytes, content_type: str) -> dict[str, list[str]]:
    """An ``application/x-www-form-urlencoded`` body's values (``ValueError`` for another kind or bad UTF-8)."""
    if not body:
        return {}
    if content_type.split(";")[0].strip().lower() != "application/x-www-form-urlencoded":
        raise ValueError("the console takes form posts (application/x-www-form-urlencoded) only")
    return parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=2000)


@dataclass
class Response:
    """What a handler answers: a body (or a ``stream`` of chunks: server-sent events), its type, headers, and
    the cookies to set (``Set-Cookie`` values)."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    cookies: list[str] = field(default_factory=list)
    stream: AsyncIterator[bytes] | None = None

    def header_items(self) -> list[tuple[str, str]]:
        """Every header to send, the console's security headers first."""
        items = [*SECURITY_HEADERS.items(), ("Content-Type", self.content_type), *self.headers.items()]
        return items + [("Set-Cookie", cookie) for cookie in self.cookies]


def redirect(location: str, status: int = 303) -> Response:
    return Response(status, headers={"Location": location})


Handler = Callable[["ConsoleApp", Request], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    """A method and a path pattern (its named groups become the handler's ``request`` path values)."""

    method: str
    pattern: re.Pattern[str]
    handler: Callable[..., Awaitable[Response]]


def route(method: str, pattern: str, handler: Callable[..., Awaitable[Response]]) -> Route:
    return Route(method, re.compile(pattern), handler)


def match(routes: list[Route], method: str, path: str) -> tuple[Route, dict[str, Any]] | str | None:
    """The route for ``method`` and ``path`` with its path values; ``None`` if no path matches, ``"method"`` if
    one does under another method."""
    other = False
    for each in routes:
        found = each.pattern.fullmatch(path)
        if found is None:
            continue
        if each.method == method or (each.method == "GET" and method == "HEAD"):
            return each, found.groupdict()
        other = True
    return "method" if other else None
