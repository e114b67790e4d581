"""The crash stories of the outbox lab, with real publisher processes (``tests/outbox_child.py``).

1. The publisher dies with ``os._exit(73)`` right after a verified ACK: the sink applied the effect, the source
   item stays unsent; the next publisher re-sends the same id, the sink answers ``duplicate``, the item is sent.
2. The receiver commits, then hangs up without answering: the publisher errors, the item stays unsent; a re-send
   gets a valid duplicate ACK and the stock does not move.
3. A publisher killed while waiting for an answer holds no lock on the source.
"""

from __future__ import annotations

import http.server
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from outbox_child import dump

from asyncq.lab.outbox import accept, open_sink, open_source, receive, send_http, serve_sink

pytestmark = pytest.mark.timeout(30)

CHILD = Path(__file__).with_name("outbox_child.py")


def publisher(source: Path, url: str, *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(CHILD), str(source), url, *options]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=20)
    return process.returncode, out, err


def source_with(path: Path, *items: tuple[str, int]) -> None:
    con = open_source(path)
    try:
        for item_id, qty in items:
            accept(con, {"id": item_id, "qty": qty})
    finally:
        con.close()


def unsent(path: Path) -> list[str]:
    return [row[1] for row in dump(path)["outbox"] if row[3] == 0]


def test_the_publisher_dies_right_after_the_ack(tmp_path: Path) -> None:
    source, sink_path = tmp_path / "source.db", tmp_path / "sink.db"
    source_with(source, ("snack-7", 7))
    with serve_sink(sink_path) as sink:
        code, out, err = finish(publisher(source, sink.url, "--exit", "73"))
        assert code == 73, err
        assert out == ""  # it never got past the hook
        assert unsent(source) == ["snack-7"]
        assert dump(sink_path) == {"inbox": [("snack-7", 7)], "stock": [("snack", 7)]}

        code, out, err = finish(publisher(source, sink.url))
        assert code == 0, err
        assert json.loads(out) == {"marked": 1}
        assert sink.requests == 2
        assert sink.log == [("snack-7", "applied"), ("snack-7", "duplicate")]
    assert unsent(source) == []
    assert dump(sink_path) == {"inbox": [("snack-7", 7)], "stock": [("snack", 7)]}


def test_the_publisher_dies_after_the_second_ack_of_a_batch(tmp_path: Path) -> None:
    source, sink_path = tmp_path / "source.db", tmp_path / "sink.db"
    source_with(source, ("A", 1), ("B", 2), ("C", 4))
    with serve_sink(sink_path) as sink:
        code, _, err = finish(publisher(source, sink.url, "--exit", "73", "--at", "2"))
        assert code == 73, err
        assert unsent(source) == ["B", "C"]
        assert dump(sink_path)["stock"] == [("snack", 3)]

        code, out, err = finish(publisher(source, sink.url))
        assert (code, json.loads(out)) == (0, {"marked": 2}), err
        assert sink.log == [("A", "applied"), ("B", "applied"), ("B", "duplicate"), ("C", "applied")]
    assert unsent(source) == []
    assert dump(sink_path)["stock"] == [("snack", 7)]


class _CommitThenHangUp(http.server.BaseHTTPRequestHandler):
    """A receiver that applies the event in the sink, then closes the connection without a status line."""

    server: _HangUpServer

    def do_POST(self) -> None:
        event = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        con = open_sink(self.server.sink_path)
        try:
            self.server.outcomes.append(receive(con, event))
        finally:
            con.close()
        self.close_connection = True  # nothing is written: the publisher only sees the close

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HangUpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sink_path: Path) -> None:
        self.sink_path = sink_path
        self.outcomes: list[str] = []
        super().__init__(("127.0.0.1", 0), _CommitThenHangUp)


@pytest.fixture
def hang_up(tmp_path: Path) -> Iterator[_HangUpServer]:
    server = _HangUpServer(tmp_path / "sink.db")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_receiver_commits_then_hangs_up(tmp_path: Path, hang_up: _HangUpServer) -> None:
    source, sink_path = tmp_path / "source.db", tmp_path / "sink.db"
    source_with(source, ("snack-7", 7))
    rude_url = f"http://127.0.0.1:{hang_up.server_address[1]}/events"

    code, _, err = finish(publisher(source, rude_url))
    assert code == 1 and "RemoteDisconnected" in err
    assert hang_up.outcomes == ["applied"]
    assert unsent(source) == ["snack-7"]
    assert dump(sink_path) == {"inbox": [("snack-7", 7)], "stock": [("snack", 7)]}

    with serve_sink(sink_path) as sink:
        code, out, err = finish(publisher(source, sink.url))
        assert (code, json.loads(out)) == (0, {"marked": 1}), err
        assert sink.log == [("snack-7", "duplicate")]
    assert unsent(source) == []
    assert dump(sink_path) == {"inbox": [("snack-7", 7)], "stock": [("snack", 7)]}


def test_the_same_story_in_process(tmp_path: Path, hang_up: _HangUpServer) -> None:
    """send_http raises on the hang-up; the duplicate ACK from the real sink is accepted."""
    rude_url = f"http://127.0.0.1:{hang_up.server_address[1]}/events"
    with pytest.raises(ConnectionError):
        send_http(rude_url, {"id": "x", "qty": 3})
    with serve_sink(tmp_path / "sink.db") as sink:
        assert send_http(sink.url, {"id": "x", "qty": 3}) is True
        assert sink.log == [("x", "duplicate")]
    assert dump(tmp_path / "sink.db")["stock"] == [("snack", 3)]


def test_a_publisher_killed_while_waiting_holds_no_lock(tmp_path: Path) -> None:
    source = tmp_path / "source.db"
    source_with(source, ("snack-7", 7))
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/events"
    process = publisher(source, url, "--timeout", "60")
    try:
        assert select.select([listener], [], [], 10)[0], "the publisher never connected"
        conn, _ = listener.accept()
        conn.settimeout(10)
        request = b""
        while b'"qty":7}' not in request:  # the whole request arrived: the child is waiting for an answer
            chunk = conn.recv(4096)
            assert chunk, "the publisher hung up"
            request += chunk
        other = open_source(source)  # busy timeout 1 s: fails if the waiting publisher held any lock
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE outbox SET qty = qty WHERE id = 'snack-7'")
            other.execute("COMMIT")
        finally:
            other.close()
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=10) == -signal.SIGKILL
        conn.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.communicate()
        listener.close()
    assert unsent(source) == ["snack-7"]
