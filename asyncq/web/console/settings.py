"""How a console runs: who may do what (``resolver``), how often it samples and how long it keeps samples, how often
live screens look for changes, how many rows a search page looks at, and whether it answers non-loopback host
names."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from asyncq.core.samples import DEFAULT_KEEP_MS, DEFAULT_SAMPLE_MS, MAX_KEEP_MS, MIN_SAMPLE_MS
from asyncq.core.search import MAX_PAGE, MAX_SCAN
from asyncq.core.values import check_flag, check_int
from asyncq.web.console.auth import Resolver


@dataclass(frozen=True)
class ConsoleSettings:
    """A console's settings (every duration in seconds).

    ``resolver``: who a request comes from (``asyncq.web.console.auth``); ``None``: everyone reads, nobody changes
    anything. ``sample_seconds``: how often this console samples the queues into the store (``None``: it does not
    sample, and shows what other consoles sampled); ``keep_seconds``: how long samples are kept.
    ``refresh_seconds``: how often a live screen looks for changes (server-sent events, or the browser's polling
    when those fail). ``page_size`` and ``scan``: jobs a page shows, rows of an index a page looks at.
    ``allow_remote``: answer any ``Host`` (served under a real name, behind a reverse proxy; a resolver is then
    required); by default only loopback names are answered, against DNS rebinding. ``secret``: signs session
    cookies and CSRF tokens (random per process by default: sign-ins end with the process)."""

    resolver: Resolver | None = None
    sample_seconds: float | None = DEFAULT_SAMPLE_MS / 1000
    keep_seconds: float = DEFAULT_KEEP_MS / 1000
    refresh_seconds: float = 5.0
    page_size: int = 50
    scan: int = MAX_SCAN
    allow_remote: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    title: str = "asyncq console"

    def checked(self) -> ConsoleSettings:
        """These settings if every one is valid (``ValueError`` naming the first that is not)."""
        if self.resolver is not None and not callable(self.resolver):
            raise ValueError("resolver must be callable (a Request -> Identity | None)")
        if self.sample_seconds is not None:
            _seconds(self.sample_seconds, "sample_seconds", MIN_SAMPLE_MS / 1000, 24 * 3600)
        _seconds(self.keep_seconds, "keep_seconds", 60, MAX_KEEP_MS / 1000)
        _seconds(self.refresh_seconds, "refresh_seconds", 0.05, 3600)
        check_int(self.page_size, "page_size", 1, MAX_PAGE)
        check_int(self.scan, "scan", self.page_size, 1_000_000)
        if check_flag(self.allow_remote, "allow_remote") and self.resolver is None:
            raise ValueError("allow_remote needs a resolver: a console other machines reach must know who asks")
        if type(self.secret) is not bytes or len(self.secret) < 16:
            raise ValueError("secret must be at least 16 bytes")
        return self

    @property
    def sample_ms(self) -> int | None:
        return None if self.sample_seconds is None else int(self.sample_seconds * 1000)

    @property
    def keep_ms(self) -> int:
        return int(self.keep_seconds * 1000)


def _seconds(value: object, name: str, low: float, high: float) -> None:
    if type(value) not in (int, float) or not low <= value <= high:  # type: ignore[operator]
        raise ValueError(f"{name} must be a number of seconds from {low:g} to {high:g}")
