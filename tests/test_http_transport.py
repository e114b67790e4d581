"""HttpTransport against real loopback servers: aiohttp apps for well-formed answers, raw asyncio servers for
peers that misbehave (drip, endless bodies, silence). Every outcome of the module's table is exercised."""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from waiting import eventually

from asyncq.delivery.base import JsonText, Transport
from asyncq.delivery.http import HttpTransport, retry_after_ms
from asyncq.errors import BadAck, Permanent, Retryable
from asyncq.queue import Queue
from asyncq.worker.pool import JobContext, Pool, deliver_with

pytestmark = pytest.mark.timeout(15)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Recorder:
    """An aiohttp server on 127.0.0.1 that records each request and answers with ``respond``."""

    def __init__(self, respond: Handler) -> None:
        self.respond = respond
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, dict(request.headers), await request.read()))
        return await self.respond(request)


@asynccontextmanager
async def web_server(respond: Handler) -> AsyncIterator[tuple[str, Recorder]]:
    recorder = Recorder(respond)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/events", recorder
    finally:
        await runner.cleanup()


Script = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A raw TCP server on 127.0.0.1 for peers that misbehave; counts connections and bytes written."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.bytes_written = 0
        self.finished = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/events"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.script(self, reader, writer)
        except ConnectionError:
            pass
        finally:
            self.finished.set()
            writer.close()

    async def write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.bytes_written += len(data)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return await reader.readexactly(int(line.split(b":", 1)[1]))
    return b""


def json_answer(status: int, payload: Any, **headers: str) -> Handler:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.json_response(payload, status=status, headers=headers)

    return respond


def raw_answer(status: int, body: bytes, **headers: str) -> Handler:
    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=body, headers=headers)

    return respond


# --- the verified acknowledgement ------------------------------------------------------------------------------


async def test_verified_ack_returns_and_the_server_sees_body_and_headers() -> None:
    async with web_server(json_answer(200, {"id": "job-1", "status": "applied"})) as (url, server):
        transport: Transport = HttpTransport(url)  # what the pool expects
        await transport.deliver("job-1", {"qty": 3, "note": "é"}, {"Asyncq-Token": "42"})
        await transport.close()
    [(method, headers, body)] = server.requests
    assert method == "POST"
    assert headers["Idempotency-Key"] == "job-1"
    assert headers["Asyncq-Token"] == "42"
    assert headers["Content-Type"] == "application/json"
    assert body == '{"qty":3,"note":"é"}'.encode()


async def test_json_text_is_sent_as_it_is() -> None:
    stored = '{"a":"\\u00e9","b":[1,2.0]}'  # canonical JSON as a queue stores it: sorted keys, ASCII escapes
    async with web_server(json_answer(200, {"id": "job-1"})) as (url, server):
        transport = HttpTransport(url)
        await transport.deliver("job-1", JsonText(stored), {})
        await transport.deliver("job-1", stored, {})  # a plain str is a JSON string, encoded
        await transport.close()
    assert [body for _method, _headers, body in server.requests] == [stored.encode(), json.dumps(stored).encode()]


async def test_a_pool_delivers_each_job_s_stored_body_without_decoding_it(queue: Queue) -> None:
    await queue.enqueue("job-1", {"b": 1, "a": "é"})
    async with web_server(json_answer(200, {"id": "job-1"})) as (url, server):
        transport = HttpTransport(url)
        pool = Pool(queue, concurrency=2)
        pool.register("default", deliver_with(transport))
        async with asyncio.timeout(10):
            await pool.run(burst=True)
        await transport.close()
    [(_method, headers, body)] = server.requests
    assert body == b'{"a":"\\u00e9","b":1}'  # the stored canonical text, byte for byte
    assert headers["Asyncq-Token"] == "1"
    assert pool.counters.finished == {"done": 1}


async def test_deliver_with_called_as_a_handler_sends_the_decoded_body_with_the_token() -> None:
    async with web_server(json_answer(200, {"id": "job-1"})) as (url, server):
        transport = HttpTransport(url)
        handler = deliver_with(transport)
        await handler({"b": 1, "a": [2]}, JobContext("job-1", "default", 1, 7, 0, 0))
        await transport.close()
    [(_method, headers, body)] = server.requests
    assert body == b'{"b":1,"a":[2]}'  # encoded as given (compact), unlike the stored canonical text
    assert (headers["Idempotency-Key"], headers["Asyncq-Token"]) == ("job-1", "7")


async def test_one_session_is_shared_and_closed_by_close() -> None:
    async with web_server(json_answer(200, {"id": "a"})) as (url, server):
        transport = HttpTransport(url)
        await asyncio.gather(*(transport.deliver("a", i, {}) for i in range(5)))
        session = transport._session
        assert session is not None and not session.closed
        await transport.close()
        assert session.closed
        with pytest.raises(RuntimeError):
            await transport.deliver("a", 1, {})
    assert len(server.requests) == 5


async def test_the_own_session_opens_a_connection_for_every_delivery_in_flight() -> None:
    # aiohttp caps a session at 100 connections by default and gives a released connection to whichever
    # request asks first, so deliveries above the cap waited out their deadline (a pool of 128 tasks lost 28).
    # The server acknowledges only once all 120 requests are in; under a cap of 100 it gives up after 5 s and
    # answers 503, which the transport raises as Retryable.
    in_flight = 120
    arrived: set[str] = set()
    all_in = asyncio.Event()

    async def respond(request: web.Request) -> web.StreamResponse:
        job_id = request.headers["Idempotency-Key"]
        arrived.add(job_id)
        if len(arrived) == in_flight:
            all_in.set()
        try:
            await asyncio.wait_for(all_in.wait(), 5)
        except TimeoutError:
            return web.Response(status=503)
        return web.json_response({"id": job_id})

    async with web_server(respond) as (url, server):
        transport = HttpTransport(url, timeout=10.0)
        try:
            await asyncio.wait_for(
                asyncio.gather(*(transport.deliver(f"job-{n}", {}, {}) for n in range(in_flight))), 10
            )
        finally:
            await transport.close()
    assert len(arrived) == in_flight and len(server.requests) == in_flight


async def test_a_borrowed_session_stays_open_and_must_not_trust_the_environment() -> None:
    async with web_server(json_answer(200, {"id": "a"})) as (url, _):
        async with aiohttp.ClientSession() as session:
            transport = HttpTransport(url, session=session)
            await transport.deliver("a", None, {})
            await transport.close()
            assert not session.closed
        async with aiohttp.ClientSession(trust_env=True) as trusting:
            with pytest.raises(ValueError, match="trust_env"):
                HttpTransport(url, session=trusting)


async def test_a_borrowed_session_s_own_settings_do_not_change_the_rules() -> None:
    async with (
        web_server(json_answer(404, {"id": "a"})) as (url, _),
        aiohttp.ClientSession(raise_for_status=True) as strict,
    ):
        transport = HttpTransport(url, session=strict)
        with pytest.raises(Permanent):  # not a ClientResponseError taken for a broken connection
            await transport.deliver("a", None, {})


@pytest.mark.parametrize(
    "respond",
    [
        json_answer(200, {"id": "other", "status": "applied"}),
        json_answer(200, {"status": "applied"}),
        json_answer(200, [{"id": "job-1"}]),
        json_answer(200, "job-1"),
        raw_answer(200, b"OK"),
        raw_answer(200, b'{"id": "job-1"'),
        raw_answer(200, b"\xff\xfe{}"),
        raw_answer(200, b""),
        json_answer(201, {"id": "job-1"}),
        json_answer(202, {"id": "job-1"}),
        raw_answer(204, b""),
    ],
    ids=["wrong-id", "no-id", "array", "string", "text", "truncated", "not-utf8", "empty", "201", "202", "204"],
)
async def test_answers_that_prove_nothing_are_bad_acks(respond: Handler) -> None:
    async with web_server(respond) as (url, _):
        transport = HttpTransport(url)
        with pytest.raises(BadAck):
            await transport.deliver("job-1", {"qty": 1}, {})
        await transport.close()


# --- refusals: permanent and retryable --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 422])
async def test_other_4xx_is_permanent(status: int) -> None:
    async with web_server(json_answer(status, {"id": "job-1"})) as (url, _):
        transport = HttpTransport(url)
        with pytest.raises(Permanent):
            await transport.deliver("job-1", {}, {})
        await transport.close()


@pytest.mark.parametrize(
    ("status", "retry_after", "delay_ms"),
    [
        (429, "3", 3000),
        (429, "0", 0),
        (429, "120", 60_000),
        (503, "99999999999999999999", 60_000),
        (503, None, None),
        (500, "soon", None),
        (502, None, None),
        (504, None, None),
        (408, None, None),
    ],
)
async def test_busy_and_5xx_are_retryable_with_the_capped_retry_after(
    status: int, retry_after: str | None, delay_ms: int | None
) -> None:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    async with web_server(json_answer(status, {"id": "job-1"}, **headers)) as (url, _):
        transport = HttpTransport(url, retry_after_cap_ms=60_000)
        with pytest.raises(Retryable) as caught:
            await transport.deliver("job-1", {}, {})
        await transport.close()
    assert caught.value.delay_ms == delay_ms


async def test_retry_after_as_an_http_date_is_honoured_and_capped() -> None:
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    async with web_server(json_answer(429, {}, **{"Retry-After": soon})) as (url, _):
        transport = HttpTransport(url)
        with pytest.raises(Retryable) as caught:
            await transport.deliver("job-1", {}, {})
        assert caught.value.delay_ms is not None and 25_000 <= caught.value.delay_ms <= 30_000
        capped = HttpTransport(url, retry_after_cap_ms=5000)
        with pytest.raises(Retryable) as caught:
            await capped.deliver("job-1", {}, {})
        assert caught.value.delay_ms == 5000
        await transport.close()
        await capped.close()


def test_retry_after_parsing_is_pure() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 10, usegmt=True)
    past = email.utils.formatdate(now - 10, usegmt=True)
    assert retry_after_ms(date, now=now, cap_ms=60_000) == 10_000
    assert retry_after_ms(past, now=now, cap_ms=60_000) == 0
    assert retry_after_ms(date, now=now, cap_ms=1000) == 1000
    assert retry_after_ms(" 7 ", now=now, cap_ms=60_000) == 7000
    assert retry_after_ms("-1", now=now, cap_ms=60_000) is None
    assert retry_after_ms("1.5", now=now, cap_ms=60_000) is None
    assert retry_after_ms("٣", now=now, cap_ms=60_000) is None  # a non-ASCII digit is not delay-seconds
    assert retry_after_ms(None, now=now, cap_ms=60_000) is None


# --- redirects are never followed -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirects_are_bad_acks_and_the_target_is_never_contacted(status: int) -> None:
    async with web_server(json_answer(200, {"id": "job-1"})) as (target_url, target):
        async with web_server(raw_answer(status, b"", Location=target_url)) as (url, _):
            transport = HttpTransport(url)
            with pytest.raises(BadAck, match="redirect"):
                await transport.deliver("job-1", {}, {})
            await transport.close()
        assert target.requests == []


# --- bounded reads and the total deadline -----------------------------------------------------------------------


async def test_an_announced_oversized_answer_is_a_bad_ack() -> None:
    big = b'{"id":"job-1","pad":"' + b"x" * 200_000 + b'"}'
    async with web_server(raw_answer(200, big, **{"Content-Type": "application/json"})) as (url, _):
        transport = HttpTransport(url, max_response_bytes=65536)
        with pytest.raises(BadAck, match="65536"):
            await transport.deliver("job-1", {}, {})
        roomy = HttpTransport(url, max_response_bytes=300_000)
        await roomy.deliver("job-1", {}, {})  # the same answer within the cap is an ACK
        await transport.close()
        await roomy.close()


async def endless_chunked_body(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await server.write(
        writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b'{"id":"job-1","pad":"' + b"x" * 65536
    while True:
        await server.write(writer, b"%x\r\n%s\r\n" % (len(chunk), chunk))


async def endless_unframed_body(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await server.write(writer, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n[")
    while True:
        await server.write(writer, b"0," * 32768)


@pytest.mark.parametrize("script", [endless_chunked_body, endless_unframed_body], ids=["chunked", "until-close"])
async def test_an_endless_answer_is_cut_at_the_cap(script: Script) -> None:
    async with RawServer(script) as server:
        transport = HttpTransport(server.url, timeout=10.0, max_response_bytes=65536)
        started = time.monotonic()
        with pytest.raises(BadAck, match="more than 65536"):
            await transport.deliver("job-1", {}, {})
        assert time.monotonic() - started < 5.0  # long before the deadline: it stopped reading, not timed out
        await transport.close()
        # The stream only ends when the client drops the connection; what got written is socket buffers at most.
        await asyncio.wait_for(server.finished.wait(), 5.0)
        assert server.bytes_written < 32 * 1024 * 1024


async def drip_body(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await server.write(writer, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n")
    while True:  # a byte every 50 ms: each read is quick, the whole answer never is
        await server.write(writer, b" ")
        await asyncio.sleep(0.05)


async def drip_headers(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await server.write(writer, b"HTTP/1.1 200 OK\r\n")
    while True:
        await server.write(writer, b"X-Pad: 1\r\n")
        await asyncio.sleep(0.05)


async def silence(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.Event().wait()


@pytest.mark.parametrize("script", [drip_body, drip_headers, silence])
async def test_the_deadline_bounds_the_whole_exchange(script: Script) -> None:
    async with RawServer(script) as server:
        transport = HttpTransport(server.url, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(Retryable, match=r"within 0\.5 s") as caught:
            await transport.deliver("job-1", {}, {})
        elapsed = time.monotonic() - started
        await transport.close()
    assert 0.45 <= elapsed <= 1.0
    assert caught.value.delay_ms is None


async def hang_up(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)


async def garbage(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await server.write(writer, b"this is not HTTP\r\n\r\n")


@pytest.mark.parametrize("script", [hang_up, garbage])
async def test_a_broken_exchange_is_retryable(script: Script) -> None:
    async with RawServer(script) as server:
        transport = HttpTransport(server.url, timeout=5.0)
        with pytest.raises(Retryable):
            await transport.deliver("job-1", {}, {})
        await transport.close()


async def test_a_refused_connection_is_retryable() -> None:
    async with RawServer(hang_up) as server:
        url = server.url
    transport = HttpTransport(url, timeout=5.0)  # nothing listens there any more
    with pytest.raises(Retryable):
        await transport.deliver("job-1", {}, {})
    await transport.close()


# --- environment and allowlist ----------------------------------------------------------------------------------

PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


async def test_proxy_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    async with RawServer(hang_up) as proxy, web_server(json_answer(200, {"id": "job-1"})) as (url, server):
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        transport = HttpTransport(url)
        await transport.deliver("job-1", {}, {})
        await transport.close()
        assert len(server.requests) == 1
        assert proxy.connections == 0


@pytest.mark.parametrize(
    ("template", "allowed"),
    [
        ("http://10.0.0.1:{port}/events", None),
        ("http://example.com:{port}/events", None),
        ("http://0.0.0.0:{port}/events", None),
        ("http://127.1:{port}/events", None),
        ("http://2130706433:{port}/events", None),
        ("http://0x7f.0.0.1:{port}/events", None),
        ("http://[::ffff:127.0.0.1]:{port}/events", None),
        ("http://localhost.:{port}/events", None),
        ("http://user:secret@127.0.0.1:{port}/events", None),
        ("http://user@127.0.0.1:{port}/events", None),
        ("ftp://127.0.0.1:{port}/events", None),
        ("file:///etc/passwd", None),
        ("/events", None),
        ("http://127.0.0.1:{port}/events", ["receiver.internal"]),
        ("http://127.0.0.2:{port}/events", ["127.0.0.1"]),
    ],
)
async def test_urls_outside_the_allowlist_are_refused_before_any_connection(
    template: str, allowed: list[str] | None
) -> None:
    async with RawServer(hang_up) as server:
        with pytest.raises(ValueError):
            HttpTransport(template.format(port=server.port), allowed_hosts=allowed)
        assert server.connections == 0
        transport = HttpTransport(server.url, timeout=5.0)  # the counter works: an allowed URL connects
        with pytest.raises(Retryable):
            await transport.deliver("job-1", {}, {})
        await transport.close()
        assert server.connections == 1


def test_the_allowlist_accepts_loopback_names_networks_and_listed_hosts() -> None:
    for url in ("http://127.0.0.1/e", "http://127.5.6.7:81/e", "https://LOCALHOST/e", "http://[::1]:9/e"):
        assert HttpTransport(url).url.host is not None
    assert HttpTransport("https://receiver.internal/e", allowed_hosts=["Receiver.Internal"]).url.port == 443
    assert HttpTransport("http://10.1.2.3/e", allowed_hosts=["10.0.0.0/8"]).url.host == "10.1.2.3"
    with pytest.raises(ValueError, match="one string"):
        HttpTransport("http://127.0.0.1/e", allowed_hosts="127.0.0.1")


# --- arguments ---------------------------------------------------------------------------------------------------


async def test_bad_arguments_fail_before_any_connection() -> None:
    async with RawServer(hang_up) as server:
        transport = HttpTransport(server.url)
        with pytest.raises(ValueError, match="job_id"):
            await transport.deliver("not an id", {}, {})
        with pytest.raises(ValueError, match="CR"):
            await transport.deliver("job-1", {}, {"X-Evil": "a\r\nHost: elsewhere"})
        with pytest.raises(ValueError, match="set by the transport"):
            await transport.deliver("job-1", {}, {"Idempotency-Key": "other"})
        with pytest.raises(ValueError, match="set by the transport"):
            await transport.deliver("job-1", {}, {"Content-Length": "0"})
        with pytest.raises(Permanent, match="not JSON"):
            await transport.deliver("job-1", {"x": float("nan")}, {})
        with pytest.raises(Permanent, match="not JSON"):
            await transport.deliver("job-1", {"x": {1, 2}}, {})
        await transport.close()
        assert server.connections == 0
    bad_timeouts = ({"timeout": 0}, {"timeout": float("inf")}, {"timeout": True}, {"timeout": 3601})
    for bad in (*bad_timeouts, {"max_response_bytes": 0}):
        with pytest.raises(ValueError):
            HttpTransport("http://127.0.0.1/e", **bad)


async def test_an_idempotency_key_equal_to_the_job_id_may_be_passed() -> None:
    async with web_server(json_answer(200, {"id": "job-1"})) as (url, server):
        transport = HttpTransport(url)
        await transport.deliver("job-1", [1, 2], {"Idempotency-Key": "job-1", "Asyncq-Token": "3"})
        await transport.close()
    [(_, headers, body)] = server.requests
    assert headers["Idempotency-Key"] == "job-1" and body == b"[1,2]"


async def test_an_answer_that_arrives_before_its_request_is_not_an_ack() -> None:
    """A receiver answers job-a, then writes a 200 for job-second on the idle kept-alive connection before any
    request for it: that must not count as job-second's ACK (aiohttp would read it as the next answer)."""
    requests: list[tuple[int, bytes]] = []  # (connection number, request line)
    unsolicited_written, released = asyncio.Event(), asyncio.Event()
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                requests.append((number, head.split(b"\r\n", 1)[0]))
                key = re.search(rb"(?i)idempotency-key: *([\w-]+)", head).group(1).decode()  # type: ignore[union-attr]
                if number == 1 and key == "job-a":
                    writer.write(_raw_json_response({"id": "job-a"}))
                    await writer.drain()
                    await released.wait()  # the client has its answer; the connection sits idle in its pool
                    writer.write(_raw_json_response({"id": "job-second"}))  # nobody asked for this one
                    await writer.drain()
                    unsolicited_written.set()
                else:
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = HttpTransport(f"http://127.0.0.1:{port}/events", timeout=5.0)
    try:
        await transport.deliver("job-a", {}, {})
        released.set()
        await asyncio.wait_for(unsolicited_written.wait(), 5)
        connector = transport._open_session().connector
        idle = connector._conns.values()  # type: ignore[union-attr]
        await eventually(  # the parser holds the stray bytes
            lambda: any(proto.should_close for conns in idle for proto, _ in conns),
            "the stray answer to reach the idle connection",
            timeout=5,
        )
        with pytest.raises(Retryable, match="503"):  # the real answer to the real request
            await transport.deliver("job-second", {}, {})
    finally:
        await transport.close()
        server.close()
        await server.wait_closed()
    assert [n for n, _ in requests] == [1, 2]  # job-second went out on a fresh connection


def _raw_json_response(body: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
