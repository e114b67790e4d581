"""HTTP for the outbox lab on the standard library only.

Three pieces, each used by one function of :mod:`asyncq.lab.outbox`:

* :func:`parse_loopback_url` — the strict ``http://<loopback>[:port]/events`` check ``send_http`` runs before any I/O;
* :func:`post_json` — one POST whose ``timeout`` bounds the whole exchange (connect to last byte), through
  ``http.client`` directly: no proxy environment variables, no redirects, at most ``MAX_BODY`` bytes of answer;
* :class:`SinkServer` — ``serve_sink``'s threaded receiver for ``POST /events``.
"""

from __future__ import annotations

import http.client
import http.server
import ipaddress
import json
import re
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncq.core.jsontext import loads_strict
from asyncq.core.values import check_event
from asyncq.errors import BadAck, Conflict

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

MAX_BODY = 4096
_LONGEST_WAIT = 86_400.0  # one socket wait never exceeds a day, whatever the caller's (finite) timeout

# Built from literal ASCII only, matched with fullmatch: whitespace, CR/LF, '%', '@', '?', '#', '\\' and
# non-ASCII digits can never match. Octet and port values are range-checked in code.
_OCTET = r"(?:0|[1-9][0-9]{0,2})"
_URL = re.compile(
    rf"http://(?P<host>localhost|\[::1\]|127\.{_OCTET}\.{_OCTET}\.{_OCTET})(?::(?P<port>[1-9][0-9]{{0,4}}))?/events"
)
_LOOPBACK_V4 = re.compile(rf"127\.{_OCTET}\.{_OCTET}\.{_OCTET}")


@dataclass(frozen=True)
class LoopbackTarget:
    """Where ``send_http`` connects: a loopback literal (or ``localhost``) and a port."""

    host: str  # '127.x.y.z', '::1' or 'localhost'
    port: int


def _is_loopback_v4(host: str) -> bool:
    return _LOOPBACK_V4.fullmatch(host) is not None and all(int(part) <= 255 for part in host.split("."))


def parse_loopback_url(url: object) -> LoopbackTarget:
    """Accept only ``http://`` + (127.0.0.0/8 dotted quad | ``localhost`` | ``[::1]``) + optional port 1-65535
    + exactly ``/events``; no userinfo, query, fragment, percent-encoding or whitespace. Else ``ValueError``."""
    match = _URL.fullmatch(url) if type(url) is str else None
    if match is None:
        raise ValueError("url must be http://<127.0.0.0/8 dotted quad | localhost | [::1]>[:port]/events")
    host, port_text = match["host"], match["port"]
    port = 80 if port_text is None else int(port_text)
    if (host.startswith("127.") and not _is_loopback_v4(host)) or not 1 <= port <= 65535:
        raise ValueError(f"url has an octet above 255 or a port outside 1-65535: {url!r}")
    return LoopbackTarget("::1" if host == "[::1]" else host, port)


def check_bind_host(host: object) -> str:
    """``serve_sink``'s host: a 127.0.0.0/8 dotted quad, ``localhost`` or ``::1`` (the receiver stays local)."""
    if type(host) is not str or not (host in ("localhost", "::1") or _is_loopback_v4(host)):
        raise ValueError("host must be a 127.0.0.0/8 dotted quad, 'localhost' or '::1'")
    return host


# --- one bounded exchange -------------------------------------------------------------------------


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("send_http: the exchange did not finish within its timeout")
    return min(left, _LONGEST_WAIT)


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive waits only for what is left of one shared deadline, so a
    server that drips a byte at a time cannot stretch the exchange (``http.client`` reads through these)."""

    def __init__(self, family: int, deadline: float) -> None:
        super().__init__(family, socket.SOCK_STREAM)
        self.deadline = deadline

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_remaining(self.deadline))
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0, /) -> None:
        self.settimeout(_remaining(self.deadline))
        super().sendall(data, flags)


def _addresses(target: LoopbackTarget) -> list[tuple[int, tuple[Any, ...]]]:
    if target.host == "::1":
        return [(socket.AF_INET6, ("::1", target.port, 0, 0))]
    if target.host != "localhost":
        return [(socket.AF_INET, (target.host, target.port))]
    found = socket.getaddrinfo("localhost", target.port, type=socket.SOCK_STREAM)
    loopback: list[tuple[int, tuple[Any, ...]]] = [
        (family, addr) for family, _, _, _, addr in found if ipaddress.ip_address(addr[0]).is_loopback
    ]
    if not loopback:
        raise OSError("localhost resolves to no loopback address")
    return loopback


def _connect(target: LoopbackTarget, deadline: float) -> _DeadlineSocket:
    error: OSError | None = None
    for family, address in _addresses(target):
        sock = _DeadlineSocket(family, deadline)
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    assert error is not None
    raise error


class _Connection(http.client.HTTPConnection):
    def __init__(self, target: LoopbackTarget, deadline: float) -> None:
        super().__init__(target.host, target.port)
        self._target, self._deadline = target, deadline

    def connect(self) -> None:
        self.sock = _connect(self._target, self._deadline)


def _read_capped(response: http.client.HTTPResponse) -> bytes:
    if response.length is not None and response.length > MAX_BODY:
        raise BadAck(f"answer announces {response.length} bytes, more than {MAX_BODY}")
    body = b""
    while len(body) <= MAX_BODY:  # read at most MAX_BODY + 1 bytes, never the rest of an endless answer
        chunk = response.read(MAX_BODY + 1 - len(body))
        if not chunk:
            if response.length:  # http.client returns a short body quietly; a cut answer is no ACK
                raise BadAck(f"answer ended {response.length} bytes before its Content-Length")
            return body
        body += chunk
    raise BadAck(f"answer is longer than {MAX_BODY} bytes")


def post_json(target: LoopbackTarget, payload: dict[str, Any], timeout: float) -> bytes:
    """POST ``payload`` to ``target``'s ``/events`` and return the body of a ``200`` answer (≤ ``MAX_BODY``
    bytes). Another status, an oversized body or broken HTTP is ``BadAck``; socket errors and the deadline's
    ``TimeoutError`` propagate. The socket is always closed."""
    deadline = time.monotonic() + timeout
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close"}
    connection = _Connection(target, deadline)
    try:
        connection.request("POST", "/events", body=body, headers=headers)
        with connection.getresponse() as response:
            if response.status != 200:
                raise BadAck(f"status {response.status} is not an ACK (only 200 is; redirects are not followed)")
            return _read_capped(response)
    except OSError:
        raise  # includes RemoteDisconnected and the deadline: the answer never arrived
    except http.client.HTTPException as exc:
        raise BadAck(f"malformed HTTP answer: {exc!r}") from exc
    finally:
        connection.close()


# --- the receiver ---------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = 5.0  # a client that stalls mid-request frees its thread

    def _reply(self, status: int, answer: dict[str, Any], allow: str | None = None) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if allow is not None:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _is_events(self) -> bool:
        # The request target as sent: http.server rewrites a leading '//' in ``self.path``.
        words = self.requestline.split()
        return len(words) == 3 and words[1] == "/events"

    def _elsewhere(self) -> None:
        self.server.sink.count_request()
        if self._is_events():
            self._reply(405, {"error": "method not allowed"}, allow="POST")
        else:
            self._reply(404, {"error": "not found"})

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _elsewhere

    def do_POST(self) -> None:
        sink = self.server.sink
        sink.count_request()
        if not self._is_events():
            return self._reply(404, {"error": "not found"})
        lengths = self.headers.get_all("Content-Length") or []
        if (
            len(lengths) != 1
            or not lengths[0].isascii()
            or not lengths[0].isdigit()
            or "Transfer-Encoding" in self.headers
        ):
            return self._reply(400, {"error": "exactly one Content-Length is required"})
        length = int(lengths[0])
        if length > MAX_BODY:
            if length <= 16 * MAX_BODY:  # drain a moderate body so closing does not reset the answer
                self.rfile.read(length)
            return self._reply(413, {"error": f"body over {MAX_BODY} bytes"})
        try:
            event = check_event(loads_strict(self.rfile.read(length)))
        except ValueError as exc:
            return self._reply(400, {"error": str(exc)})
        try:
            status = sink.apply(event)
        except Conflict:
            return self._reply(409, {"id": event["id"], "error": "conflict"})
        except Exception as exc:  # a busy or closed store: not an ACK, the publisher re-sends later
            return self._reply(503, {"error": f"store unavailable: {type(exc).__name__}"})
        self._reply(200, {"id": event["id"], "status": status})

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the handle's counters and log are the observable record."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # 50 simultaneous publishers must not wait for SYN retransmits

    def __init__(self, sink: SinkServer, address: tuple[str, int], family: int) -> None:
        self.sink = sink
        self.address_family = family
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # skip HTTPServer's reverse DNS lookup
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-request is not the receiver's error: stay quiet."""


class SinkServer:
    """The handle ``serve_sink`` returns: ``port``, ``url`` (of ``/events``), ``requests`` (HTTP requests
    answered so far), ``log`` (``(id, outcome)`` of every valid event posted) and ``close()``.

    Writes are serialised on one lock and one store connection, so many concurrent publishers never wait
    on SQLite's busy timeout."""

    def __init__(self, host: str, port: int, apply: Callable[[dict[str, Any]], str], close_store: Callable[[], None]):
        self._apply, self._close_store = apply, close_store
        self._lock = threading.Lock()
        self._closed = False
        self.requests = 0
        self.log: list[tuple[str, str]] = []
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = _Server(self, (host, port), family)
        self.host, self.port = host, int(self._server.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/events"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def apply(self, event: dict[str, Any]) -> str:
        """Run the store's ``receive`` under the lock and record the outcome."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the sink is closed")
            try:
                status = self._apply(event)
            except Conflict:
                self.log.append((event["id"], "conflict"))
                raise
            self.log.append((event["id"], status))
            return status

    def close(self) -> None:
        """Stop listening, wait for the serving thread, then close the store connection (idempotent)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_store()

    def __enter__(self) -> SinkServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
