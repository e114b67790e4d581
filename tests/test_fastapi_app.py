"""examples/fastapi_app.py driven through ``httpx.ASGITransport`` with its lifespan: the queue opens with the app,
the in-process worker runs the welcome task for real, the result comes back over HTTP, and shutdown is graceful."""

from __future__ import annotations

import importlib.util
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The example module loaded afresh on a database of this test's own."""
    monkeypatch.setenv("ASYNCQ_DB", str(tmp_path / "app.db"))
    spec = importlib.util.spec_from_file_location("fastapi_app_example", ROOT / "examples" / "fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


async def test_a_signup_commits_with_its_job_and_the_worker_sends_the_welcome(
    example: ModuleType, tmp_path: Path
) -> None:
    api = example.api
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            created = await client.post("/signups", json={"email": "ada@example.org"})
            assert created.status_code == 202
            job_id = created.json()["job"]
            again = await client.post("/signups", json={"email": "ada@example.org"})
            assert again.json()["job"] == job_id  # the same key and arguments: the same job, no second email
            done = await client.get(f"/jobs/{job_id}", params={"wait": 10})
            assert done.status_code == 200, done.text
            assert done.json() == {"email": "ada@example.org", "message": "Welcome aboard, ada@example.org!"}
            assert (await client.get("/jobs/no-such-job")).status_code == 404
            assert (await client.get("/jobs/not a job")).status_code == 404
            bad = await client.post("/signups", json={"email": 5})
            assert bad.status_code == 422
        queue = api.state.queue
    # after shutdown the queue is closed and the worker stopped: one signup, one job, done
    with pytest.raises(Exception):  # noqa: B017 - closed: any use fails
        await queue.stats()
    with sqlite3.connect(tmp_path / "app.db") as con:
        assert con.execute("SELECT email FROM signups").fetchall() == [("ada@example.org",)]
        assert con.execute("SELECT id, status, attempts FROM asyncq_jobs").fetchall() == [(job_id, "done", 1)]


async def test_a_job_still_pending_answers_409_without_a_worker(example: ModuleType, tmp_path: Path) -> None:
    api = example.api
    api.router.lifespan_context = example.tasks.lifespan(tmp_path / "app.db", worker=False)
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            job_id = (await client.post("/signups", json={"email": "bob@example.org"})).json()["job"]
            waiting = await client.get(f"/jobs/{job_id}", params={"wait": 0.1})
            assert waiting.status_code == 409
    with sqlite3.connect(tmp_path / "app.db") as con:
        assert con.execute("SELECT status FROM asyncq_jobs").fetchall() == [("pending",)]


async def test_the_console_is_mounted_at_ops_and_acts_through_the_asgi_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCQ_DB", str(tmp_path / "app.db"))
    monkeypatch.setenv("ASYNCQ_CONSOLE_OPERATOR_TOKEN", "operator-token-0123456789")
    spec = importlib.util.spec_from_file_location("fastapi_console_example", ROOT / "examples" / "fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    api = module.api
    async with api.router.lifespan_context(api):
        await api.state.queue.pause("emails", note="before the test", by="setup")
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            first = await client.get("/ops/")
            assert first.status_code == 303 and first.headers["location"] == "/ops/login"
            login = await client.get("/ops/login")
            csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', login.text)
            assert csrf is not None and 'href="/ops/static/console.css"' in login.text
            form = {"csrf": csrf.group(1), "name": "ada", "token": "operator-token-0123456789"}
            assert (await client.post("/ops/login", data=form)).status_code == 303
            overview = await client.get("/ops/")
            assert overview.status_code == 200 and 'id="resume-emails"' in overview.text
            csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', overview.text)  # a new session: a new token
            assert csrf is not None
            preview = await client.post("/ops/preview", data={"csrf": csrf.group(1), "action": "resume",
                                                              "queues": "emails"})  # fmt: skip
            digest = re.search(r'name="digest" value="([0-9a-f]{64})"', preview.text)
            assert preview.status_code == 200 and digest is not None
            confirm = {"csrf": csrf.group(1), "action": "resume", "queues": "emails", "count": "1", "confirm": "1",
                       "digest": digest.group(1), "note": "all clear"}  # fmt: skip
            done = await client.post("/ops/act", data=confirm)
            assert done.status_code == 303 and done.headers["location"].startswith("/ops/audit/")
        assert await api.state.queue.paused_queues() == []
        [move] = await api.state.queue.queue_audit("emails", limit=1)
        assert (move.action, move.actor, move.note) == ("resume", "ada", "all clear")
