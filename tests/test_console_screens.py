"""The console's Schedules and Groups screens, a job's graph on its page, the task and waiting filters and the
Overview's retention, over real HTTP on loopback (the aiohttp adapter), on a SQLite file and on a PostgreSQL schema:
what each shows (escaped), each action previewed, confirmed and audited under the operator's name, and each refusal
(a role that may not, a missing CSRF token, a stale preview, a delete a graph forbids) leaving the store as it was."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest
from console_support import T0, TOKENS, XSS, Client, seed_graphs, serving
from postgres_support import fresh_schema

from asyncq.core.dependencies import Dependency
from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue
from asyncq.web.console import ConsoleSettings, TokenRoles

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def clock() -> list[int]:
    return [T0]


@pytest.fixture(params=["sqlite", "postgresql"])
async def queue(request: pytest.FixtureRequest, tmp_path: Path, clock: list[int]) -> AsyncIterator[Queue]:
    """``seed_graphs``' schedules and graphs, in a SQLite file or a PostgreSQL schema of its own."""
    async with contextlib.AsyncExitStack() as stack:
        target = str(tmp_path / "queue.db")
        if request.param == "postgresql":
            request.getfixturevalue("postgres_database")  # skips (fails under CI) without a server
            target, _schema = await stack.enter_async_context(fresh_schema())
        opened = await stack.enter_async_context(await Queue.open(target, clock=lambda: clock[0]))
        await seed_graphs(opened, clock)
        yield opened


@pytest.fixture
async def client(queue: Queue) -> AsyncIterator[Client]:
    settings = ConsoleSettings(resolver=TokenRoles(TOKENS), sample_seconds=None, refresh_seconds=0.05)
    async with serving(queue, settings) as (base, _console), Client(base) as opened:
        yield opened


def rows(page_text: str, attribute: str) -> list[str]:
    return re.findall(rf'<tr data-{attribute}="([^"]+)"', page_text)


async def state(queue: Queue) -> tuple[object, ...]:
    """What a refusal must leave as it was: every job, schedule, schedule event and group."""
    jobs = await queue.list_jobs(limit=1000)
    return tuple(jobs), tuple(await queue.schedules()), tuple(await queue.schedule_events(limit=1000)), tuple(
        await queue.groups())  # fmt: skip


async def test_the_schedules_screen_shows_each_schedule_its_state_and_why_ticks_did_not_run(client: Client) -> None:
    await client.sign_in("read_only", name="rita")
    page = await client.get("/schedules")
    assert page.status == 200 and rows(page.text, "schedule") == ["beat", "gone", "nightly"]
    assert page.cell("state-beat") == "running" and "retired" in page.text and "every 60s" in page.text
    assert "cron 0 3 * * * (Europe/Berlin)" in page.text
    nightly = re.search(r'<td id="state-nightly">.*?</td>', page.text, re.S)
    assert nightly is not None and "by bob: ERP migration &lt;script&gt;" in nightly.group(0)
    assert XSS not in page.text
    beat = re.search(r'<tr data-schedule="beat".*?</tr>', page.text, re.S)
    assert beat is not None and re.findall(r'<td class="n">(\d+)</td>', beat.group(0)) == ["1", "3", "6"]
    assert "sch-beat-" in beat.group(0)  # its newest run
    kinds = re.findall(r'<tr data-event="\d+" data-kind="([a-z_]+)"', page.text)
    assert kinds == ["overlap"] + ["missed"] * 6 + ["overlap"] * 2  # newest first, only ticks that did not run
    assert 'id="pause_schedule-beat"' not in page.text  # read-only: no action is offered
    one = await client.get("/schedules?name=nightly")
    assert re.findall(r'data-kind="([a-z_]+)"', one.text) == ["pause", "declared"]  # its moves too
    assert "deploy-41" in one.text and (await client.get("/schedules?name=no%20such")).status == 400
    live = await client.get("/fragment/schedules")
    assert live.status == 200 and 'id="schedules"' in live.text


async def test_schedules_are_paused_resumed_and_run_now_on_a_previewed_set_audited(
    client: Client, queue: Queue, clock: list[int]
) -> None:
    await client.sign_in("operator", name="olga")
    screen = await client.get("/schedules")
    assert 'id="pause_schedule-beat"' in screen.text and 'id="resume_schedule-nightly"' in screen.text
    csrf = screen.csrf()
    form = {"csrf": csrf, "action": "pause_schedule", "schedules": "beat nightly gone"}
    preview = await client.post("/preview", form)
    assert preview.cell("preview-title") == "Pause schedule: 1 schedule" and preview.cell("preview-schedules") == "beat"
    done = await client.act({"action": "pause_schedule", "schedules": "beat nightly gone", "note": "ERP cutover"})
    entry = await client.get(done.headers["Location"])
    assert (entry.cell("entry-actor"), entry.cell("entry-outcome"), entry.cell("entry-note")) == (
        "olga", "paused: 1", "ERP cutover")  # fmt: skip
    paused = {s.name: (s.paused_by, s.pause_note) for s in await queue.schedules() if s.paused}
    assert paused == {"beat": ("olga", "ERP cutover"), "nightly": ("bob", f"ERP migration {XSS}")}
    clock[0] += 1
    ran = await client.act({"action": "run_schedule", "schedules": "nightly", "note": "backfill 12-03"})
    entry = await client.get(ran.headers["Location"])
    job_id = f"sch-nightly-now-{T0 + 1}"
    assert entry.cell("entry-outcome") == "enqueued: 1" and f'href="/jobs/{job_id}"' in entry.text
    job = await queue.get(job_id)
    assert job is not None and (job.status, job.task, job.queue) == ("pending", "reports.nightly", "reports")
    [event] = await queue.schedule_events("nightly", limit=1)
    assert (event.kind, event.actor, event.note, event.job_id) == ("run_now", "olga", "backfill 12-03", job_id)
    stale = await client.post("/preview", {"csrf": csrf, "action": "resume_schedule", "schedules": "beat nightly"})
    digest, count = stale.field("digest", "confirm"), stale.field("count", "confirm")
    await queue.resume_schedule("beat", note="someone else", by="bob")
    before = await state(queue)
    form = {"csrf": csrf, "action": "resume_schedule", "schedules": "beat nightly", "digest": digest}
    refused = await client.post("/act", form | {"count": count, "confirm": count, "note": "n"})
    assert refused.status == 409 and 'id="preview-again"' in refused.text and 'name="schedules"' in refused.text
    assert await state(queue) == before
    audit = await client.get("/audit?subject=nightly")
    assert len(rows(audit.text, "entry")) == 1 and "<td>run now</td>" in audit.text  # the pause named beat only


async def test_a_schedule_action_needs_a_role_that_may_and_this_sessions_csrf_token(
    client: Client, queue: Queue
) -> None:
    await client.sign_in("read_only")
    csrf = (await client.get("/schedules")).csrf()
    before = await state(queue)
    refused = await client.post("/preview", {"csrf": csrf, "action": "run_schedule", "schedules": "beat"})
    assert refused.status == 403 and "may not run_schedule" in refused.text
    await client.sign_in("operator")
    csrf = (await client.get("/schedules")).csrf()
    preview = await client.post("/preview", {"csrf": csrf, "action": "run_schedule", "schedules": "beat"})
    form = {"action": "run_schedule", "schedules": "beat", "digest": preview.field("digest", "confirm")}
    form |= {"count": "1", "confirm": "1", "note": "n"}
    assert (await client.post("/act", form)).status == 403  # no CSRF token
    assert (await client.post("/act", form | {"csrf": "0" * 64})).status == 403
    assert await state(queue) == before


async def test_the_groups_screen_and_a_groups_page_show_progress_and_members(client: Client) -> None:
    await client.sign_in("read_only")
    page = await client.get("/groups")
    assert rows(page.text, "group") == ["import-6", "import-7"] and page.cell("open-count").startswith("1 group")
    seven = re.search(r'<tr data-group="import-7".*?</tr>', page.text, re.S)
    assert seven is not None and re.findall(r'<td class="n">(\d+)</td>', seven.group(0)) == ["4", "1", "1", "2"]
    assert "waiting" in seven.group(0) and "group-import-7" in seven.group(0)
    assert rows((await client.get("/groups?open=1")).text, "group") == ["import-7"]
    group = await client.get("/groups/import-7")
    assert rows(group.text, "job") == ["row-0", "row-1", "row-2", "row-3"] and 'id="group-facts"' in group.text
    assert "<code>ValueError</code>: bad row" in group.text  # each member with its newest error
    assert rows((await client.get("/groups/import-7?status=pending")).text, "job") == ["row-2", "row-3"]
    assert (await client.get("/groups/import-7?status=bogus")).status == 400
    assert (await client.get("/groups/nothing-here")).status == 404
    assert "row-1" in (await client.get("/fragment/group?name=import-7")).text


async def test_a_jobs_page_shows_what_it_waits_for_what_waits_for_it_and_its_group(client: Client) -> None:
    await client.sign_in("admin")
    merge = await client.get("/jobs/merge")
    assert '<span class="badge waiting">waiting</span>' in merge.text and 'href="/jobs?task=merge"' in merge.text
    waits = re.search(r'<table id="waits-for">.*?</table>', merge.text, re.S)
    assert waits is not None and rows(waits.group(0), "dependency") == ["fetch-2", "fetch-1"]
    assert re.search(r'data-dependency="fetch-1">.*?pending.*?<td>dead</td><td>open</td>', waits.group(0), re.S)
    assert re.search(r'data-dependency="fetch-2">.*?done.*?<td>run</td><td>met</td>', waits.group(0), re.S)
    assert 'id="act-cancel"' in merge.text and 'id="act-priority"' in merge.text  # a waiting job's actions
    assert re.search(r"<b>waiting</b>\s*— for fetch-1\s*</li>", merge.text)
    fetch = await client.get("/jobs/fetch-1")
    assert rows(fetch.text, "dependant") == ["merge"] and 'id="act-delete"' not in fetch.text
    assert 'id="spared"' in fetch.text and "A graph still needs this job" in fetch.text
    member = await client.get("/jobs/row-2")
    assert 'id="job-group"' in member.text and "import-7" in member.text
    timeline = re.search(r'<ol class="timeline" id="timeline">.*?</ol>', member.text, re.S)
    assert timeline is not None and "its group import-7 sealed" in timeline.group(0)
    callback = await client.get("/jobs/group-import-7")
    assert 'id="callback-of"' in callback.text and "2 running" in callback.text
    assert "for group import-7 to complete (2 of 4 members running)" in callback.text
    old = await client.get("/jobs/old-0")
    assert 'id="spared"' in old.text  # its group completed, but its callback has not run yet: it reads its members
    loner = await client.get(f"/jobs/sch-beat-{T0 - 540_000}")  # a tick's job, in no graph
    assert 'id="act-delete"' in loner.text and 'id="spared"' not in loner.text


async def test_jobs_are_found_by_task_on_its_index_and_waiting_jobs_by_status(client: Client) -> None:
    await client.sign_in("read_only")
    fetch = await client.get("/jobs?task=fetch")
    assert rows(fetch.text, "job") == ["fetch-1", "fetch-2"] and "the index serves: task;" in fetch.text
    assert "Walks task" in fetch.text
    rows_pending = await client.get("/jobs?task=import.row&status=pending&order=oldest")
    assert rows(rows_pending.text, "job") == ["row-2", "row-3"] and "checked on the rows it yields: status" in (
        rows_pending.text)  # fmt: skip
    waiting = await client.get("/jobs?status=waiting")
    assert rows(waiting.text, "job") == ["group-import-7", "merge"] and "Walks waiting" in waiting.text
    assert "<option selected>waiting</option>" in waiting.text
    assert (await client.get("/jobs?task=" + "x" * 201)).status == 400  # longer than a task name


async def test_a_bulk_delete_spares_what_a_graph_needs_and_says_so(client: Client, queue: Queue) -> None:
    await client.sign_in("admin", name="ada")
    csrf = (await client.get("/jobs")).csrf()
    preview = await client.post("/preview", {"csrf": csrf, "action": "delete", "status": "done"})
    assert preview.cell("preview-title") == "Delete: 0 jobs" and 'id="confirm"' not in preview.text
    spared = re.search(r'<div class="notice" id="preview-spared">.*?</div>', preview.text, re.S)
    assert spared is not None and rows(spared.group(0), "job") == ["fetch-2", "row-0", "old-0"]
    assert "Left out: 3 jobs the filter found that a graph still needs" in spared.group(0)
    await queue.cancel("merge", "not needed")  # nothing live waits for fetch-2 now
    again = await client.post("/preview", {"csrf": csrf, "action": "delete", "status": "done"})
    assert again.cell("preview-title") == "Delete: 1 job" and "Left out: 2 jobs" in again.text
    done = await client.act({"action": "delete", "status": "done", "note": "gdpr"})
    entry = await client.get(done.headers["Location"])
    assert entry.cell("entry-outcome") == "deleted: 1" and await queue.get("fetch-2") is None
    assert await queue.get("row-0") is not None and await queue.get("old-0") is not None
    if queue.path.endswith(".db"):  # the graph's rows of what went, and only those
        with closing(sqlite3.connect(queue.path)) as con:
            assert con.execute("SELECT count(*) FROM asyncq_edges").fetchone() == (1,)  # merge -> fetch-1 stays


async def test_a_console_cancel_settles_graphs_and_wakes_this_process(client: Client, queue: Queue) -> None:
    await client.sign_in("operator")
    await queue.enqueue("late", {"n": 1}, queue="slow", after=[Dependency("fetch-1", "run")])
    [ticket] = await queue.claim("worker-9", queue="fetch", lease=600)
    assert ticket.id == "fetch-1"
    asked = asyncio.create_task(queue.wait_for_cancel_request(10))
    await asyncio.sleep(0)
    done = await client.act({"action": "cancel", "ids": "fetch-1 merge", "note": "stop"})
    entry = await client.get(done.headers["Location"])
    assert entry.cell("entry-outcome") == "cancelled: 1, requested: 1, requested before: 0"
    async with asyncio.timeout(2):  # the pool of this process holding fetch-1 looks at once, as after Queue.cancel
        assert await asked
    merge = await queue.get("merge")
    assert merge is not None and (merge.status, merge.reason) == ("dead", "cancelled")


async def test_the_overview_shows_the_retention_that_applies_to_each_queue_and_every_rule(queue: Queue) -> None:
    await queue.set_default_retention(done=7 * 86400, by="ops")
    await queue.set_retention("import", done=3600, dead=None, cancelled=86400, by="ops")
    await queue.set_retention("import", task="import.row", done=60, by="ops")
    async with serving(queue) as (base, console), Client(base) as client:
        assert await console.sample_once()  # the queues with jobs: from the sample
        page = await client.get("/")
    own = re.search(r'<td class="small" id="kept-import">.*?</td>', page.text, re.S)
    assert own is not None and "1.0 h / 1.0 d / forever" in own.group(0) and "its own rule" in own.group(0)
    assert "1 task rule" in own.group(0)
    kept = re.search(r'<td class="small" id="kept-fetch">.*?</td>', page.text, re.S)
    assert kept is not None and "7.0 d / forever / forever" in kept.group(0) and "the default" in kept.group(0)
    assert rows(page.text, "rule") == ["*/", "import/", "import/import.row"]


async def test_the_overview_shows_the_limits_in_force_and_the_slots_they_use_now(
    queue: Queue, clock: list[int]
) -> None:
    async with serving(queue) as (base, _console), Client(base) as client:
        empty = await client.get("/")
        assert 'id="limits-empty"' in empty.text and rows(empty.text, "limits") == []
        await queue.set_limits("mail", concurrency=3, per_key_concurrency=1, rate=10, per=60.0, burst=2, by="ops")
        await queue.enqueue_many(
            [JobSpec(f"mail-{n}", {"n": n}, "mail", limit_key="tenant-a") for n in range(2)]
            + [JobSpec("mail-b", {}, "mail", limit_key="tenant-b")]
        )
        held = await queue.claim("w1", queue="mail", limit=3)  # one of a key: two slots, both keys at their limit
        page = await client.get("/")
    assert len(held) == 2 and rows(page.text, "limits") == ["mail"]
    row = re.search(r'<tr data-limits="mail">.*?</tr>', page.text, re.S)
    assert row is not None
    cells = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)]
    assert cells[:2] == ["mail", "concurrency 3, per key 1, rate 10 per 60 s (burst 2)"]
    assert cells[2:4] == ["2 of 3", "2 of 2 busy keys full"]
    assert cells[4].startswith("in ")  # the burst of two spent: the rate lets the next start 6 s on
