"""``send_http`` and ``serve_sink`` on real loopback sockets: what counts as an ACK, what never does, and the
receiver's answers. Scripted raw-socket servers play the misbehaving receivers; nothing is mocked."""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import math
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from outbox_child import dump
from test_lab_outbox import BAD_EVENTS

from asyncq.lab.outbox import BadAck, SinkServer, accept, dispatch, open_source, pending, send_http, serve_sink

pytestmark = pytest.mark.timeout(30)

EVENT = {"id": "snack-7", "qty": 7}
GOOD_ACK = b'{"id": "snack-7", "status": "applied"}'
Respond = Callable[[socket.socket, bytes], object]


def answer(status: int, body: bytes, *headers: str, length: bool = True) -> Respond:
    """A scripted answer: status line, headers, optional Content-Length, body; then the server closes."""

    def respond(conn: socket.socket, request: bytes) -> None:
        lines = [f"HTTP/1.1 {status} Whatever", "Connection: close", *headers]
        if length:
            lines.append(f"Content-Length: {len(body)}")
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return respond


class RawServer:
    """Loopback TCP server: reads one HTTP request per connection, then runs ``respond`` on the socket."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/events"
        self.connections = 0
        self.requests: list[bytes] = []
        self.received = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # the listener was shut down
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                        if k.lower() == b"content-length"
                    ),
                    0,
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + body)
                self.received.set()
                self.respond(conn, body)
            except OSError:
                return  # the client went away: that is what several scripts provoke

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Respond], RawServer]]:
    servers: list[RawServer] = []

    def start(respond: Respond) -> RawServer:
        servers.append(RawServer(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SinkServer]:
    with serve_sink(tmp_path / "sink.db") as server:
        yield server


# --- what send_http sends, and what it accepts ---------------------------------------------------------


def test_send_http_posts_exactly_id_and_qty_and_accepts_a_valid_ack(
    raw_server: Callable[[Respond], RawServer],
) -> None:
    server = raw_server(answer(200, GOOD_ACK))
    event = dict(EVENT)
    assert send_http(server.url, event) is True
    assert event == EVENT
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /events HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}".encode() in head
    assert b"Content-Type: application/json" in head
    assert json.loads(body) == EVENT


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "snack-7", "status": "duplicate"}',
        b'{"status": "applied", "id": "snack-7", "stock": 14}',
        b'  {"id":"snack-7","status":"applied"}\n',
        b'{"id": "snack-7", "status": "applied", "pad": "' + b"x" * (4096 - 54) + b'"}',  # exactly 4096 bytes
    ],
)
def test_valid_acks(raw_server: Callable[[Respond], RawServer], body: bytes) -> None:
    assert len(body) <= 4096
    assert send_http(raw_server(answer(200, body)).url, EVENT) is True


def test_an_ack_without_content_length_or_chunked_is_read_to_the_end(
    raw_server: Callable[[Respond], RawServer],
) -> None:
    assert send_http(raw_server(answer(200, GOOD_ACK, length=False)).url, EVENT) is True
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(GOOD_ACK), GOOD_ACK)
    assert send_http(raw_server(answer(200, chunked, "Transfer-Encoding: chunked", length=False)).url, EVENT)


NOT_ACKS = {
    "wrong id": answer(200, b'{"id": "snack-8", "status": "applied"}'),
    "id as int": answer(200, b'{"id": 7, "status": "applied"}'),
    "missing id": answer(200, b'{"status": "applied"}'),
    "missing status": answer(200, b'{"id": "snack-7"}'),
    "status ok": answer(200, b'{"id": "snack-7", "status": "ok"}'),
    "status upper": answer(200, b'{"id": "snack-7", "status": "APPLIED"}'),
    "status null": answer(200, b'{"id": "snack-7", "status": null}'),
    "status list": answer(200, b'{"id": "snack-7", "status": ["applied"]}'),
    "array": answer(200, b'[{"id": "snack-7", "status": "applied"}]'),
    "string": answer(200, b'"applied"'),
    "true": answer(200, b"true"),
    "null": answer(200, b"null"),
    "not json": answer(200, b"OK"),
    "empty": answer(200, b""),
    "trailing garbage": answer(200, GOOD_ACK + b"x"),
    "NaN": answer(200, b'{"id": "snack-7", "status": "applied", "n": NaN}'),
    "Infinity": answer(200, b'{"id": "snack-7", "status": "applied", "n": -Infinity}'),
    "duplicate id": answer(200, b'{"id": "snack-8", "status": "applied", "id": "snack-7"}'),
    "duplicate status": answer(200, b'{"id": "snack-7", "status": "conflict", "status": "applied"}'),
    "not utf-8": answer(200, b'{"id": "snack-7", "status": "applied", "x": "\xff"}'),
    "utf-16": answer(200, GOOD_ACK.decode().encode("utf-16")),
    "bom": answer(200, b"\xef\xbb\xbf" + GOOD_ACK),
    "deep nesting": answer(200, b"[" * 2048 + b"]" * 2048),
    "201": answer(201, GOOD_ACK),
    "202": answer(202, GOOD_ACK),
    "204": answer(204, b""),
    "400": answer(400, GOOD_ACK),
    "404": answer(404, GOOD_ACK),
    "409": answer(409, GOOD_ACK),
    "500": answer(500, GOOD_ACK),
    "503": answer(503, GOOD_ACK),
    "4097 bytes": answer(200, GOOD_ACK[:-1] + b" " * (4097 - len(GOOD_ACK)) + b"}"),
    "4097 bytes unannounced": answer(200, GOOD_ACK[:-1] + b" " * (4097 - len(GOOD_ACK)) + b"}", length=False),
    "huge length announced": answer(200, GOOD_ACK, "Content-Length: 999999999999", length=False),
    "truncated": answer(200, GOOD_ACK, "Content-Length: 100", length=False),
    "not http": lambda conn, request: conn.sendall(b"HELLO THERE\r\n\r\n" + GOOD_ACK),
    "header flood": lambda conn, request: conn.sendall(
        b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n" + GOOD_ACK
    ),
}


@pytest.mark.parametrize("name", list(NOT_ACKS))
def test_answers_that_are_not_evidence(raw_server: Callable[[Respond], RawServer], name: str) -> None:
    server = raw_server(NOT_ACKS[name])
    event = dict(EVENT)
    with pytest.raises(BadAck):
        send_http(server.url, event, timeout=2.0)
    assert event == EVENT and server.connections == 1


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_and_not_an_ack(raw_server: Callable[[Respond], RawServer], status: int) -> None:
    target = raw_server(answer(200, GOOD_ACK))
    server = raw_server(answer(status, GOOD_ACK, f"Location: {target.url}"))
    with pytest.raises(BadAck):
        send_http(server.url, EVENT)
    assert server.connections == 1 and target.connections == 0


def endless(conn: socket.socket, request: bytes) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + GOOD_ACK[:-1])
    sent = 0
    while sent < 1 << 30:  # until the client hangs up (a GiB is far beyond any socket buffer)
        sent += conn.send(b" " * 65536)


@pytest.mark.parametrize(
    "status_line", [b"HTTP/1.0 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
)
def test_an_endless_body_is_cut_at_4097_bytes(raw_server: Callable[[Respond], RawServer], status_line: bytes) -> None:
    def respond(conn: socket.socket, request: bytes) -> None:
        chunked = b"chunked" in status_line
        conn.sendall(status_line)
        while True:
            block = b" " * 1024
            conn.sendall(b"400\r\n" + block + b"\r\n" if chunked else block)

    started = time.monotonic()
    with pytest.raises(BadAck):
        send_http(raw_server(respond).url, EVENT, timeout=5.0)
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    with pytest.raises(BadAck):
        send_http(raw_server(endless).url, EVENT, timeout=5.0)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    ("timeout", "script"),
    [
        (1.0, "headers"),
        (0.6, "body"),
    ],
)
def test_the_timeout_bounds_the_whole_exchange(
    raw_server: Callable[[Respond], RawServer], timeout: float, script: str
) -> None:
    answer_bytes = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(GOOD_ACK) + GOOD_ACK
    head = answer_bytes.index(b"\r\n\r\n") + 4 if script == "body" else 0

    def respond(conn: socket.socket, request: bytes) -> None:
        conn.sendall(answer_bytes[:head])
        for byte in answer_bytes[head:]:
            conn.sendall(bytes([byte]))
            time.sleep(0.2)  # the behaviour under test: one byte every 0.2 s, each read well within timeout

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        send_http(raw_server(respond).url, EVENT, timeout=timeout)
    assert time.monotonic() - started <= timeout + 0.5


def test_a_silent_server_times_out(raw_server: Callable[[Respond], RawServer]) -> None:
    server = raw_server(lambda conn, request: server.stop.wait(5))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        send_http(server.url, EVENT, timeout=0.3)
    assert time.monotonic() - started <= 0.8 and len(server.requests) == 1


def test_network_errors_propagate() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(ConnectionRefusedError):
        send_http(f"http://127.0.0.1:{port}/events", EVENT)


def test_a_receiver_that_hangs_up_without_answering_is_a_network_error(
    raw_server: Callable[[Respond], RawServer],
) -> None:
    with pytest.raises(ConnectionError):
        send_http(raw_server(lambda conn, request: None).url, EVENT)


def test_proxy_variables_are_ignored(
    raw_server: Callable[[Respond], RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = raw_server(answer(200, GOOD_ACK))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = raw_server(answer(200, GOOD_ACK))
    assert send_http(server.url, EVENT) is True
    assert server.connections == 1 and proxy.connections == 0


# --- refused before any I/O -----------------------------------------------------------------------------


def refused_urls(port: int) -> list[object]:
    p = port
    return [
        f"https://127.0.0.1:{p}/events",
        f"ftp://127.0.0.1:{p}/events",
        f"HTTP://127.0.0.1:{p}/events",
        f"http:/127.0.0.1:{p}/events",
        f"//127.0.0.1:{p}/events",
        f"127.0.0.1:{p}/events",
        f"http://127.0.0.1:{p}",
        f"http://127.0.0.1:{p}/",
        f"http://127.0.0.1:{p}/events/",
        f"http://127.0.0.1:{p}/Events",
        f"http://127.0.0.1:{p}//events",
        f"http://127.0.0.1:{p}/./events",
        f"http://127.0.0.1:{p}/events/..",
        f"http://127.0.0.1:{p}\\events",
        f"http://127.0.0.1:{p}/events?",
        f"http://127.0.0.1:{p}/events?x=1",
        f"http://127.0.0.1:{p}/events#",
        f"http://127.0.0.1:{p}/events#top",
        f"http://user@127.0.0.1:{p}/events",
        f"http://user:pw@127.0.0.1:{p}/events",
        f"http://127.0.0.1:{p}@example.com/events",
        f"http://127.0.0.1:{p}/%65vents",
        f"http://127.0.0.1:{p}/events%0d%0aX:1",
        f"http://127.0.0.1:{p}/events\r\n",
        f"http://127.0.0.1:{p}/events\n",
        f" http://127.0.0.1:{p}/events",
        f"http://127.0.0.1:{p}/events ",
        f"http://127.0.0.1:{p}/ev\tents",
        f"http://127.1:{p}/events",
        f"http://0x7f000001:{p}/events",
        f"http://2130706433:{p}/events",
        f"http://0177.0.0.1:{p}/events",
        f"http://127.0.0.01:{p}/events",
        f"http://127.0.0.256:{p}/events",
        f"http://127.0.0.1.:{p}/events",
        f"http://127.0.0.1.5:{p}/events",
        f"http://\uff11\uff12\uff17.0.0.1:{p}/events",
        f"http://[::ffff:127.0.0.1]:{p}/events",
        f"http://[::ffff:7f00:1]:{p}/events",
        f"http://[0:0:0:0:0:0:0:1]:{p}/events",
        f"http://::1:{p}/events",
        f"http://[::1:{p}/events",
        f"http://localhost.evil:{p}/events",
        f"http://localhost.:{p}/events",
        f"http://evil.localhost:{p}/events",
        f"http://LOCALHOST:{p}/events",
        f"http://example.com:{p}/events",
        f"http://0.0.0.0:{p}/events",
        f"http://10.0.0.1:{p}/events",
        f"http://128.0.0.1:{p}/events",
        "http://127.0.0.1:0/events",
        "http://127.0.0.1:65536/events",
        "http://127.0.0.1:99999/events",
        "http://127.0.0.1:-1/events",
        "http://127.0.0.1:+80/events",
        "http://127.0.0.1:abc/events",
        "http://127.0.0.1:/events",
        f"http://127.0.0.1:0{p}/events",
        "http://127.0.0.1:\uff18\uff10/events",
        f"http://127.0.0.1:{p}:{p}/events",
        "",
        None,
        b"http://127.0.0.1/events",
        7,
        ["http://127.0.0.1/events"],
    ]


def count_accepted(listener: socket.socket) -> int:
    """Connections waiting in the listener's accept queue (the kernel completes them without us)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_refused_urls_never_touch_the_network() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    urls = refused_urls(port)
    assert len(urls) >= 30
    for url in urls:
        with pytest.raises(ValueError):
            send_http(url, EVENT)  # type: ignore[arg-type]
    assert count_accepted(listener) == 0
    with pytest.raises(TimeoutError):  # the control: a valid URL does connect (nobody answers)
        send_http(f"http://127.0.0.1:{port}/events", EVENT, timeout=0.2)
    assert count_accepted(listener) == 1
    listener.close()


BAD_TIMEOUTS: list[object] = [True, False, 0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, "2", None, [2]]


def test_bad_events_and_timeouts_are_refused_before_any_io() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/events"
    for event in BAD_EVENTS:
        kept = copy.deepcopy(event)
        with pytest.raises(ValueError):
            send_http(url, event)  # type: ignore[arg-type]
        assert event == kept
    for timeout in [*BAD_TIMEOUTS, type("F", (float,), {})(1.0)]:
        with pytest.raises(ValueError):
            send_http(url, EVENT, timeout=timeout)
    assert count_accepted(listener) == 0
    listener.close()


def test_other_loopback_forms_are_accepted(tmp_path: Path) -> None:
    with serve_sink(tmp_path / "a.db", host="127.0.0.2") as second:
        assert send_http(f"http://127.0.0.2:{second.port}/events", {"id": "a", "qty": 1}, timeout=1)
    with serve_sink(tmp_path / "b.db") as sink:
        assert send_http(f"http://localhost:{sink.port}/events", {"id": "b", "qty": 1}, timeout=1.5)
    try:
        six = serve_sink(tmp_path / "c.db", host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with six:
        assert six.url == f"http://[::1]:{six.port}/events"
        assert send_http(six.url, {"id": "c", "qty": 1})
        assert six.log == [("c", "applied")]


# --- serve_sink ----------------------------------------------------------------------------------------


def post(port: int, body: bytes, method: str = "POST", path: str = "/events") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def test_the_sink_answers_applied_then_duplicate_then_conflict(sink: SinkServer, tmp_path: Path) -> None:
    assert post(sink.port, b'{"id": "snack-7", "qty": 7}') == (200, {"id": "snack-7", "status": "applied"})
    assert post(sink.port, b'{"qty": 7, "id": "snack-7"}') == (200, {"id": "snack-7", "status": "duplicate"})
    before = dump(tmp_path / "sink.db")
    status, body = post(sink.port, b'{"id": "snack-7", "qty": 8}')
    assert status == 409 and body["id"] == "snack-7"
    assert dump(tmp_path / "sink.db") == before == {"inbox": [("snack-7", 7)], "stock": [("snack", 7)]}
    assert sink.log == [("snack-7", "applied"), ("snack-7", "duplicate"), ("snack-7", "conflict")]
    assert sink.requests == 3


def test_fifty_concurrent_posts_of_one_id_apply_once(sink: SinkServer, tmp_path: Path) -> None:
    barrier = threading.Barrier(50)
    results: list[tuple[int, Any]] = []

    def publisher() -> None:
        barrier.wait()
        results.append(post(sink.port, b'{"id": "snack-7", "qty": 7}'))

    threads = [threading.Thread(target=publisher) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(body["status"] for status, body in results if status == 200) == ["applied"] + ["duplicate"] * 49
    assert dump(tmp_path / "sink.db") == {"inbox": [("snack-7", 7)], "stock": [("snack", 7)]}


def test_fifty_concurrent_send_http_calls(sink: SinkServer, tmp_path: Path) -> None:
    barrier = threading.Barrier(50)
    acks: list[bool] = []

    def publisher(n: int) -> None:
        barrier.wait()
        acks.append(send_http(sink.url, {"id": f"id-{n % 10}", "qty": n % 10 + 1}))

    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert acks == [True] * 50
    assert dump(tmp_path / "sink.db")["stock"] == [("snack", sum(range(1, 11)))]


MALFORMED = [
    b"",
    b"not json",
    b"[]",
    b'"snack-7"',
    b"null",
    b'{"id": "snack-7"}',
    b'{"qty": 7}',
    b'{"id": "snack-7", "qty": 7, "extra": 1}',
    b'{"id": "snack-7", "qty": true}',
    b'{"id": "snack-7", "qty": 7.0}',
    b'{"id": "snack-7", "qty": 1e2}',
    b'{"id": "snack-7", "qty": 0}',
    b'{"id": "snack-7", "qty": 1001}',
    b'{"id": "snack-7", "qty": 100000000000000000000000000}',
    b'{"id": "snack-7", "qty": "7"}',
    b'{"id": "snack-7", "qty": NaN}',
    b'{"id": 7, "qty": 7}',
    b'{"id": "snack-\xd0\xb7", "qty": 7}',
    b'{"id": "snack-\\u0437", "qty": 7}',
    b'{"id": "snack-7\\n", "qty": 7}',
    b'{"id": "", "qty": 7}',
    b'{"id": "snack-8", "qty": 7, "id": "snack-7"}',
    b'{"id": "snack-7", "qty": 7} x',
    b"\xef\xbb\xbf" + b'{"id": "snack-7", "qty": 7}',
    b"\xff\xfe",
    b"[" * 4000,
]


def test_malformed_bodies_are_400_and_change_nothing(sink: SinkServer, tmp_path: Path) -> None:
    assert post(sink.port, b'{"id": "old", "qty": 2}')[0] == 200
    before = dump(tmp_path / "sink.db")
    for body in MALFORMED:
        status, answer_body = post(sink.port, body)
        assert status == 400, body
        assert "error" in answer_body
    assert dump(tmp_path / "sink.db") == before
    assert sink.log == [("old", "applied")]


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        return data


def test_bodies_over_4096_bytes_are_413(sink: SinkServer, tmp_path: Path) -> None:
    before = dump(tmp_path / "sink.db")
    big = b'{"id": "snack-7", "qty": 7}' + b" " * (4097 - 27)
    assert len(big) == 4097
    assert post(sink.port, big)[0] == 413
    assert post(sink.port, big[:-1])[0] == 200  # 4096 bytes is within the limit
    after_ok = dump(tmp_path / "sink.db")
    assert after_ok != before
    reply = raw_exchange(sink.port, b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 413 ")
    assert dump(tmp_path / "sink.db") == after_ok


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /events HTTP/1.1\r\nHost: x\r\n\r\n",  # no Content-Length
        b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"POST /events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
)
def test_requests_without_one_plain_length_are_400(sink: SinkServer, request_bytes: bytes) -> None:
    assert raw_exchange(sink.port, request_bytes).startswith(b"HTTP/1.0 400 ")
    assert sink.log == []


def test_other_paths_are_404_and_other_methods_405(sink: SinkServer, tmp_path: Path) -> None:
    body = b'{"id": "snack-7", "qty": 7}'
    for path in ("/", "/other", "/events/", "/Events", "/events?x=1", "//events"):
        assert post(sink.port, body, path=path)[0] == 404, path
        assert post(sink.port, b"", method="GET", path=path)[0] == 404, path
    for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"):
        assert post(sink.port, body, method=method)[0] == 405, method
    reply = raw_exchange(sink.port, b"HEAD /events HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 405 ") and b"Allow: POST" in reply and reply.endswith(b"\r\n\r\n")
    assert dump(tmp_path / "sink.db") == {"inbox": [], "stock": [("snack", 0)]}
    assert sink.log == []


def test_close_stops_the_server_and_releases_the_store(tmp_path: Path) -> None:
    server = serve_sink(tmp_path / "sink.db")
    assert post(server.port, b'{"id": "a", "qty": 1}')[0] == 200
    server.close()
    server.close()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        post(server.port, b'{"id": "a", "qty": 1}')
    con = sqlite3.connect(tmp_path / "sink.db", isolation_level=None, timeout=0.05)
    con.execute("BEGIN EXCLUSIVE")  # nobody holds the file
    con.execute("ROLLBACK")
    con.close()


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("0.0.0.0", 0),
        ("example.com", 0),
        ("127.1", 0),
        (None, 0),
        (1, 0),
        ("127.0.0.1", True),
        ("127.0.0.1", -1),
        ("127.0.0.1", 65536),
        ("127.0.0.1", "0"),
        ("127.0.0.1", 0.0),
        ("127.0.0.1", None),
    ],
)
def test_serve_sink_refuses_bad_hosts_and_ports(tmp_path: Path, host: object, port: object) -> None:
    with pytest.raises(ValueError):
        serve_sink(tmp_path / "sink.db", host=host, port=port)  # type: ignore[arg-type]
    assert not (tmp_path / "sink.db").exists()


# --- the two sides together ----------------------------------------------------------------------------


def test_dispatch_through_send_http_to_serve_sink(sink: SinkServer, tmp_path: Path) -> None:
    con = open_source(tmp_path / "source.db")
    for n, item_id in enumerate(["z", "a", "m"], start=1):
        accept(con, {"id": item_id, "qty": n})
    assert dispatch(con, lambda event: send_http(sink.url, event, timeout=2)) == 3
    assert pending(con) == [] and not con.in_transaction
    assert sink.log == [("z", "applied"), ("a", "applied"), ("m", "applied")]
    assert dump(tmp_path / "sink.db")["stock"] == [("snack", 6)]
    con.close()
