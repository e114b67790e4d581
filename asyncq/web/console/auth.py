"""Who may do what in the console: an ``Identity`` (the actor an audit entry names, and a role) for each request
from a resolver the app provides, the session cookie, and CSRF protection of every change.

Roles are ``core.operations``'s: ``read_only`` reads, ``operator`` also redrives, cancels, pauses, resumes and
changes priorities, ``admin`` also deletes (``ACTION_ROLES``). Resolvers:

- none given: everyone reads, as ``anonymous`` (``read_only``), and nothing can change: read-only unless a role is
  configured;
- ``TokenRoles``: a secret token per role; an operator signs in once with a token and their name (the actor their
  actions are audited under) and gets a signed session cookie; a script sends ``Authorization: Bearer TOKEN``;
- ``HeaderRoles``: a reverse proxy that authenticates people says who they are and their role in headers (only
  safe when nothing but the proxy can reach the console);
- any callable ``(Request) -> Identity | None`` (or awaitable) of the app's own.

CSRF: every visitor gets a session (a random id in an ``HttpOnly``, ``SameSite=Strict`` cookie signed with the
console's secret); every form carries a token derived from that id, and every ``POST`` without the right token,
or sent by another site (``Sec-Fetch-Site: cross-site``, or an ``Origin`` that is not this host), is refused
before anything changes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from asyncq.core.operations import MAX_ACTOR_CHARS, READ_ONLY, ROLES, may
from asyncq.core.values import check_choice, check_text
from asyncq.web.console.http import Request

SESSION_COOKIE = "asyncq_console"
SESSION_SECONDS = 12 * 3600


@dataclass(frozen=True)
class Identity:
    """Who a request comes from: ``actor`` (named in the audit), ``role`` (``None``: may not even read: sign in)."""

    actor: str
    role: str | None

    def may(self, action: str) -> bool:
        """Whether this identity may take ``action`` (``read`` for reading)."""
        return may(self.role, action)


ANONYMOUS = Identity("anonymous", READ_ONLY)
Resolver = Callable[[Request], "Identity | Awaitable[Identity | None] | None"]


@dataclass(frozen=True)
class Session:
    """A visitor's signed session: its id (what the CSRF token derives from) and, once signed in, who."""

    sid: str
    actor: str | None = None
    role: str | None = None
    expires: int = 0


class TokenRoles:
    """A secret token per role (``{"operator": "…", "admin": "…"}``; each at least 16 characters); those not signed in
    get ``anonymous`` (``None``: nothing at all, they must sign in first)."""

    def __init__(self, tokens: Mapping[str, str], *, anonymous: str | None = None) -> None:
        if not tokens:
            raise ValueError("TokenRoles needs a token for at least one role")
        for role, token in tokens.items():
            check_choice(role, "role", ROLES)
            if type(token) is not str or len(token) < 16:
                raise ValueError(f"the {role} token must be a str of at least 16 characters")
        if len(set(tokens.values())) != len(tokens):
            raise ValueError("each role needs a token of its own")
        self.tokens = dict(tokens)
        self.anonymous = None if anonymous is None else check_choice(anonymous, "anonymous", ROLES)

    def role_of(self, token: str) -> str | None:
        """The role ``token`` grants (compared in constant time), or ``None``."""
        found = None
        for role, expected in self.tokens.items():
            if hmac.compare_digest(token.encode(), expected.encode()):
                found = role
        return found

    def __call__(self, request: Request) -> Identity | None:
        given = request.headers.get("authorization", "")
        if given.lower().startswith("bearer "):
            role = self.role_of(given[7:].strip())
            return Identity(f"token:{role}", role) if role is not None else Identity("anonymous", None)
        return None if self.anonymous is None else Identity("anonymous", self.anonymous)


class HeaderRoles:
    """The identity a reverse proxy states: the actor in ``user_header`` and the role in ``role_header`` (one of the
    roles, else no access); a request without them gets ``anonymous`` (``None``: no access)."""

    def __init__(
        self, *, user_header: str = "X-Forwarded-User", role_header: str = "X-Asyncq-Role", anonymous: str | None = None
    ) -> None:
        for name in (user_header, role_header):
            if type(name) is not str or not name or not all(ch.isalnum() or ch == "-" for ch in name):
                raise ValueError(f"a header name is letters, digits and '-', not {name!r}")
        self.user_header, self.role_header = user_header.lower(), role_header.lower()
        self.anonymous = None if anonymous is None else check_choice(anonymous, "anonymous", ROLES)

    def __call__(self, request: Request) -> Identity | None:
        user = request.headers.get(self.user_header, "").strip()
        role = request.headers.get(self.role_header, "").strip()
        if not user:
            return None if self.anonymous is None else Identity("anonymous", self.anonymous)
        try:
            actor = check_text(user, "actor", MAX_ACTOR_CHARS)
        except ValueError:
            return Identity("anonymous", None)
        return Identity(actor, role if role in ROLES else None)


async def resolve(resolver: Resolver | None, request: Request, session: Session) -> Identity:
    """The request's identity: a signed-in session's, else the resolver's, else nobody (``ANONYMOUS`` with no
    resolver at all: read-only)."""
    if session.role is not None and session.actor is not None:
        return Identity(session.actor, session.role)
    if resolver is None:
        return ANONYMOUS
    found = resolver(request)
    if inspect.isawaitable(found):
        found = await found
    if found is None:
        return Identity("anonymous", None)
    if not isinstance(found, Identity):
        raise TypeError(f"the console's resolver must return an Identity or None, not {type(found).__name__}")
    return found


class Sessions:
    """Signed session cookies and the CSRF tokens derived from them, with the console's ``secret``."""

    def __init__(self, secret: bytes) -> None:
        if type(secret) is not bytes or len(secret) < 16:
            raise ValueError("the console's secret must be at least 16 bytes")
        self._secret = secret

    def _sign(self, data: bytes) -> str:
        return hmac.new(self._secret, data, hashlib.sha256).hexdigest()

    def read(self, request: Request, now_s: int) -> Session | None:
        """The request's valid session, or ``None`` (missing, forged, or expired)."""
        raw = request.cookies.get(SESSION_COOKIE, "")
        payload, _, signature = raw.rpartition(".")
        if not payload or not hmac.compare_digest(self._sign(payload.encode()), signature):
            return None
        try:
            found = json.loads(base64.urlsafe_b64decode(payload.encode() + b"=" * (-len(payload) % 4)))
            session = Session(str(found["sid"]), found.get("actor"), found.get("role"), int(found["exp"]))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires > now_s else None

    def new(self, now_s: int, actor: str | None = None, role: str | None = None) -> Session:
        return Session(secrets.token_urlsafe(18), actor, role, now_s + SESSION_SECONDS)

    def cookie(self, session: Session, request: Request) -> str:
        """The ``Set-Cookie`` value keeping ``session``."""
        data = {"sid": session.sid, "actor": session.actor, "role": session.role, "exp": session.expires}
        payload = base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")
        secure = "; Secure" if request.scheme == "https" else ""
        path = request.root or "/"
        return (
            f"{SESSION_COOKIE}={payload}.{self._sign(payload.encode())}; Path={path}; HttpOnly; SameSite=Strict{secure}"
        )

    def csrf_token(self, session: Session) -> str:
        return self._sign(f"csrf:{session.sid}".encode())

    def csrf_refusal(self, request: Request, session: Session | None) -> str | None:
        """Why a change must be refused as a cross-site or tokenless request (``None``: it may go on)."""
        if request.headers.get("sec-fetch-site", "") == "cross-site":
            return "a request from another site"
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != (request.headers.get("host") or ""):
            return "a request from another origin"
        given = request.field("csrf") or request.headers.get("x-csrf-token", "")
        if session is None or not given:
            return "a missing CSRF token"
        if not hmac.compare_digest(given, self.csrf_token(session)):
            return "a wrong CSRF token"
        return None
