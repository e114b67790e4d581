"""The status page over real HTTP on loopback, on a real queue file: what it shows, and a redrive that needs
the token (refused ones change nothing, an accepted one writes exactly one audit row)."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cli_support import cli_env, run_cli
from waiting import eventually

from asyncq.core.jobs import AttemptError, Job, JobSpec
from asyncq.core.stats import Stats
from asyncq.queue import Queue
from asyncq.web.dashboard import DASHBOARD_KEY, Dashboard, make_dashboard_app
from asyncq.web.page import Snapshot, render_page, utc

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000_000
TOKEN = "open-sesame-42"
XSS = "<script>alert(1)</script>"


@pytest.fixture
def clock() -> list[int]:
    return [T0]


async def seed(queue: Queue) -> None:
    """pending 1, leased 1 (worker-7), done 2, dead 3 (permanent, exhausted, cancelled), one audit row."""
    jobs = [JobSpec("done-1", 1), JobSpec("done-2", 2), JobSpec("refused", {"html": XSS})]
    jobs += [JobSpec("tired", 4, max_attempts=1), JobSpec("busy", 5), JobSpec("unwanted", 6), JobSpec("waiting", 7)]
    await queue.enqueue_many(jobs)
    tickets = await queue.claim("worker-7", limit=5, lease=60)
    for ticket, outcome in zip(tickets, ("ok", "ok", "permanent", "retry"), strict=False):
        await queue.finish(ticket, outcome)
    await queue.cancel("unwanted", "not-needed")


@pytest.fixture
async def path(tmp_path: Path, clock: list[int]) -> Path:
    file = tmp_path / "queue.db"
    async with await Queue.open(file, clock=lambda: clock[0]) as queue:
        await seed(queue)
    return file


@pytest.fixture
async def server(path: Path, clock: list[int]) -> AsyncIterator[tuple[str, Dashboard]]:
    """The dashboard app on an ephemeral loopback port: its base URL and its state."""
    app = make_dashboard_app(path, token=TOKEN, clock=lambda: clock[0], sample_seconds=3600)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[DASHBOARD_KEY]
    finally:
        await runner.cleanup()


async def get(url: str, **headers: str) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.text(), response.headers


async def post_redrive(base: str, form: dict[str, str]) -> tuple[int, str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + "/redrive", data=form, allow_redirects=False) as response,
    ):
        return response.status, await response.text(), response.headers


def dump(path: Path) -> str:
    with closing(sqlite3.connect(path)) as con:
        return "\n".join(con.iterdump())


def audit_rows(path: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as con:
        return con.execute("SELECT id, token, at_ms, note, action FROM asyncq_audit ORDER BY seq").fetchall()


def cell(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}">([^<]*)<', page)
    assert found is not None, element_id
    return found.group(1)


def table(page: str, table_id: str) -> str:
    found = re.search(rf'<table id="{table_id}">.*?</table>', page)
    assert found is not None, table_id
    return found.group(0)


async def test_the_page_shows_counts_dead_jobs_with_reasons_the_audit_log_and_leases(
    server: tuple[str, Dashboard],
) -> None:
    status, page, headers = await get(server[0] + "/")
    assert status == 200
    counts = {s: cell(page, f"count-{s}") for s in ("pending", "leased", "done", "dead", "total")}
    assert counts == {"pending": "1", "leased": "1", "done": "2", "dead": "3", "total": "7"}
    assert cell(page, "dead-by-reason") == "cancelled: 1, exhausted: 1, permanent: 1"
    dead = table(page, "dead")
    for job_id, reason in (("refused", "permanent"), ("tired", "exhausted"), ("unwanted", "cancelled")):
        assert f'<tr data-job="{job_id}"><td>{job_id}</td><td>default</td><td>{reason}</td>' in dead
    assert dead.count('action="/redrive"') == 3
    assert "<td>unwanted</td><td>cancel</td>" in table(page, "audit")
    assert "<td>worker-7</td><td>busy</td><td>default</td>" in table(page, "leases")
    assert XSS not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert TOKEN not in page
    policy = headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert headers["X-Frame-Options"] == "DENY"


async def test_the_page_shows_paused_queues_who_paused_them_and_why_and_the_moves(
    path: Path, clock: list[int], server: tuple[str, Dashboard]
) -> None:
    _status, page, _headers = await get(server[0] + "/")
    assert 'id="queues-empty"' in page and 'id="queue-moves-empty"' in page
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.pause("mail", note=f"outage {XSS}", by="ana")
        await queue.set_max_wait("default", 90, note="bound the wait", by="ben")
    _status, page, _headers = await get(server[0] + "/")
    queues = table(page, "queues")
    assert '<tr data-queue="mail"><td>mail</td><td>paused</td>' in queues and "<td>ana</td>" in queues
    assert '<tr data-queue="default"><td>default</td><td>running</td>' in queues and "<td>90 s</td>" in queues
    moves = table(page, "queue-moves")
    assert "<td>mail</td><td>pause</td><td></td><td>ana</td>" in moves and "<td>default</td><td>max_wait</td>" in moves
    assert XSS not in page and '<td>busy</td><td>default</td><td class="n">0</td>' in table(page, "leases")


async def test_a_wrong_or_missing_token_is_refused_and_changes_nothing(
    server: tuple[str, Dashboard], path: Path
) -> None:
    before = dump(path)
    for form in (
        {"job": "refused", "note": "retry-it", "token": "open-sesame-43"},
        {"job": "refused", "note": "retry-it", "token": ""},
        {"job": "refused", "note": "retry-it"},
        {"job": "refused", "note": "retry-it", "token": TOKEN + " "},
    ):
        status, text, _headers = await post_redrive(server[0], form)
        assert status == 403, form
        assert "nothing changed" in text
    assert dump(path) == before


async def test_the_token_redrives_the_job_with_exactly_one_audit_row(
    server: tuple[str, Dashboard], path: Path, clock: list[int]
) -> None:
    clock[0] += 5_000
    status, _text, headers = await post_redrive(server[0], {"job": "refused", "note": "fixed-parser", "token": TOKEN})
    assert (status, headers["Location"]) == (303, "/")
    assert audit_rows(path) == [
        ("unwanted", 0, T0, "not-needed", "cancel"),
        ("refused", 1, T0 + 5_000, "fixed-parser", "redrive"),
    ]
    job = await read_job(path, "refused")
    assert (job.status, job.attempts, job.reason, job.available_at) == ("pending", 0, None, T0 + 5_000)

    _status, page, _headers = await get(server[0] + "/")
    assert '<td>refused</td><td>redrive</td><td class="n">1</td><td>fixed-parser</td>' in table(page, "audit")
    assert 'data-job="refused"' not in page
    assert cell(page, "count-dead") == "2"

    before = dump(path)
    status, text, _headers = await post_redrive(server[0], {"job": "refused", "note": "again", "token": TOKEN})
    assert status == 409 and "not dead" in text
    assert dump(path) == before


async def test_a_bad_note_or_a_job_that_is_not_an_identifier_is_refused(
    server: tuple[str, Dashboard], path: Path
) -> None:
    before = dump(path)
    bad_notes = ({"job": "refused", "note": "two\nlines"}, {"job": "refused", "note": ""})
    for form in (*bad_notes, {"job": "refused", "note": "x" * 501}, {"job": "<b>", "note": "n"}):
        status, text, _headers = await post_redrive(server[0], form | {"token": TOKEN})
        assert status == 400, form
        assert "<b>" not in text
    assert dump(path) == before


async def test_the_chart_draws_the_sampled_depth_over_time(
    server: tuple[str, Dashboard], path: Path, clock: list[int]
) -> None:
    base, dashboard = server
    await eventually(lambda: dashboard.samples, "the sample taken at start-up, before this test's own", timeout=5)
    dashboard.samples.clear()
    await dashboard.sample_once()
    clock[0] += 2_000
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.enqueue_many([JobSpec(f"more-{n}", n) for n in range(3)])
    await dashboard.sample_once()

    _status, page, _headers = await get(base + "/")
    pending = re.search(r'<polyline class="series-pending"[^>]*points="([^"]*)"', page)
    assert pending is not None
    (x0, y0), (x1, y1) = [tuple(map(float, p.split(","))) for p in pending.group(1).split()]
    assert x0 < x1 and y1 < y0  # later, and higher: 1 pending, then 4
    assert "<svg" in page and "https://" not in page  # self-contained: nothing loaded from elsewhere

    _status, text, _headers = await get(base + "/stats.json")
    assert '"pending": 4' in text and f'"at_ms": {T0 + 2_000}' in text


async def test_a_host_header_that_is_not_loopback_is_refused(server: tuple[str, Dashboard]) -> None:
    status, _page, _headers = await get(server[0] + "/", Host="attacker.example")
    assert status == 403
    status, _page, _headers = await get(server[0] + "/", Host="localhost")
    assert status == 200


DASHBOARD_REFUSALS = [
    (["--host", "0.0.0.0"], 2, "asyncq: error: refusing to bind 0.0.0.0, not a loopback address (add --allow-remote"),
    (["--token", ""], 2, "asyncq: error: --token must not be empty"),
    (["--port", "70000"], 2, "asyncq: error: argument --port: '70000' is not a whole number from 0 to 65535"),
    (["--port", "-1"], 2, "asyncq: error: argument --port: '-1' is not a whole number from 0 to 65535"),
    (["--sample-seconds", "0"], 2, "asyncq: error: argument --sample-seconds: '0' is not a number of seconds"),
    (["--refresh-seconds", "nan"], 2, "asyncq: error: argument --refresh-seconds: 'nan' is not a number of seconds"),
    (["--frobnicate"], 2, "asyncq: error: unrecognized arguments: --frobnicate"),
]


def test_the_dashboard_command_refuses_bad_options_in_one_line_naming_only_its_options(path: Path) -> None:
    help_text = run_cli("dashboard", "--help", cwd=path.parent).stdout
    before = dump(path)
    for args, code, message in DASHBOARD_REFUSALS:
        done = run_cli("dashboard", "--db", path.name, *args, cwd=path.parent)
        assert (done.returncode, done.stdout) == (code, ""), (args, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(message), line
        named = re.findall(r"--[a-z][a-z-]+", line.split(" (see ")[0])
        assert all(option in help_text for option in named if option != "--frobnicate"), (named, help_text)
    assert dump(path) == before


def test_the_dashboard_command_on_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    done = run_cli("dashboard", "--db", "missing.db", cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "asyncq: error: no such queue file: missing.db\n")
    assert sorted(tmp_path.iterdir()) == []


def test_the_dead_table_shows_each_dead_jobs_last_error() -> None:
    first = AttemptError(1, T0, "TimeoutError", "the receiver took too long", "Traceback …")
    last = AttemptError(2, T0 + 1, "ValueError", "bad <b>payload</b>\nsecond line " + "x" * 200, "Traceback …")
    job = Job(7, "tired", "default", {"n": 1}, "dead", 2, 2, 2, T0, T0 + 9, None, None, "exhausted", 0, (first, last))
    stats = Stats(T0, {"pending": 0, "leased": 0, "done": 0, "dead": 1}, {"exhausted": 1}, None, 0)
    page = render_page("q.db", Snapshot(stats, [job], [], []), refresh_seconds=5, nonce="n")
    dead = table(page, "dead")
    assert "<th>last error</th>" in dead
    cells = re.findall(r"<td>([^<]*)</td>", dead)
    shown = next(text for text in cells if text.startswith("ValueError: "))
    assert shown.startswith("ValueError: bad &lt;b&gt;payload&lt;/b&gt; second line xxx") and shown.endswith("…")
    assert "TimeoutError" not in dead and "<b>" not in dead


async def read_job(path: Path, job_id: str) -> Any:
    async with await Queue.open(path) as queue:
        return await queue.get(job_id)


def test_the_asyncq_command_serves_the_dashboard(tmp_path: Path) -> None:
    """``asyncq dashboard`` is the same page, started from the operator's command; SIGINT stops it with 0."""
    db = tmp_path / "q.db"
    assert run_cli("init", "--db", str(db), cwd=tmp_path).returncode == 0
    command = [sys.executable, "-m", "asyncq", "dashboard", "--db", str(db), "--token", "secret-token"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[-1]
        assert process.stdout.readline().strip() == "token: secret-token"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200 and "asyncq dashboard" in response.read().decode()
    finally:
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=20)
    assert process.returncode == 0 and err == ""


async def test_a_running_job_with_a_cancel_request_shows_it_among_the_leases(
    path: Path, clock: list[int], server: tuple[str, Dashboard]
) -> None:
    _status, page, _headers = await get(server[0] + "/")
    assert "requested" not in table(page, "leases")  # the leased job has no request yet
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        outcome = await queue.cancel("busy", note="customer left")
    assert outcome.state == "requested"
    _status, page, _headers = await get(server[0] + "/")
    row = re.search(r"<tr><td>worker-7</td><td>busy</td>.*?</tr>", table(page, "leases"))
    assert row is not None and f"<td>requested {utc(clock[0])}</td>" in row.group(0)


async def test_a_leased_jobs_unique_key_is_shown_among_the_leases(
    path: Path, clock: list[int], server: tuple[str, Dashboard]
) -> None:
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        assert await queue.enqueue("keyed", {}, queue="digests", unique_key="digest:42") is True
        [ticket] = await queue.claim("worker-9", queue="digests", lease=60)
    assert ticket.id == "keyed"
    _status, page, _headers = await get(server[0] + "/")
    assert "<th>unique key</th>" in table(page, "leases")
    row = re.search(r"<tr><td>worker-9</td><td>keyed</td>.*?</tr>", table(page, "leases"))
    assert row is not None and row.group(0).endswith("<td>digest:42</td><td></td></tr>")  # no limit key


async def test_the_queues_section_shows_each_ended_states_retention(
    path: Path, clock: list[int], server: tuple[str, Dashboard]
) -> None:
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.set_retention("mail", done=7 * 86400, cancelled=3600, note="keep a week", by="ops")
    _status, page, _headers = await get(server[0] + "/")
    queues = table(page, "queues")
    assert "<th>done kept</th><th>cancelled kept</th><th>dead kept</th>" in queues
    row = re.search(r'<tr data-queue="mail">.*?</tr>', queues)
    assert row is not None and row.group(0).endswith("<td>604800 s</td><td>3600 s</td><td>forever</td></tr>")
    assert "<td>mail</td><td>retention</td><td></td><td>ops</td>" in table(page, "queue-moves")


async def test_the_retention_rules_show_with_their_scope_and_each_queue_the_windows_that_apply(
    path: Path, clock: list[int], server: tuple[str, Dashboard]
) -> None:
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        await queue.set_default_retention(done=86_400, by="ops")
        await queue.set_retention("mail", task="send", dead=60, by="ops")
        await queue.pause("other", note="outage", by="ops")
    _status, page, _headers = await get(server[0] + "/")
    rules = table(page, "retention")
    assert "<th>retention rule</th><th>done kept</th><th>cancelled kept</th><th>dead kept</th>" in rules
    assert "<tr><td>every queue (default)</td><td>86400 s</td><td>forever</td><td>forever</td></tr>" in rules
    assert "<tr><td>task send in queue mail</td><td>forever</td><td>forever</td><td>60 s</td></tr>" in rules
    row = re.search(r'<tr data-queue="other">.*?</tr>', table(page, "queues"))  # no rule of its own: the default's
    assert row is not None and row.group(0).endswith("<td>86400 s</td><td>forever</td><td>forever</td></tr>")
    assert "<td>mail</td><td>retention</td><td>send</td><td>ops</td>" in table(page, "queue-moves")


async def test_the_queues_section_shows_the_limits_in_force_and_the_slots_they_hold(
    path: Path, clock: list[int], server: tuple[str, Dashboard]
) -> None:
    async with await Queue.open(path, clock=lambda: clock[0]) as queue:
        _status, page, _headers = await get(server[0] + "/")
        assert 'id="limits-empty">no limits' in page
        for n in range(3):
            await queue.enqueue(f"m{n}", {}, queue="mail", limit_key="tenant-7")
        await queue.set_limits(
            "mail", concurrency=4, per_key_concurrency=1, rate=100, per=60, note="provider", by="ops"
        )
        [ticket] = await queue.claim("worker-3", queue="mail", limit=5, lease=60)
    _status, page, _headers = await get(server[0] + "/")
    limits = table(page, "limits")
    assert "<th>running</th><th>per key</th><th>keys full</th><th>rate</th><th>next start</th>" in limits
    row = re.search(r'<tr data-queue="mail">.*?</tr>', limits)
    assert row is not None and row.group(0) == (
        '<tr data-queue="mail"><td>mail</td><td>1 of 4</td><td>1 a key</td><td>1 of 1</td>'
        "<td>100 per 60 s, burst 1</td><td>in 0.6 s</td></tr>"
    )
    assert "<td>mail</td><td>limits</td><td></td><td>ops</td>" in table(page, "queue-moves")
    lease = re.search(r"<tr><td>worker-3</td><td>m0</td>.*?</tr>", table(page, "leases"))
    assert ticket.id == "m0" and lease is not None and lease.group(0).endswith("<td>tenant-7</td></tr>")
