"""The console in headless Chromium, as operators use it, on SQLite and on PostgreSQL: a real ``python -m asyncq
dashboard`` child (its URL read from its stdout; role tokens from its environment) over a queue the test moves.
Every screen, every action (retry/redrive, cancel, delete, a new priority, pause and resume; one job and in bulk)
and every refusal (a stale bulk preview, a read-only role, a missing CSRF token) is driven through the page, and no
page logs a console error. Live regions are updated by server-sent events, or by polling where those are missing,
and what the operator types survives an update; an update waits while a button of its region is pressed.

Skipped with the reason when Chromium, chromedriver or selenium is missing (a failure under ``CI=true``).
``ASYNCQ_UPDATE_SCREENSHOT=1`` also saves each screen to ``docs/console-*.png`` (from the SQLite run)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from console_browser_support import Operator, run, seeded, shots, started
from console_support import an_hour_of_work, seed
from rabbit_support import headless_chromium
from waiting import eventually_sync

from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SCREENS = ("overview", "jobs", "job", "dead", "schedules", "groups", "group", "graph", "workers", "audit", "preview")


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A queue in every state, in a SQLite file or a PostgreSQL schema of its own."""
    yield from seeded(request, request.param, tmp_path / "queue.db", seed)


@pytest.fixture
def console(target: str, tmp_path: Path) -> Iterator[str]:
    """The console child's URL (samples every 0.2 s)."""
    with started(target, tmp_path) as url:
        yield url


@pytest.fixture
def operator(console: str, tmp_path: Path) -> Iterator[Operator]:
    with headless_chromium(tmp_path / "profile", "--window-size=1280,1000") as driver:
        yield Operator(driver, console)


def test_the_overview_goes_live_and_keeps_what_is_typed(operator: Operator, target: str) -> None:
    operator.sign_in("admin", "ada")
    assert operator.text("#count-dead") == "4" and operator.text("#count-leased") == "1"
    eventually_sync(lambda: operator.driver.execute_script("return document.body.dataset.live") == "sse", "SSE")
    run(target, lambda q: q.enqueue_many([JobSpec(f"new-{n}", {"n": n}, "mail") for n in range(5)]))
    eventually_sync(lambda: operator.text("#count-pending") == "8", "the new jobs, without a reload", timeout=20)
    eventually_sync(lambda: int(operator.attribute("#chart-depth", "data-samples") or 0) >= 2, "samples charted",
                    timeout=20)  # fmt: skip
    assert operator.all('#queues tr[data-queue="mail"]') and operator.all('#queues tr[data-queue="web"]')
    operator.go("/jobs?status=pending&queue=mail")
    box = operator.find("#f-body")
    box.send_keys("customer.id = 1")  # typed, not submitted
    operator.click('input[data-pick][value="m-pending-1"]')
    before = int(operator.attribute("#live", "data-updates") or 0)
    run(target, lambda q: q.enqueue("m-extra", {"n": 1}, queue="mail"))
    eventually_sync(lambda: "m-extra" in operator.rows("jobs"), "the new job in the list", timeout=20)
    assert int(operator.attribute("#live", "data-updates") or 0) > before
    assert box.get_attribute("value") == "customer.id = 1"  # what was typed survived the update
    assert operator.fresh(lambda: operator.find('input[data-pick][value="m-pending-1"]').is_selected())  # ticked
    assert operator.errors() == []


def test_the_polling_fallback_updates_a_browser_without_event_streams(operator: Operator, target: str) -> None:
    operator.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "delete window.EventSource;"})
    operator.sign_in("read_only", "rita")
    operator.go("/workers")
    assert operator.driver.execute_script("return document.body.dataset.live") == "poll"
    assert operator.all('#holders tr[data-owner="worker-7"]')
    run(target, lambda q: q.claim("worker-9", queue="web", lease=600))
    eventually_sync(lambda: operator.all('#holders tr[data-owner="worker-9"]'), "the new holder, polled", timeout=20)
    assert operator.errors() == []


def test_every_screen_and_each_action_on_one_job(operator: Operator, target: str) -> None:
    operator.sign_in("admin", "ada")
    operator.go("/jobs")
    assert len(operator.rows("jobs")) == 9
    operator.find("#f-status").send_keys("dead")
    operator.find("#f-error").send_keys("ValueError")
    operator.find("#search").click()
    eventually_sync(lambda: operator.rows("jobs") == ["m-bad-2", "m-bad-1"], "the filtered list")
    assert "error_type" in operator.text("#plan")
    operator.go("/jobs/m-tired")
    assert "TimeoutError: slow" in operator.text("#timeline")
    operator.find("#act-redrive input[name=note]").send_keys("timeout raised")
    operator.find("#act-redrive button").click()
    eventually_sync(lambda: operator.all("#entry-title"), "the audit entry")
    assert operator.text("#entry-outcome") == "redriven: 1" and operator.text("#entry-actor") == "ada"
    operator.go("/jobs/m-pending-2")
    operator.find("#act-priority input[name=new_priority]").send_keys("42")
    operator.find("#act-priority input[name=note]").send_keys("vip customer")
    operator.find("#act-priority button").click()
    eventually_sync(lambda: operator.all("#entry-title"), "the priority's audit entry")
    operator.go("/jobs/m-pending-2")
    assert operator.text("#job-priority") == "42"
    assert "priority" in operator.text("#timeline") and "vip customer" in operator.text("#timeline")
    operator.find("#act-delete input[name=note]").send_keys("duplicate order")
    operator.find("#act-delete button").click()
    eventually_sync(lambda: operator.all("#entry-title"), "the delete's audit entry")
    assert run(target, lambda q: q.get("m-pending-2")) is None
    operator.go("/jobs/m-busy")
    operator.find("#act-cancel input[name=note]").send_keys("customer left")
    operator.find("#act-cancel button").click()
    eventually_sync(lambda: operator.all("#entry-outcome"), "the cancel's audit entry")
    assert operator.text("#entry-outcome") == "cancelled: 0, requested: 1, requested before: 0"
    operator.go("/jobs/m-busy")
    assert operator.all("#cancel-request")  # its holder stops it at its next renewal
    operator.go("/audit")
    operator.find("#a-actor").send_keys("ada")
    operator.find("#audit-go").click()
    eventually_sync(lambda: len(operator.all("#operations tbody tr")) == 4, "ada's four actions")
    assert operator.errors() == []


def test_an_update_waits_while_the_operator_presses_a_button_of_the_live_region(
    operator: Operator, target: str
) -> None:
    """A press held on a region's button while updates arrive: none replaces the button under the press, and the
    release clicks it (once). A press that clicks nothing lets the update that waited in on its release."""
    from selenium.webdriver.common.action_chains import ActionChains

    operator.sign_in("admin", "ada")
    eventually_sync(lambda: operator.driver.execute_script("return document.body.dataset.live") == "sse", "SSE")

    def updates() -> int:
        return int(operator.attribute("#live", "data-updates") or 0)

    def pending() -> bool:
        return operator.attribute("#live", "data-pending") == "yes"

    def press(css: str) -> None:  # where the element is: an update between finding and pressing moves no button
        operator.fresh(lambda: ActionChains(operator.driver).click_and_hold(operator.find(css)).perform())

    press('#queues tr[data-queue="mail"] td')
    before = updates()
    run(target, lambda q: q.enqueue_many([JobSpec(f"held-{n}", {"n": n}, "mail") for n in range(3)]))
    eventually_sync(pending, "an update waiting for the release", timeout=20)
    assert updates() == before and operator.text("#count-pending") == "3"  # the page under the press is unchanged
    ActionChains(operator.driver).release().perform()
    eventually_sync(lambda: operator.text("#count-pending") == "6", "the update that waited, in", timeout=20)
    assert updates() > before and not pending()
    press("#pause-web")
    before = updates()
    run(target, lambda q: q.enqueue("held-web", {"n": 1}, queue="web"))
    eventually_sync(pending, "an update waiting under the pressed button", timeout=20)
    assert updates() == before  # the pressed button is still the page's
    ActionChains(operator.driver).release().perform()
    eventually_sync(lambda: operator.all("#preview-title"), "the pause preview, from the one press", timeout=20)
    assert operator.text("#preview-title") == "Pause: 1 queue"
    assert run(target, lambda q: q.paused_queues()) == []  # a preview changes nothing
    assert operator.errors() == []


def test_bulk_actions_act_on_the_previewed_set_and_a_stale_one_is_refused(operator: Operator, target: str) -> None:
    operator.sign_in("operator", "olga")
    operator.go("/dead")
    assert operator.all('#groups tr[data-group="mail/permanent/ValueError"]')
    operator.fresh(
        lambda: (
            operator.find('#groups tr[data-group="mail/permanent/ValueError"]')
            .find_element(operator.by().XPATH, ".//button[text()='Redrive group…']")
            .click()
        )
    )
    eventually_sync(lambda: operator.all("#preview-title"), "the preview")
    assert operator.text("#preview-title") == "Redrive: 2 jobs"
    assert sorted(operator.rows("preview-sample")) == ["m-bad-1", "m-bad-2"]
    run(target, lambda q: q.redrive("m-bad-1", "someone else fixed it"))  # the set changes under the preview
    operator.confirm("parser fixed")
    eventually_sync(lambda: operator.all("#preview-again"), "the refusal")
    assert "nothing changed" in operator.text("#message")
    assert operator.errors(allowed=("409",)) == []
    assert run(target, lambda q: q.get("m-bad-2")).status == "dead"
    operator.find("#preview-again button").click()
    eventually_sync(lambda: operator.all("#preview-title"), "the new preview")
    assert operator.text("#preview-title") == "Redrive: 1 job"
    operator.confirm("parser fixed")
    eventually_sync(lambda: operator.all("#entry-title"), "the audit entry")
    assert run(target, lambda q: q.get("m-bad-2")).status == "pending"
    operator.go("/jobs?status=pending&queue=mail")
    for job_id in ("m-pending-1", "m-pending-2"):
        operator.click(f'input[data-pick][value="{job_id}"]')
    operator.find("#bulk-action").send_keys("cancel")
    operator.find("#bulk-preview").click()
    eventually_sync(lambda: operator.all("#preview-title"), "the cancel preview")
    assert operator.text("#preview-title") == "Cancel: 2 jobs"
    operator.confirm("orders withdrawn")
    eventually_sync(lambda: operator.all("#entry-outcome"), "the bulk cancel")
    assert operator.text("#entry-outcome").startswith("cancelled: 2")
    operator.go("/")
    operator.submit_live("#pause-web", lambda: operator.all("#preview-title"), "the pause preview")
    operator.confirm("web partner down")
    eventually_sync(lambda: operator.all("#entry-title"), "the pause")
    operator.go("/")
    assert operator.all("#resume-web") and "web partner down" in operator.text('#queues tr[data-queue="web"]')
    operator.submit_live("#resume-web", lambda: operator.all("#preview-title"), "the resume preview")
    operator.confirm("partner back")
    eventually_sync(lambda: operator.all("#entry-title"), "the resume")
    assert run(target, lambda q: q.paused_queues()) == []
    assert operator.errors() == []


def test_a_read_only_role_and_a_missing_csrf_token_are_refused(operator: Operator, target: str) -> None:
    operator.sign_in("read_only", "rita")
    operator.go("/jobs/m-bad-1")
    assert not operator.all("form[id^=act-]") and not operator.all("#bulk-jobs")
    before = run(target, lambda q: q.get("m-bad-1"))
    forged = """
      var f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];
      for (var [k, v] of Object.entries(arguments[1])) { var i = document.createElement('input'); i.type = 'hidden';
        i.name = k; i.value = v; f.appendChild(i); }
      document.body.appendChild(f); f.submit();"""
    csrf = operator.find("meta[name=csrf-token]").get_attribute("content")
    operator.driver.execute_script(forged, operator.base + "/preview", {"csrf": csrf, "action": "redrive",
                                                                      "ids": "m-bad-1"})  # fmt: skip
    eventually_sync(lambda: operator.all("#message"), "the refusal")
    assert "may not redrive" in operator.text("#message") and "Nothing changed" in operator.text("#message")
    assert operator.errors(allowed=("403",)) == []
    operator.go("/login")
    operator.sign_in("operator", "olga")
    operator.go("/jobs/m-bad-1")
    operator.driver.execute_script("document.querySelector('#act-redrive input[name=csrf]').remove();")
    operator.find("#act-redrive input[name=note]").send_keys("no token")
    operator.find("#act-redrive button").click()
    eventually_sync(lambda: operator.all("#message"), "the CSRF refusal")
    assert "missing CSRF token: nothing changed" in operator.text("#message")
    assert operator.errors(allowed=("403",)) == []
    assert run(target, lambda q: q.get("m-bad-1")) == before


@pytest.fixture
def busy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store that worked for the last hour, sampled each minute (``an_hour_of_work``)."""
    clock = [int(time.time() * 1000) - 60 * 60_000]

    async def work(queue: Queue) -> None:
        await an_hour_of_work(queue, clock)

    yield from seeded(request, request.param, tmp_path / "busy.db", work, clock)


@pytest.mark.parametrize("busy", ["sqlite", "postgresql"], indirect=True)
def test_an_hour_of_samples_is_charted_and_every_screen_shows_it(busy: str, tmp_path: Path) -> None:
    with (
        started(busy, tmp_path, sample_seconds=30) as url,
        headless_chromium(tmp_path / "p", "--window-size=1280,1000") as driver,
    ):
        operator = Operator(driver, url)
        operator.sign_in("admin", "ada")
        for series in ("done", "failed", "pending"):
            points = operator.attribute(f'polyline[data-series="{series}"]', "points") or ""
            assert len(points.split()) >= 50, series  # a point a minute over the hour
        assert operator.all('#queues tr.paused[data-queue="billing"]')
        assert operator.all('#retention-rules tr[data-rule="mail/"]')
        assert "3 of 8" in operator.text('#limits tr[data-limits="mail"]')  # the leases held, against the limit
        screenshots = shots(busy)
        for name, path in (("overview", "/"), ("jobs", "/jobs?queue=orders"), ("dead", "/dead"),
                           ("schedules", "/schedules"), ("groups", "/groups"),
                           ("group", "/groups/import-2026-12-05?status=dead"), ("graph", "/jobs/merge-report"),
                           ("workers", "/workers"), ("audit", "/audit")):  # fmt: skip
            operator.go(path)
            if screenshots:
                operator.shoot(name)
        operator.go("/schedules")
        assert operator.all('#schedules tr.paused[data-schedule="rollup"]') and operator.all("#schedule-events tr")
        operator.go("/groups/import-2026-12-05")
        assert len(operator.rows("members")) == 50 and operator.all("#next-page")
        operator.go("/dead")
        dead = operator.rows("dead")
        assert dead and operator.all("#groups tbody tr")
        operator.go(f"/jobs/{dead[0]}")
        assert "failed" in operator.text("#timeline")
        if screenshots:
            operator.shoot("job")
        operator.go("/dead")
        operator.click("#dead-scope-all")
        operator.click("#bulk-redrive")
        eventually_sync(lambda: operator.all("#preview-title"), "the preview of every dead job")
        if screenshots:
            operator.shoot("preview")
        assert operator.errors() == []
