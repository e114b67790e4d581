"""Operators see dependencies and groups (docs/dependencies.md): ``asyncq jobs --waiting`` (what each job waits for),
``asyncq groups`` (progress, one group with its members), the dashboard's sections and the metrics, on a real queue
file (the CLI as a child process, the dashboard over real HTTP on loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cli_support import run_cli, run_json
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from asyncq.core.dependencies import Dependency
from asyncq.core.groups import group_callback_id
from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue
from asyncq.web.dashboard import make_dashboard_app
from asyncq.web.metrics import QueueCollector

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    """fetch-1 done; fetch-2 leased; merge waits for fetch-2 (and a redriven wait edge on ghosted); a group
    ``import`` of 3 members (one done), sealed with a callback; a group ``later`` not sealed."""
    path = tmp_path / "queue.db"
    async with await Queue.open(path, clock=lambda: T0) as queue:
        await queue.enqueue_many([JobSpec("fetch-1", {}), JobSpec("fetch-2", {})])
        [first, second] = await queue.claim("w1", limit=2, lease=600)
        await queue.finish(first, "ok")
        await queue.enqueue("merge", {}, after=["fetch-1", Dependency("fetch-2", on_dead="wait")])
        async with queue.transaction() as tx:
            for n in range(3):
                await tx.enqueue(f"row-{n}", {"n": n}, queue="rows", group="import")
            await tx.seal_group("import", callback=JobSpec(group_callback_id("import"), {}, queue="reports"))
        await queue.enqueue("later-1", {}, queue="rows", group="later")
        [row] = await queue.claim("w1", queue="rows", lease=600)
        await queue.finish(row, "ok")
        assert second.id == "fetch-2"
    return path


def test_jobs_waiting_shows_what_each_waits_for(db: Path) -> None:
    data = run_json("jobs", "--waiting", "--db", "queue.db", cwd=db.parent)
    assert [(job["id"], job["waits"]) for job in data["jobs"]] == [("merge", 1), ("group-import", 1)]
    merge = data["jobs"][0]["waits_for"]
    assert merge == {"dependencies": [
        {"id": "fetch-1", "status": "done", "on_dead": "dead", "state": "met"},
        {"id": "fetch-2", "status": "leased", "on_dead": "wait", "state": "open"},
    ], "group": None}  # fmt: skip
    assert data["jobs"][1]["waits_for"]["group"] == "import"
    text = run_cli("jobs", "--waiting", "--db", "queue.db", cwd=db.parent)
    assert text.returncode == 0 and "fetch-2 (leased, wait)" in text.stdout and "group import" in text.stdout
    assert "fetch-1" not in text.stdout  # met: no longer waited for
    refused = run_cli("jobs", "--waiting", "--status", "dead", "--db", "queue.db", cwd=db.parent)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


def test_groups_show_their_progress_and_one_group_its_members(db: Path) -> None:
    listed = run_json("groups", "--db", "queue.db", cwd=db.parent)["groups"]
    assert [(g["name"], g["members"], g["done"], g["running"], g["sealed"], g["callback_status"]) for g in listed] == [
        ("import", 3, 1, 2, True, "waiting"), ("later", 1, 0, 1, False, None),
    ]  # fmt: skip
    one = run_json("groups", "import", "--db", "queue.db", cwd=db.parent)
    assert [(job["id"], job["status"], job["group"]) for job in one["members"]] == [
        ("row-0", "done", "import"), ("row-1", "pending", "import"), ("row-2", "pending", "import"),
    ]  # fmt: skip
    text = run_cli("groups", "--db", "queue.db", cwd=db.parent).stdout
    assert "import" in text and "sealed" in text and "2 group(s)" in text
    missing = run_cli("groups", "nobody", "--db", "queue.db", cwd=db.parent)
    assert missing.returncode == 1 and "no group 'nobody'" in missing.stderr


@pytest.fixture
async def page(db: Path) -> AsyncIterator[str]:
    app = make_dashboard_app(db, token="t", clock=lambda: T0 + 1, sample_seconds=3600)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{runner.addresses[0][1]}/") as got,
        ):
            assert got.status == 200
            yield await got.text()
    finally:
        await runner.cleanup()


async def test_the_dashboard_shows_waiting_jobs_and_groups(page: str) -> None:
    assert "<h2>Waiting jobs</h2>" in page and "<h2>Groups</h2>" in page
    assert "<td>merge</td>" in page and "fetch-2 (leased)" in page and "group import" in page
    assert "<td>import</td><td>sealed</td>" in page and "<td>later</td><td>open</td>" in page


async def test_metrics_count_waiting_jobs_and_open_groups(db: Path) -> None:
    registry = CollectorRegistry()
    registry.register(QueueCollector(db, clock=lambda: T0 + 1))
    text = generate_latest(registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
               for s in f.samples}  # fmt: skip
    assert samples[("asyncq_jobs", (("status", "waiting"),))] == 2
    assert samples[("asyncq_groups_open", ())] == 2
