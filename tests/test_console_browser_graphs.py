"""The console's Schedules and Groups screens, a job's graph and the waiting and task filters in headless Chromium, on
SQLite and on PostgreSQL (a real ``python -m asyncq dashboard`` child over ``seed_graphs``' store): schedules paused
and run now from their screen (one, and the ticked ones in bulk), a stale schedule preview refused; a group's
members; what a job waits for and what waits for it; a waiting job cancelled from its page; a delete a graph forbids
not offered, and a bulk delete's preview naming what it leaves out. No page logs a console error.

Skipped with the reason when Chromium, chromedriver or selenium is missing (a failure under ``CI=true``). The
screenshots of these screens come from ``test_console_browser.py``'s hour of work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_browser_support import Operator, run, seeded, started
from console_support import XSS, seed_graphs
from rabbit_support import headless_chromium
from waiting import eventually_sync

from asyncq.queue import Queue

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """``seed_graphs``' schedules and graphs, made in the last ten minutes, in a SQLite file or a PostgreSQL schema."""
    clock = [int(time.time() * 1000)]

    async def seed(queue: Queue) -> None:
        await seed_graphs(queue, clock)

    yield from seeded(request, request.param, tmp_path / "graphs.db", seed, clock)


@pytest.fixture
def operator(target: str, tmp_path: Path) -> Iterator[Operator]:
    with started(target, tmp_path) as url, headless_chromium(tmp_path / "profile", "--window-size=1280,1000") as driver:
        yield Operator(driver, url)


def picked(operator: Operator, table: str, attribute: str) -> list[str]:
    return operator.fresh(
        lambda: [str(row.get_attribute(attribute)) for row in operator.all(f"#{table} tbody tr")]
    )  # fmt: skip


def test_schedules_are_paused_and_run_now_from_their_screen_and_a_stale_set_is_refused(
    operator: Operator, target: str
) -> None:
    operator.sign_in("operator", "olga")
    operator.go("/schedules")
    assert picked(operator, "schedules", "data-schedule") == ["beat", "gone", "nightly"]
    assert f"ERP migration {XSS}" in operator.text("#state-nightly")  # markup shown as text
    assert picked(operator, "schedule-events", "data-kind")[:2] == ["overlap", "missed"]
    operator.submit_live("#pause_schedule-beat", lambda: operator.all("#preview-title"), "the pause preview")
    assert operator.text("#preview-title") == "Pause schedule: 1 schedule"
    operator.confirm("ERP cutover")
    eventually_sync(lambda: operator.all("#entry-outcome"), "the pause")
    assert operator.text("#entry-outcome") == "paused: 1" and operator.text("#entry-actor") == "olga"
    operator.go("/schedules")
    assert "by olga: ERP cutover" in operator.text("#state-beat")
    for name in ("beat", "nightly"):
        operator.click(f'input[data-pick][value="{name}"]')
    operator.find("#bulk-schedule-action").send_keys("run now")
    operator.click("#bulk-schedules-preview")
    eventually_sync(lambda: operator.all("#preview-title"), "the run-now preview")
    assert operator.text("#preview-title") == "Run now: 2 schedules"
    operator.confirm("backfill")
    eventually_sync(lambda: operator.all("#entry-jobs"), "the jobs run now")
    jobs = operator.text("#entry-jobs").split(", ")
    assert [job.split("-now-")[0] for job in jobs] == ["sch-beat", "sch-nightly"]
    assert {run(target, lambda q, j=job: q.get(j)).status for job in jobs} == {"pending"}
    operator.go("/schedules")
    operator.submit_live("#resume_schedule-beat", lambda: operator.all("#preview-title"), "the resume preview")
    run(target, lambda q: q.resume_schedule("beat", note="meanwhile", by="bob"))  # the set changes
    operator.confirm("cutover done")
    eventually_sync(lambda: operator.all("#preview-again"), "the refusal")
    assert "nothing changed" in operator.text("#message")
    [event] = run(target, lambda q: q.schedule_events("beat", limit=1))
    assert (event.kind, event.actor) == ("resume", "bob")
    assert operator.errors(allowed=("409",)) == []


def test_groups_a_jobs_graph_and_what_a_graph_keeps_from_a_delete(operator: Operator, target: str) -> None:
    operator.sign_in("admin", "ada")
    operator.go("/groups")
    assert picked(operator, "groups", "data-group") == ["import-6", "import-7"]
    operator.click('#groups a[href$="/groups/import-7"]')
    eventually_sync(lambda: operator.all("#members"), "the group's page")
    assert operator.rows("members") == ["row-0", "row-1", "row-2", "row-3"]
    assert "1 done, 1 dead, 2 running" in operator.text("#group-facts")
    operator.go("/jobs")
    operator.find("#f-status").send_keys("waiting")
    operator.find("#search").click()
    eventually_sync(lambda: operator.rows("jobs") == ["group-import-7", "merge"], "the waiting jobs")
    operator.go("/jobs")
    operator.find("#f-task").send_keys("fetch")
    operator.find("#search").click()
    eventually_sync(lambda: operator.rows("jobs") == ["fetch-1", "fetch-2"], "a task's jobs")
    assert "task" in operator.text("#plan")
    operator.go("/jobs/merge")
    assert picked(operator, "waits-for", "data-dependency") == ["fetch-2", "fetch-1"]
    assert "waiting — for fetch-1" in operator.text("#timeline")
    operator.go("/jobs/fetch-2")
    assert picked(operator, "dependants", "data-dependant") == ["merge"]
    assert operator.all("#spared") and not operator.all("#act-delete")  # merge still waits for it
    operator.go("/jobs/merge")
    operator.find("#act-cancel input[name=note]").send_keys("report dropped")
    operator.find("#act-cancel button").click()
    eventually_sync(lambda: operator.all("#entry-outcome"), "the cancel")
    assert operator.text("#entry-outcome").startswith("cancelled: 1")
    operator.go("/jobs/fetch-2")  # nothing live waits for it now
    operator.find("#act-delete input[name=note]").send_keys("gdpr")
    operator.find("#act-delete button").click()
    eventually_sync(lambda: operator.all("#entry-outcome"), "the delete")
    assert run(target, lambda q: q.get("fetch-2")) is None
    operator.go("/jobs?status=done")
    operator.click("#scope-filter")
    operator.find("#bulk-action").send_keys("delete")
    operator.click("#bulk-preview")
    eventually_sync(lambda: operator.all("#preview-spared"), "the delete's preview")
    assert operator.rows("preview-spared-sample") == ["row-0", "old-0"] and operator.all("#preview-empty")
    assert operator.errors() == []
