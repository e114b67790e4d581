"""Step 8's story with real processes: a deliverer dies right after a real HTTP receiver committed the
effect, and a second deliverer recovers the job; two deliverers racing for one job; processes killed
inside and after the claim's transaction, and in the middle of ``send``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from asyncq.lab.lease import claim, enqueue, open_queue

try:
    import lease_children as kids
except ImportError:  # tests/ imported as a package
    from tests import lease_children as kids

pytestmark = pytest.mark.timeout(60)


# --- the receiver: inbox + stock in one transaction, de-duplicated by id ---------------------------


class Receiver(ThreadingHTTPServer):
    """Commits the inbox row and the stock change together; the same id with the same qty has no second
    effect. It SIGKILLs a deliverer listed in ``kill_after_commit`` after COMMIT, before answering."""

    daemon_threads = True

    def __init__(self, inbox: Path) -> None:
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        self.inbox, self.lock = inbox, threading.Lock()
        self.requests: list[tuple[int, dict[str, Any]]] = []
        self.kill_after_commit: set[int] = set()
        self.killed: list[int] = []
        con = sqlite3.connect(inbox, isolation_level=None)
        con.execute("CREATE TABLE inbox (id TEXT PRIMARY KEY, qty INTEGER NOT NULL)")
        con.execute("CREATE TABLE stock (item TEXT PRIMARY KEY, qty INTEGER NOT NULL)")
        con.execute("INSERT INTO stock VALUES ('snacks', 0)")
        con.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/deliver"

    def receive(self, pid: int, message: dict[str, Any]) -> int:
        """Apply ``message`` once; the HTTP status to answer (0: the deliverer was killed instead)."""
        with self.lock:
            self.requests.append((pid, message))
        if type(message) is not dict or set(message) != {"id", "qty"}:
            return 400
        con = sqlite3.connect(self.inbox, isolation_level=None, timeout=5)
        try:
            con.execute("BEGIN IMMEDIATE")
            stored = con.execute("SELECT qty FROM inbox WHERE id = ?", (message["id"],)).fetchone()
            if stored is None:
                con.execute("INSERT INTO inbox VALUES (?, ?)", (message["id"], message["qty"]))
                con.execute("UPDATE stock SET qty = qty + ? WHERE item = 'snacks'", (message["qty"],))
            con.execute("COMMIT" if stored is None or stored[0] == message["qty"] else "ROLLBACK")
        finally:
            con.close()
        if stored is not None and stored[0] != message["qty"]:
            return 409
        with self.lock:
            doomed = pid in self.kill_after_commit
            self.kill_after_commit.discard(pid)
        if doomed:
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
            return 0
        return 200

    def state(self) -> tuple[list[tuple[Any, ...]], int]:
        con = sqlite3.connect(self.inbox)
        try:
            return con.execute("SELECT * FROM inbox").fetchall(), con.execute("SELECT qty FROM stock").fetchone()[0]
        finally:
            con.close()


class ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = self.server.receive(int(self.headers["X-Deliverer-Pid"]), message)
        if status == 0:
            self.close_connection = True  # killed after COMMIT: it never gets an answer
            return
        body = json.dumps({"ok": status == 200}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    server = Receiver(tmp_path / "inbox.db")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    path = tmp_path / "queue.db"
    con = open_queue(path)
    assert enqueue(con, {"id": "order-1", "qty": 3}, 1000, 60_000) is True
    con.close()
    return path


def outcome(reader: kids.Lines) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What a deliverer sent (``sent``/``sending`` lines) and its final line (result or error)."""
    sent = []
    while True:
        line = reader.json(20)
        if "result" in line or "error" in line:
            return sent, line
        sent.append(line)


def job(path: Path) -> dict[str, Any]:
    found = kids.row(path, "order-1")
    assert found is not None
    return found


# --- the story ------------------------------------------------------------------------------------


def test_first_deliverer_killed_after_the_receiver_committed_second_one_recovers(
    tmp_path: Path, queue: Path, receiver: Receiver
) -> None:
    base = {"db": str(queue), "send": "http", "url": receiver.url, "wait_go": True}
    first = kids.spawn("deliver", {**base, "owner": "first", "clocks": [1000, 1001]}, tmp_path)
    try:
        receiver.kill_after_commit.add(first.pid)
        kids.send_line(first, "go")
        assert first.wait(timeout=20) == -signal.SIGKILL, kids.stderr_of(tmp_path)
    finally:
        kids.finish_child(first)
    assert receiver.killed == [first.pid]
    assert receiver.state() == ([("order-1", 3)], 3)  # the effect happened ...
    row = job(queue)  # ... but the queue still shows the first lease, unfinished
    assert (row["status"], row["owner"], row["token"], row["lease_until"]) == ("leased", "first", 1, 2000)

    second = kids.spawn("deliver", {**base, "owner": "second", "clocks": [2000, 2001]}, tmp_path)
    try:
        kids.send_line(second, "go")
        _, last = outcome(kids.Lines(second, tmp_path))
        assert kids.finish_child(second) == 0, kids.stderr_of(tmp_path)
    finally:
        kids.finish_child(second)
    assert last == {"result": {"id": "order-1", "token": 2, "status": "done"}}
    assert [(pid, message) for pid, message in receiver.requests] == [
        (first.pid, {"id": "order-1", "qty": 3}),
        (second.pid, {"id": "order-1", "qty": 3}),
    ]
    assert receiver.state() == ([("order-1", 3)], 3)  # two requests, one inbox row, one effect
    row = job(queue)
    assert (row["status"], row["token"], row["attempts"], row["owner"], row["reason"]) == ("done", 2, 2, None, None)


@pytest.mark.parametrize("round_no", range(3))
def test_two_deliverers_at_once_exactly_one_succeeds(tmp_path: Path, queue: Path, round_no: int) -> None:
    release_read, release_write = os.pipe()
    children = []
    try:
        for owner in ("left", "right"):
            config = {"db": str(queue), "owner": owner, "clocks": [1000, 1001], "send": "true"}
            children.append(
                kids.spawn("deliver", {**config, "release_fd": release_read}, tmp_path, pass_fds=[release_read])
            )
        os.close(release_read)
        release_read = -1
        readers = [kids.Lines(child, tmp_path) for child in children]
        for reader in readers:
            assert reader.read(20) == '"ready"'
        os.write(release_write, b"xx")
        outcomes = [outcome(reader) for reader in readers]
        for child in children:
            assert kids.finish_child(child) == 0, kids.stderr_of(tmp_path)
    finally:
        os.close(release_write)
        if release_read >= 0:
            os.close(release_read)
        for child in children:
            kids.finish_child(child)
    results = sorted((last["result"] for _, last in outcomes), key=lambda r: r is not None)
    assert results == [None, {"id": "order-1", "token": 1, "status": "done"}]
    assert sum(len(sent) for sent, _ in outcomes) == 1
    row = job(queue)
    assert (row["status"], row["token"], row["attempts"]) == ("done", 1, 1)


# --- kills before and after COMMIT ----------------------------------------------------------------


def swept_queue(queue: Path) -> None:
    """Add a row that the claim's sweep kills at 2000, so atomicity covers the sweep too."""
    con = open_queue(queue)
    assert enqueue(con, {"id": "late", "qty": 1}, 1000, 500) is True
    con.close()


def expected_claim(queue: Path, owner: str, now: int) -> dict[str, list[tuple[Any, ...]]]:
    twin = queue.with_name("twin.db")
    shutil.copyfile(queue, twin)
    con = open_queue(twin)
    try:
        assert claim(con, owner, now) is not None
        return kids.dump(con)
    finally:
        con.close()


@pytest.mark.parametrize("point", ["after-claim", "after-commit"])
def test_sigkill_inside_and_after_the_claim_transaction(tmp_path: Path, queue: Path, point: str) -> None:
    swept_queue(queue)
    before = kids.dump(queue)
    after = expected_claim(queue, "w", 2000)
    child = kids.spawn("hold", {"db": str(queue), "owner": "w", "now": 2000, "point": point}, tmp_path)
    try:
        assert kids.Lines(child, tmp_path).json(20) == point
        probe = sqlite3.connect(queue, isolation_level=None, timeout=0)
        try:  # inside the transaction the child holds the write lock; after COMMIT it holds none
            if point == "after-claim":
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    probe.execute("BEGIN IMMEDIATE")
            else:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
        finally:
            probe.close()
        child.kill()
        assert child.wait(timeout=20) == -signal.SIGKILL
    finally:
        kids.finish_child(child)
    assert kids.dump(queue) == (before if point == "after-claim" else after)
    con = open_queue(queue)  # and the queue goes on
    try:
        ticket = claim(con, "v", 2000 if point == "after-claim" else 3000)
        assert ticket is not None and ticket["id"] == "order-1"
        assert ticket["token"] == (1 if point == "after-claim" else 2)
        assert kids.row(con, "late")["reason"] == "deadline"  # type: ignore[index]
    finally:
        con.close()


def test_deliverer_killed_during_send_holds_no_lock_and_is_recovered(tmp_path: Path, queue: Path) -> None:
    child = kids.spawn(
        "deliver", {"db": str(queue), "owner": "first", "clocks": [1000, 1001], "send": "block"}, tmp_path
    )
    try:
        assert kids.Lines(child, tmp_path).json(20) == {"sending": {"id": "order-1", "qty": 3}}
        probe = sqlite3.connect(queue, isolation_level=None, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")  # no lock is held while sending
            probe.execute("ROLLBACK")
        finally:
            probe.close()
        child.kill()
        assert child.wait(timeout=20) == -signal.SIGKILL
    finally:
        kids.finish_child(child)
    row = job(queue)
    assert (row["status"], row["owner"], row["token"], row["lease_until"]) == ("leased", "first", 1, 2000)

    results = []
    for owner, clocks in [("early", [1999]), ("late", [2000, 2005])]:
        again = kids.spawn("deliver", {"db": str(queue), "owner": owner, "clocks": clocks, "send": "true"}, tmp_path)
        try:
            results.append(outcome(kids.Lines(again, tmp_path)))
            assert kids.finish_child(again) == 0, kids.stderr_of(tmp_path)
        finally:
            kids.finish_child(again)
    assert results == [
        ([], {"result": None}),  # the lease has not expired yet: nothing to do
        ([{"sent": {"id": "order-1", "qty": 3}}], {"result": {"id": "order-1", "token": 2, "status": "done"}}),
    ]
    row = job(queue)
    assert (row["status"], row["token"], row["attempts"], row["available_at"]) == ("done", 2, 2, 2005)
