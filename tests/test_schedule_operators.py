"""Operators see schedules (issue 29, point 5): ``asyncq schedules`` lists them (next run, last tick, paused, the
recent skipped ticks; ``--events`` every event) and pauses, resumes or runs one now with a note (usage errors exit 2
in one line, a refused move exits 1 in one line, nothing changed); the dashboard's Schedules section; the
``asyncq_schedule_*`` metrics read from the stored rows at scrape time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp import web
from cli_support import run_cli, run_json
from prometheus_client import CollectorRegistry
from test_dashboard import TOKEN, get, table
from test_metrics import scrape_registry, value

from asyncq.core.schedules import ScheduleSpec, schedule_job_id
from asyncq.queue import Queue
from asyncq.web.dashboard import make_dashboard_app
from asyncq.web.metrics import QueueCollector

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
S = 1000


async def seeded(path: Path, clock: list[int]) -> Queue:
    """A queue with two schedules: ``beat`` (every 10 s) fired once, then skipped once (its run is pending), and
    ``nightly`` (a cron in Berlin), paused."""
    queue = await Queue.open(path, clock=lambda: clock[0])
    specs = [
        ScheduleSpec("beat", {"n": 1}, every=10),
        ScheduleSpec("nightly", {}, cron="30 2 * * *", tz="Europe/Berlin"),
    ]
    await queue.declare_schedules(specs)
    await queue.pause_schedule("nightly", note="<b>holiday</b>", by="ops")
    clock[0] += 10 * S
    await queue.run_schedules()
    clock[0] += 10 * S
    await queue.run_schedules()
    return queue


async def test_the_command_lists_pauses_resumes_and_runs_a_schedule_now(tmp_path: Path) -> None:
    clock = [T0]
    await (await seeded(tmp_path / "q.db", clock)).close()
    listed = run_json("schedules", "--db", "q.db", cwd=tmp_path)
    beat, nightly = listed["schedules"]
    assert (beat["name"], beat["when"], beat["last_tick"], beat["next_tick"]) == (
        "beat", "every 10s", T0 + 20 * S, T0 + 30 * S
    )  # fmt: skip
    assert (beat["ticks_fired"], beat["ticks_skipped"], beat["body"]) == (1, 1, {"n": 1})
    assert (nightly["paused_by"], nightly["pause_note"], nightly["when"]) == (
        "ops", "<b>holiday</b>", "cron 30 2 * * * (Europe/Berlin)"
    )  # fmt: skip
    assert [(e["schedule"], e["kind"], e["tick_ms"]) for e in listed["skipped"]] == [("beat", "overlap", T0 + 20 * S)]
    text = run_cli("schedules", "--db", "q.db", cwd=tmp_path).stdout
    assert re.search(r"^beat +every 10s +running", text, re.M) and re.search(r"^nightly .* paused", text, re.M)
    assert "nightly: paused" in text and "overlap" in text
    moved = run_json("schedules", "resume", "nightly", "--note", "back", "--by", "me", "--db", "q.db", cwd=tmp_path)
    assert (moved["event"]["kind"], moved["event"]["actor"], moved["event"]["note"]) == ("resume", "me", "back")
    now = run_json("schedules", "run-now", "beat", "--note", "backfill", "--db", "q.db", cwd=tmp_path)
    assert now["event"]["job_id"].startswith("sch-beat-now-")
    every = run_json("schedules", "list", "beat", "--events", "--db", "q.db", cwd=tmp_path)
    assert [e["kind"] for e in every["events"]] == ["run_now", "overlap", "declared"]
    assert [s["name"] for s in every["schedules"]] == ["beat"]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["schedules", "pause", "beat"], 2, "needs a NAME and --note"),
        (["schedules", "pause", "--note", "x"], 2, "needs a NAME and --note"),
        (["schedules", "list", "--note", "x"], 2, "--note and --by go with"),
        (["schedules", "pause", "beat", "--note", "x", "--events"], 2, "--events goes with list"),
        (["schedules", "explode"], 2, "invalid choice"),
        (["schedules", "pause", "nosuch", "--note", "x"], 1, "no schedule named 'nosuch'"),
        (["schedules", "resume", "beat", "--note", "x"], 1, "is not paused"),
        (["schedules", "list", "nosuch"], 1, "no schedule named 'nosuch'"),
    ],
)
async def test_bad_usage_and_refused_moves_are_one_line_and_change_nothing(
    tmp_path: Path, argv: list[str], code: int, message: str
) -> None:
    clock = [T0]
    await (await seeded(tmp_path / "q.db", clock)).close()
    before = run_json("schedules", "--events", "--db", "q.db", cwd=tmp_path)
    done = run_cli(*argv, "--db", "q.db", cwd=tmp_path)
    assert done.returncode == code and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    after = run_json("schedules", "--events", "--db", "q.db", cwd=tmp_path)
    assert (after["schedules"], after["events"]) == (before["schedules"], before["events"])


async def test_the_dashboard_shows_each_schedule_and_the_skipped_ticks(tmp_path: Path) -> None:
    clock = [T0]
    await (await seeded(tmp_path / "q.db", clock)).close()
    app = make_dashboard_app(tmp_path / "q.db", token=TOKEN, clock=lambda: clock[0], sample_seconds=3600)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        status, page, _headers = await get(f"http://127.0.0.1:{runner.addresses[0][1]}/")
    finally:
        await runner.cleanup()
    assert status == 200 and "<h2>Schedules</h2>" in page
    schedules = table(page, "schedules")
    assert 'data-schedule="beat"' in schedules and "every 10s" in schedules
    assert "paused by ops: &lt;b&gt;holiday&lt;/b&gt;" in schedules and "<b>holiday" not in page  # escaped
    assert "overlap" in table(page, "skipped-ticks")


async def test_the_metrics_read_each_schedules_ticks_next_run_and_pause_at_scrape_time(tmp_path: Path) -> None:
    clock = [T0]
    queue = await seeded(tmp_path / "q.db", clock)
    try:
        registry = CollectorRegistry()
        registry.register(QueueCollector(tmp_path / "q.db", clock=lambda: clock[0]))
        samples = await scrape_registry(registry)
        assert value(samples, "asyncq_schedule_ticks_total", schedule="beat", outcome="fired") == 1
        assert value(samples, "asyncq_schedule_ticks_total", schedule="beat", outcome="skipped") == 1
        assert value(samples, "asyncq_schedule_ticks_total", schedule="nightly", outcome="missed") == 0
        assert value(samples, "asyncq_schedule_next_run_seconds", schedule="beat") == 10.0
        assert value(samples, "asyncq_schedule_paused", schedule="nightly") == 1
        assert value(samples, "asyncq_schedule_paused", schedule="beat") == 0
        assert await queue.get(schedule_job_id("beat", T0 + 10 * S)) is not None
    finally:
        await queue.close()
