"""The console in headless Chromium, as operators use it, on SQLite and on PostgreSQL: a real ``python -m asyncq
dashboard`` child (its URL read from its stdout; role tokens from its environment) over a queue the test moves.
Every screen, every action (retry/redrive, cancel, delete, a new priority, pause and resume; one job and in bulk)
and every refusal (a stale bulk preview, a read-only role, a missing CSRF token) is driven through the page, and no
page logs a console error. Live regions are updated by server-sent events, or by polling where those are missing,
and what the operator types survives an update.

Skipped with the reason when Chromium, chromedriver or selenium is missing (a failure under ``CI=true``).
``ASYNCQ_UPDATE_SCREENSHOT=1`` also saves each screen to ``docs/console-*.png`` (from the SQLite run)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_support import TOKENS, an_hour_of_work, seed
from postgres_support import fresh_schema
from rabbit_support import headless_chromium
from waiting import eventually_sync

from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]
SCREENS = ("overview", "jobs", "job", "dead", "workers", "audit", "preview")


def run(target: str, make: Any) -> Any:
    """``make(queue)`` on the target's queue, in this thread (the browser test is synchronous)."""

    async def main() -> Any:
        async with await Queue.open(target) as queue:
            return await make(queue)

    return asyncio.run(main())


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A queue in every state, in a SQLite file or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        found = str(tmp_path / "queue.db")
        run(found, seed)
        yield found
        return
    request.getfixturevalue("postgres_database")  # this run's database (skips, or fails under CI, without a server)
    schema = fresh_schema()  # entered and left on two event loops: it holds no connection between them
    url, _name = asyncio.run(schema.__aenter__())
    try:
        run(url, seed)
        yield url
    finally:
        asyncio.run(schema.__aexit__(None, None, None))


def read_banner(process: subprocess.Popen[bytes], timeout: float = 20) -> dict[str, str]:
    assert process.stdout is not None
    fd, data, deadline = process.stdout.fileno(), b"", time.monotonic() + timeout
    while data.count(b"\n") < 2:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"the console printed only {data!r} in {timeout} s")
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                pytest.fail(f"the console exited with {process.wait()} after printing {data!r}")
            data += chunk
    return dict(line.split(": ", 1) for line in data.decode().splitlines()[:2])


@contextlib.contextmanager
def started(target: str, folder: Path, sample_seconds: float = 0.2) -> Iterator[str]:
    """A console child on ``target`` (admin, operator and read-only tokens): its URL; SIGTERM ends it with 0."""
    env = {**os.environ, **{f"ASYNCQ_CONSOLE_{role.upper()}_TOKEN": token for role, token in TOKENS.items()}}
    command = [sys.executable, "-m", "asyncq", "dashboard", "--db", target, "--sample-seconds", str(sample_seconds)]
    with (folder / "console.err").open("wb") as errors:
        process = subprocess.Popen(
            [*command, "--refresh-seconds", "0.2"], cwd=folder, stdout=subprocess.PIPE, stderr=errors, env=env
        )
    try:
        yield read_banner(process)["dashboard"].rstrip("/")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=15) == 0
        finally:
            process.kill()
            process.wait()


@pytest.fixture
def console(target: str, tmp_path: Path) -> Iterator[str]:
    """The console child's URL (samples every 0.2 s)."""
    with started(target, tmp_path) as url:
        yield url


class Operator:
    """One operator's browser: signs in, opens screens, fills forms, and reads the page's console log."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base

    def by(self) -> Any:
        from selenium.webdriver.common.by import By

        return By

    def go(self, path: str) -> None:
        self.driver.get(self.base + path)
        eventually_sync(lambda: self.driver.execute_script("return document.body.dataset.ready") == "yes", path)

    def find(self, css: str) -> Any:
        return self.driver.find_element(self.by().CSS_SELECTOR, css)

    def fresh(self, use: Any) -> Any:
        """``use()`` again while the element it found was replaced by a live update in the meantime."""
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

        for _ in range(50):
            try:
                return use()
            except StaleElementReferenceException:
                continue
            except WebDriverException as error:  # the node went between finding and reading it: as stale
                if "does not belong to the document" not in str(error):
                    raise
        return use()

    def all(self, css: str) -> list[Any]:
        return list(self.driver.find_elements(self.by().CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return str(self.fresh(lambda: self.find(css).text))

    def click(self, css: str) -> None:
        self.fresh(lambda: self.find(css).click())

    def attribute(self, css: str, name: str) -> str | None:
        found = self.fresh(lambda: self.find(css).get_attribute(name))
        return None if found is None else str(found)

    def sign_in(self, role: str, name: str) -> None:
        self.go("/login")
        self.find("#login-name").send_keys(name)
        self.find("#login-token").send_keys(TOKENS[role])
        self.find("#login-go").click()
        eventually_sync(lambda: self.all("#role") and self.text("#role") == role, f"signed in as {role}")

    def rows(self, table: str) -> list[str]:
        return self.fresh(lambda: [str(row.get_attribute("data-job")) for row in self.all(f"#{table} tbody tr")])

    def errors(self, allowed: tuple[str, ...] = ()) -> list[str]:
        """The console's errors since the last look (``allowed``: texts of expected ones, as a refusal's status)."""
        logged = self.driver.get_log("browser")
        return [
            entry["message"]
            for entry in logged
            if entry["level"] in ("SEVERE", "ERROR") and not any(text in entry["message"] for text in allowed)
        ]

    def confirm(self, note: str, count: int | None = None) -> None:
        """On a preview: the note, the count typed, confirm."""
        shown = int(self.find("#confirm input[name=count]").get_attribute("value"))
        self.find("#note").send_keys(note)
        self.find("#confirm-count").send_keys(str(shown if count is None else count))
        self.find("#do-it").click()

    def shoot(self, name: str) -> None:
        if os.environ.get("ASYNCQ_UPDATE_SCREENSHOT") == "1":
            height = self.driver.execute_script("return document.documentElement.scrollHeight")
            self.driver.set_window_size(1280, min(max(int(height) + 40, 700), 2200))
            self.driver.save_screenshot(str(ROOT / "docs" / f"console-{name}.png"))
            self.driver.set_window_size(1280, 1000)


@pytest.fixture
def operator(console: str, tmp_path: Path) -> Iterator[Operator]:
    with headless_chromium(tmp_path / "profile", "--window-size=1280,1000") as driver:
        yield Operator(driver, console)


def shots(target: str) -> bool:
    return not target.startswith("postgres")


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
    operator.click("#pause-web")
    eventually_sync(lambda: operator.all("#preview-title"), "the pause preview")
    operator.confirm("web partner down")
    eventually_sync(lambda: operator.all("#entry-title"), "the pause")
    operator.go("/")
    assert operator.all("#resume-web") and "web partner down" in operator.text('#queues tr[data-queue="web"]')
    operator.click("#resume-web")
    eventually_sync(lambda: operator.all("#preview-title"), "the resume preview")
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
    start = int(time.time() * 1000) - 60 * 60_000
    clock = [start]

    async def work(queue: Queue) -> None:
        await an_hour_of_work(queue, clock)

    async def open_at(target: str) -> None:
        async with await Queue.open(target, clock=lambda: clock[0]) as queue:
            await work(queue)

    if request.param == "sqlite":
        found = str(tmp_path / "busy.db")
        asyncio.run(open_at(found))
        yield found
        return
    request.getfixturevalue("postgres_database")
    schema = fresh_schema()
    url, _name = asyncio.run(schema.__aenter__())
    try:
        asyncio.run(open_at(url))
        yield url
    finally:
        asyncio.run(schema.__aexit__(None, None, None))


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
        screenshots = shots(busy)
        for name, path in (("overview", "/"), ("jobs", "/jobs?queue=orders"), ("dead", "/dead"),
                           ("workers", "/workers"), ("audit", "/audit")):  # fmt: skip
            operator.go(path)
            if screenshots:
                operator.shoot(name)
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
