"""HTTP delivery on aiohttp: POST the job's body as JSON, and count only a verified acknowledgement.

A delivery succeeds only on status ``200`` with a JSON object whose ``id`` equals the job's id. Every other
outcome raises, and the classification is made here once:

================================================  ============================================
the exchange                                      raises
================================================  ============================================
200 and ``{"id": <job id>, …}``                   nothing: the job is done
200 with another id, non-JSON, not an object      ``BadAck`` (an answer, but no evidence)
other 2xx (201, 202, 204 …), 1xx, >= 600          ``BadAck``
3xx (never followed)                              ``BadAck``
408, 429, 5xx                                     ``Retryable(delay_ms=Retry-After, capped)``
other 4xx                                         ``Permanent``
timeout of the whole exchange, connection error   ``Retryable(delay_ms=None)``
a response body over ``max_response_bytes``       ``BadAck``
================================================  ============================================

``BadAck`` is not a ``Retryable``: it names a receiver that answered without proving anything (a proxy, a
misrouted URL, an old receiver), which an operator must see. The pool retries it like ``Retryable`` because
delivery is at-least-once and the receiver's inbox deduplicates by ``Idempotency-Key``.

Safety: the URL is checked when the transport is built (``http``/``https``, no userinfo, host in the
allowlist, loopback by default), so a refused URL never opens a connection. Redirects are never followed,
proxy settings and ``.netrc`` from the environment are ignored, cookies are not kept, responses are not
decompressed, at most ``max_response_bytes + 1`` bytes of a response are read, and ``timeout`` bounds the
whole exchange from the connection pool to the last byte of the answer.
"""

from __future__ import annotations

import email.utils
import ipaddress
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
from aiohttp.payload import BytesPayload
from yarl import URL

from asyncq.core.ack import verify_ack
from asyncq.core.clock import wall_clock_ms
from asyncq.core.values import check_identifier, check_int, check_seconds
from asyncq.delivery.base import Body, encode_body
from asyncq.errors import AsyncqError, BadAck, Permanent, Retryable

log = logging.getLogger("asyncq.delivery.http")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

LOOPBACK_NETWORKS: tuple[IpNetwork, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
LOOPBACK_NAMES = frozenset({"localhost"})
RETRY_AFTER_CAP_MAX_MS = 86_400_000
RESPONSE_BYTES_MAX = 16 * 1024 * 1024

# RFC 9110 token characters for header names; values may not carry CR, LF or NUL.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_VALUE = re.compile("[\r\n\0]")
_FIXED_HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}  # Content-Type: the payload's
_SET_BY_TRANSPORT = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "idempotency-key"}
)


class HostAllowlist:
    """Which hosts a transport may connect to: IP literals inside ``networks``, or exact ``names``.

    IPv4 literals count only in dotted-quad form (``127.1``, ``2130706433`` and ``0x7f.0.0.1`` are names,
    and refused unless listed as such); an IPv4-mapped IPv6 address is not its IPv4 address.
    Names are compared case-insensitively, without trailing-dot folding, and trusted to resolve as intended.
    """

    def __init__(self, entries: Iterable[str] | None = None) -> None:
        if entries is None:
            self.networks, self.names = LOOPBACK_NETWORKS, LOOPBACK_NAMES
            return
        if isinstance(entries, str | bytes):
            raise ValueError("allowed_hosts must be a collection of host names or networks, not one string")
        networks: list[IpNetwork] = []
        names: set[str] = set()
        for entry in entries:
            if type(entry) is not str or not entry:
                raise ValueError("allowed_hosts entries must be non-empty str")
            try:
                networks.append(ipaddress.ip_network(entry))
            except ValueError:
                names.add(entry.lower())
        self.networks, self.names = tuple(networks), frozenset(names)

    def allows(self, host: str) -> bool:
        """Whether ``host`` (as yarl parsed it from a URL) is allowed."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host.lower() in self.names
        return any(address.version == net.version and address in net for net in self.networks)


class AnsweredOnlyConnector(aiohttp.TCPConnector):
    """A connector that never reuses an idle connection on which bytes arrived while no request was out.

    aiohttp parses whatever a kept-alive connection receives; a response written before the next request (a
    receiver's bug, or one answering twice) would be read as that request's answer: an ACK of a job the
    receiver never saw. Such a connection is closed instead, and the request goes out on a fresh one. (Bytes
    arriving between the pick of a connection and the request's write cannot be told apart; that window is the
    send's own few microseconds.)"""

    async def _get(self, key: Any, traces: list[Any]) -> Any:
        idle = self._conns.get(key)
        if idle:
            for entry in [entry for entry in idle if entry[0].should_close]:
                idle.remove(entry)
                entry[0].close()
                log.warning("closed an idle connection to %s:%s that held an unrequested answer", key.host, key.port)
            if not idle:
                del self._conns[key]
        return await super()._get(key, traces)


def check_url(url: object, allowed_hosts: Iterable[str] | None = None) -> URL:
    """The parsed ``url`` if it is absolute ``http``/``https`` without userinfo, with an allowed host."""
    if type(url) is not str:
        raise ValueError(f"url must be a str, not {type(url).__name__}")
    try:
        parsed = URL(url)
    except ValueError as exc:
        raise ValueError(f"url is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError("url must be an absolute http:// or https:// URL with a host")
    if parsed.user is not None or parsed.password is not None:
        raise ValueError("url must not carry userinfo")
    if not HostAllowlist(allowed_hosts).allows(parsed.host):
        raise ValueError(f"url host {parsed.host!r} is not in the allowed hosts")
    return parsed


def retry_after_ms(value: str | None, *, now: float, cap_ms: int) -> int | None:
    """A ``Retry-After`` header (delay-seconds or HTTP-date) as milliseconds from ``now`` (seconds since the
    epoch), clamped to ``0 … cap_ms``; ``None`` when absent or unreadable, so the retry policy decides."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return cap_ms if len(text) > 9 else min(int(text) * 1000, cap_ms)
    try:
        when = email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None
    return max(0, min(math.ceil((when - now) * 1000), cap_ms))


class HttpTransport:
    """Delivers jobs by HTTP POST to one URL, sharing one ``aiohttp.ClientSession`` (made on first use).

    ``timeout`` (seconds) bounds each whole exchange; ``retry_after_cap_ms`` caps the delay a receiver may
    ask for. A ``session`` passed in is borrowed (never closed here) and must not trust the environment.

    The transport's own session opens a connection for every delivery in flight: the pool's concurrency is
    the cap. aiohttp's default cap (100) made a pool of 128 tasks lose deliveries to their deadline, because
    a released connection goes to whichever request asks first (the worker that just released it), never to
    one already waiting. A borrowed session keeps its own connector, and its cap.
    """

    def __init__(
        self,
        url: str,
        *,
        allowed_hosts: Iterable[str] | None = None,
        timeout: float = 10.0,
        max_response_bytes: int = 65536,
        retry_after_cap_ms: int = 60_000,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = check_url(url, allowed_hosts)
        self.timeout = check_seconds(timeout, "timeout")
        if self.timeout > 3600:
            raise ValueError(f"timeout must be at most 3600 seconds, got {timeout!r}")
        self.max_response_bytes = check_int(max_response_bytes, "max_response_bytes", 1, RESPONSE_BYTES_MAX)
        self.retry_after_cap_ms = check_int(retry_after_cap_ms, "retry_after_cap_ms", 0, RETRY_AFTER_CAP_MAX_MS)
        if session is not None and session.trust_env:
            raise ValueError("a borrowed session must have trust_env=False (no proxies from the environment)")
        self._session = session
        self._owns_session = session is None
        self._closed = False
        self._client_timeout = aiohttp.ClientTimeout(total=self.timeout)
        self._plain_names: set[str] = set()  # caller header names checked and not the transport's

    async def deliver(self, job_id: str, body: Body, headers: Mapping[str, str]) -> None:
        """POST ``body`` with ``Idempotency-Key: job_id`` and ``headers``; return only on a verified ACK.

        Raises ``Retryable``, ``Permanent`` or ``BadAck`` as the module's table says; ``ValueError`` for an
        invalid ``job_id`` or header, ``RuntimeError`` after :meth:`close`.
        """
        check_identifier(job_id, "job_id")
        request_headers = self._request_headers(job_id, headers)
        data = BytesPayload(encode_body(body), content_type="application/json")
        session = self._open_session()
        try:
            # aiohttp's total timeout bounds the whole exchange: connecting, sending, and every read of
            # the answer (its stream reads run under the same timer), so no second timer is needed here.
            async with session.post(
                self.url,
                data=data,
                headers=request_headers,
                allow_redirects=False,
                raise_for_status=False,
                auto_decompress=False,
                timeout=self._client_timeout,
            ) as response:
                if response.status != 200:
                    raise self._refusal(response)
                verify_ack(job_id, await self._read_capped(response))
        except TimeoutError as exc:  # before OSError, its base class
            raise Retryable(f"{self.url.host}: no complete answer within {self.timeout} s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise Retryable(f"{self.url.host}: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        """Close the transport's own session (a borrowed one stays open); later deliveries fail."""
        self._closed = True
        if self._owns_session and self._session is not None:
            await self._session.close()

    def _open_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("HttpTransport is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=AnsweredOnlyConnector(limit=0),  # no cap: see the class docstring
                trust_env=False,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=self._client_timeout,
            )
        return self._session

    def _refusal(self, response: aiohttp.ClientResponse) -> AsyncqError:
        status = response.status
        where = f"{self.url.host} answered {status}"
        if status in (408, 429) or 500 <= status <= 599:
            delay = retry_after_ms(
                response.headers.get("Retry-After"), now=wall_clock_ms() / 1000, cap_ms=self.retry_after_cap_ms
            )
            return Retryable(where, delay_ms=delay)
        if 300 <= status <= 399:
            return BadAck(f"{where} (redirects are not followed)")
        if 400 <= status <= 499:
            return Permanent(where)
        return BadAck(f"{where}; only 200 with the job's id acknowledges")

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        cap = self.max_response_bytes
        declared = response.content_length
        if declared is not None and declared > cap:
            response.close()
            raise BadAck(f"{self.url.host} announced {declared} bytes, more than {cap}")
        if declared is not None:  # the parser frames the body by its Content-Length: never more than that
            return await response.read()
        received = bytearray()
        while len(received) <= cap:
            chunk = await response.content.read(cap + 1 - len(received))
            if not chunk:
                break
            received += chunk
        if len(received) > cap:
            response.close()
            raise BadAck(f"{self.url.host} answered more than {cap} bytes")
        return bytes(received)

    def _request_headers(self, job_id: str, headers: Mapping[str, str]) -> dict[str, str]:
        """The caller's headers, checked, plus the ones the transport owns (``Idempotency-Key`` is the job id)."""
        checked = dict(_FIXED_HEADERS)
        for name, value in headers.items():
            if type(value) is not str or _BAD_VALUE.search(value) is not None:
                raise ValueError(f"header {name} must be a str without CR, LF or NUL")
            if name not in self._plain_names:  # names repeat job after job: each is checked once
                if _is_transport_header(name):
                    if name.lower() == "idempotency-key" and value == job_id:
                        continue
                    raise ValueError(f"header {name} is set by the transport")
                self._plain_names.add(name)
            checked[name] = value
        checked["Idempotency-Key"] = job_id
        return checked


def _is_transport_header(name: object) -> bool:
    """Whether ``name`` is one the transport sets; ``ValueError`` if it is not an HTTP token at all."""
    if type(name) is not str or _HEADER_NAME.fullmatch(name) is None:
        raise ValueError(f"header name {name!r} is not an HTTP token")
    return name.lower() in _SET_BY_TRANSPORT
