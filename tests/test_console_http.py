"""The console over real HTTP on loopback (its aiohttp adapter), on a real queue file: every screen and what it
shows (escaped), roles from tokens, CSRF on every change, each action previewed and confirmed, and each refusal
(a stale preview, a mistyped count, a role that may not, a missing or wrong CSRF token, a cross-site post, a host
that is not loopback) leaving the file exactly as it was."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from console_support import T0, TOKENS, XSS, Client, dump, seed, serving

from asyncq.queue import Queue
from asyncq.web.console import ConsoleApp, ConsoleSettings, TokenRoles

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def clock() -> list[int]:
    return [T0]


@pytest.fixture
async def queue(tmp_path: Path, clock: list[int]) -> AsyncIterator[Queue]:
    async with await Queue.open(tmp_path / "queue.db", clock=lambda: clock[0]) as opened:
        await seed(opened)
        yield opened


@pytest.fixture
async def site(queue: Queue) -> AsyncIterator[tuple[str, ConsoleApp]]:
    settings = ConsoleSettings(resolver=TokenRoles(TOKENS), sample_seconds=None, refresh_seconds=0.05)
    async with serving(queue, settings) as found:
        yield found


@pytest.fixture
async def client(site: tuple[str, ConsoleApp]) -> AsyncIterator[Client]:
    async with Client(site[0]) as opened:
        yield opened


async def test_every_screen_answers_and_escapes_what_it_shows(client: Client) -> None:
    assert (await client.get("/")).headers["Location"] == "/login"  # tokens configured: sign in first
    await client.sign_in("read_only", name="rita")
    overview = await client.get("/")
    assert overview.status == 200
    counts = {s: overview.cell(f"count-{s}") for s in ("pending", "leased", "done", "dead")}
    assert counts == {"pending": "3", "leased": "1", "done": "1", "dead": "4"}
    assert overview.cell("who").startswith("rita") and overview.cell("role") == "read_only"
    policy = overview.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert overview.headers["X-Frame-Options"] == "DENY" and overview.headers["Cache-Control"] == "no-store"
    for path, marker in (
        ("/jobs", 'id="jobs"'), ("/jobs?status=dead", "m-bad-1"), ("/jobs/w-1", 'id="job-body"'),
        ("/dead", 'id="groups"'), ("/workers", 'id="holders"'), ("/audit", 'id="job-moves"'),
        ("/fragment/overview", 'id="counts"'), ("/fragment/jobs?status=leased", "m-busy"),
        ("/fragment/job?id=m-busy", 'id="lease-owner"'), ("/stats.json", '"by_status"'),
    ):  # fmt: skip
        page = await client.get(path)
        assert page.status == 200 and marker in page.text, path
        assert XSS not in page.text, path
    job = await client.get("/jobs/w-1")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in job.text
    assert "https://" not in job.text and '<script src="/static/console.js" defer>' in job.text  # no CDN
    assert (await client.get("/static/console.js")).headers["Content-Type"].startswith("text/javascript")
    assert (await client.get("/jobs/no-such-job")).status == 404
    assert (await client.get("/nowhere")).status == 404
    assert (await client.post("/jobs", {"csrf": overview.csrf()})).status == 405


async def test_the_job_page_tells_the_whole_story(client: Client, queue: Queue) -> None:
    await client.sign_in("operator")
    page = await client.get("/jobs/m-tired")
    timeline = re.search(r'<ol class="timeline" id="timeline">.*?</ol>', page.text, re.S)
    assert timeline is not None
    kinds = re.findall(r'data-kind="([a-z_]+)"', timeline.group(0))
    assert kinds == ["failed", "now"]
    assert "TimeoutError: slow" in timeline.group(0) and "<summary>traceback</summary>" in timeline.group(0)
    assert "dead: exhausted" in timeline.group(0)
    busy = await client.get("/jobs/m-busy")
    assert busy.cell("lease-owner") == "worker-7" and 'id="act-cancel"' in busy.text
    assert 'id="act-delete"' not in busy.text  # a leased job cannot be deleted, nor an operator delete at all
    gone = await client.get("/jobs/w-gone")
    assert "customer left" in gone.text and 'id="act-redrive"' in gone.text


async def test_a_bulk_redrive_is_previewed_confirmed_and_audited(client: Client, queue: Queue) -> None:
    await client.sign_in("operator", name="ana")
    csrf = (await client.get("/dead")).csrf()
    preview = await client.post("/preview", {"csrf": csrf, "action": "redrive", "status": "dead", "queue": "mail"})
    assert preview.cell("preview-title") == "Redrive: 3 jobs"
    assert {"m-bad-1", "m-bad-2", "m-tired"} <= set(re.findall(r'data-job="([^"]+)"', preview.text))
    done = await client.act({"action": "redrive", "status": "dead", "queue": "mail", "note": "parser fixed"})
    assert done.status == 303 and re.fullmatch(r"/audit/\d+", done.headers["Location"])
    entry = await client.get(done.headers["Location"])
    assert (entry.cell("entry-actor"), entry.cell("entry-note"), entry.cell("entry-outcome")) == (
        "ana", "parser fixed", "redriven: 3")  # fmt: skip
    for job_id in ("m-bad-1", "m-bad-2", "m-tired"):
        job = await queue.get(job_id)
        assert job is not None and job.status == "pending"
        [audit] = [row for row in await queue.history(job_id) if row.action == "redrive"]
        assert audit.op_seq is not None and audit.note == "parser fixed"
    audit_page = await client.get("/audit?actor=ana")
    assert "parser fixed" in audit_page.text and "m-bad-1" in audit_page.text


async def test_a_stale_preview_a_mistyped_count_and_a_forbidden_role_change_nothing(
    client: Client, queue: Queue
) -> None:
    await client.sign_in("operator")
    csrf = (await client.get("/dead")).csrf()
    preview = await client.post("/preview", {"csrf": csrf, "action": "redrive", "status": "dead"})
    digest, count = preview.field("digest", "confirm"), preview.field("count", "confirm")
    form = {"csrf": csrf, "action": "redrive", "status": "dead", "digest": digest, "count": count, "note": "n"}
    before = dump(queue.path)
    mistyped = await client.post("/act", form | {"confirm": str(int(count) + 1)})
    assert mistyped.status == 400 and "nothing changed" in mistyped.text
    await queue.redrive("m-bad-2", "someone else, meanwhile")  # the set changes
    before = dump(queue.path)
    stale = await client.post("/act", form | {"confirm": count})
    assert stale.status == 409 and 'id="preview-again"' in stale.text and "nothing changed" in stale.text
    assert dump(queue.path) == before
    delete = await client.post("/preview", {"csrf": csrf, "action": "delete", "status": "dead"})
    assert delete.status == 403 and "needs the admin role" in delete.text
    forged = await client.post("/act", form | {"action": "delete", "confirm": count})
    assert forged.status == 403 and dump(queue.path) == before


async def test_every_change_needs_the_sessions_csrf_token_from_this_site(client: Client, queue: Queue) -> None:
    await client.sign_in("admin")
    csrf = (await client.get("/")).csrf()
    form = {"action": "pause", "queues": "mail"}
    before = dump(queue.path)
    for extra, headers in (
        ({}, {}),
        ({"csrf": "0" * 64}, {}),
        ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
        ({"csrf": csrf}, {"Origin": "http://evil.example"}),
    ):
        refused = await client.post("/preview", form | extra, **headers)
        assert refused.status == 403 and "nothing changed" in refused.text, (extra, headers)
    async with Client(client.base) as stranger:  # another session's token is not this one's
        await stranger.sign_in("admin", name="eve")
        assert (await stranger.post("/preview", form | {"csrf": csrf})).status == 403
    assert dump(queue.path) == before
    assert (await client.post("/preview", form | {"csrf": csrf})).status == 200


async def test_single_job_actions_are_pinned_to_the_state_their_page_showed(client: Client, queue: Queue) -> None:
    await client.sign_in("admin")
    page = await client.get("/jobs/m-pending-1")
    form = {"csrf": page.csrf(), "action": "priority", "ids": "m-pending-1", "count": "1", "confirm": "1"}
    form |= {"digest": page.field("digest", "act-priority"), "new_priority": "9", "note": "vip"}
    assert (await client.post("/act", form)).status == 303
    job = await queue.get("m-pending-1")
    assert job is not None and job.priority == 9
    cancel = await client.get("/jobs/m-busy")
    digest = cancel.field("digest", "act-cancel")
    pinned = {"csrf": page.csrf(), "action": "cancel", "ids": "m-busy", "count": "1", "confirm": "1", "note": "stop"}
    assert (await client.post("/act", pinned | {"digest": digest})).status == 303
    busy = await queue.get("m-busy")
    assert busy is not None and busy.status == "leased" and busy.cancel_requested_at == T0  # its holder stops it
    delete = await client.get("/jobs/m-done")
    digest = delete.field("digest", "act-delete")
    gone = {"csrf": page.csrf(), "action": "delete", "ids": "m-done", "count": "1", "confirm": "1", "note": "gdpr"}
    assert (await client.post("/act", gone | {"digest": digest})).status == 303
    assert await queue.get("m-done") is None
    after = await client.get("/jobs/m-done")
    assert 'id="job-gone"' in after.text and "gdpr" in after.text


async def test_queues_pause_and_resume_from_the_overview(client: Client, queue: Queue) -> None:
    await client.sign_in("operator", name="olga")
    paused = await client.act({"action": "pause", "queues": "mail web", "note": "incident 7"})
    assert paused.status == 303
    assert {q.queue: q.paused_by for q in await queue.paused_queues()} == {"mail": "olga", "web": "olga"}
    overview = await client.get("/")
    assert 'id="resume-mail"' in overview.text and "incident 7" in overview.text
    assert (await client.act({"action": "resume", "queues": "mail", "note": "over"})).status == 303
    assert [q.queue for q in await queue.paused_queues()] == ["web"]


async def test_the_jobs_screen_filters_pages_and_says_when_its_scan_cap_is_reached(queue: Queue) -> None:
    settings = ConsoleSettings(sample_seconds=None, page_size=2, scan=3)  # read-only for everyone
    async with serving(queue, settings) as (base, _console), Client(base) as client:
        page = await client.get("/jobs?error_type=ValueError")
        assert re.findall(r'<tr data-job="([^"]+)"', page.text) == ["m-bad-2", "m-bad-1"]
        assert "the index serves: error_type" in page.text
        bodies = await client.get("/jobs?body=customer.id+%3D+1&status=pending")
        assert "checked on the rows it yields: status, body" in bodies.text
        first = await client.get("/jobs?order=oldest")
        assert re.findall(r'<tr data-job="([^"]+)"', first.text) == ["m-busy", "m-done"]
        nxt = re.search(r'href="([^"]+)" id="next-page"', first.text)
        assert nxt is not None
        second = await client.get(nxt.group(1).replace("&amp;", "&"))
        assert re.findall(r'<tr data-job="([^"]+)"', second.text) == ["m-bad-1", "m-bad-2"]
        capped = await client.get("/jobs?queue=web&order=oldest")  # web's jobs are past the first 3 rows
        assert 'id="capped"' in capped.text and 'id="jobs-empty"' in capped.text
        bad = await client.get("/jobs?status=bogus")
        assert bad.status == 400 and "status must be one of" in bad.text
        assert (await client.get("/login")).status == 404  # no tokens: no sign-in, read-only
        refused = await client.post("/preview", {"csrf": page.csrf(), "action": "pause", "queues": "mail"})
        assert refused.status == 403 and "anonymous (read_only) may not pause" in refused.text


async def test_only_loopback_host_names_are_answered_unless_told(queue: Queue) -> None:
    async with serving(queue) as (base, _console), Client(base) as client:
        assert (await client.get("/", Host="attacker.example")).status == 403
        assert (await client.get("/", Host="localhost:8080")).status == 200
    remote = ConsoleSettings(resolver=TokenRoles(TOKENS, anonymous="read_only"), sample_seconds=None, allow_remote=True)
    async with serving(queue, remote) as (base, _c), Client(base) as c:
        assert (await c.get("/", Host="console.example")).status == 200
    with pytest.raises(ValueError, match="allow_remote needs a resolver"):
        ConsoleSettings(allow_remote=True).checked()


async def test_samples_are_kept_in_the_store_and_charted_after_a_restart(queue: Queue, clock: list[int]) -> None:
    settings = ConsoleSettings(sample_seconds=None)
    async with serving(queue, settings) as (base, console), Client(base) as client:
        assert await console.sample_once()
        clock[0] += 60_000
        [ticket] = await queue.claim("w2", queue="mail")
        await queue.finish(ticket, "ok")
        assert await console.sample_once()
        page = await client.get("/")
        assert page.cell("count-done") == "2"
    async with serving(queue, settings) as (base, _console), Client(base) as client:  # a new console, same store
        page = await client.get("/")
        points = re.search(r'data-series="done" points="([^"]*)"', page.text)
        assert points is not None and len(points.group(1).split()) == 2
        assert 'data-samples="2"' in page.text
        mail = re.search(r'<tr data-queue="mail".*?</tr>', page.text, re.S)
        assert mail is not None and '<td class="n">1.0</td>' in mail.group(0)  # one done in the last minute


async def test_server_sent_events_bring_a_live_region_as_it_changes(site: tuple[str, ConsoleApp], queue: Queue) -> None:
    base, _console = site
    async with Client(base) as client:
        await client.sign_in("read_only")
        async with client.session.get(base + "/events?view=workers") as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            first = await _next_event(stream)
            assert "worker-7" in first
            [ticket] = await queue.claim("worker-9", queue="web", lease=600)
            assert "worker-9" in await _next_event(stream)
            assert ticket.id == "w-1"


async def _next_event(stream: object) -> str:
    lines: list[str] = []
    async for raw in stream.content:  # type: ignore[attr-defined]
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            lines.append(line[6:])
        elif line == "" and lines:
            return "\n".join(lines)
    raise AssertionError("the stream ended")


async def test_sign_in_refusals_sign_out_and_bulk_priority_and_delete(client: Client, queue: Queue) -> None:
    page = await client.get("/login")
    wrong = await client.post("/login", {"csrf": page.csrf(), "name": "eve", "token": "not-a-token-at-all"})
    assert wrong.status == 403 and "that token opens no role" in wrong.text
    nameless = await client.post("/login", {"csrf": page.csrf(), "token": TOKENS["admin"]})
    assert nameless.status == 400 and "your name" in nameless.text
    assert (await client.get("/")).status == 303  # still nobody
    await client.sign_in("admin", name="ada")
    changed = await client.act({"action": "priority", "status": "pending", "queue": "mail", "new_priority": "5"})
    assert changed.status == 303
    assert {job.id: job.priority for job in await queue.list_jobs(status="pending", queue="mail")} == {
        "m-pending-1": 5, "m-pending-2": 5}  # fmt: skip
    deleted = await client.act({"action": "delete", "status": "dead", "queue": "web", "note": "spam"})
    entry = await client.get(deleted.headers["Location"])
    assert entry.cell("entry-outcome") == "deleted: 1" and "w-gone" in entry.text
    assert await queue.get("w-gone") is None
    assert (await client.get("/audit/999999")).status == 404
    assert (await client.get("/fragment/nothing")).status == 404
    assert (await client.get("/events?view=nothing")).status == 400
    home = await client.get("/")
    assert (await client.post("/logout", {"csrf": home.csrf()})).headers["Location"] == "/login"
    assert (await client.get("/")).status == 303  # signed out
