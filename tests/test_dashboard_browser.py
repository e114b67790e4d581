"""The dashboard in headless Chromium, as an operator uses it: a real ``python -m asyncq dashboard`` child on
port 0 (its URL and token read from its stdout), a queue that moves while it samples, the counts read from the
DOM, a redrive refused without the token, then made with it, and its audit row on the page.

Skipped with the reason when Chromium, chromedriver or selenium is missing (a failure under ``CI=true``).
``ASYNCQ_UPDATE_SCREENSHOT=1`` also saves the page to ``docs/dashboard.png``."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rabbit_support import headless_chromium
from waiting import eventually_sync

from asyncq.core.jobs import JobSpec
from asyncq.queue import Queue

pytestmark = [pytest.mark.browser, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT = ROOT / "docs" / "dashboard.png"
STATUSES = ("pending", "leased", "done", "dead", "waiting")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium with a fresh profile."""
    with headless_chromium(tmp_path / "chromium-profile", "--window-size=1100,1400") as driver:
        yield driver


async def seed(path: Path) -> None:
    """done 4, dead 3 (permanent, exhausted, cancelled), 2 leased by worker-b, 3 pending."""
    async with await Queue.open(path) as queue:
        jobs = [JobSpec(f"ship-{n}", {"order": n}) for n in range(1, 5)]
        jobs += [JobSpec("invoice-17", {"order": 17, "note": "<b>rush</b>"}), JobSpec("invoice-18", {}, max_attempts=1)]
        jobs += [JobSpec("email-1", {"to": "ada"}), JobSpec("email-2", {"to": "bob"}), JobSpec("webhook-3", {})]
        jobs += [JobSpec(f"email-{n}", {"to": f"user-{n}"}) for n in range(3, 6)]
        await queue.enqueue_many(jobs)
        tickets = await queue.claim("worker-a", limit=6)
        for ticket, outcome in zip(tickets, ("ok", "ok", "ok", "ok", "permanent", "retry"), strict=True):
            await queue.finish(ticket, outcome)
        await queue.claim("worker-b", limit=2, lease=600)
        await queue.cancel("webhook-3", "customer-left")


async def step(path: Path, enqueue: int = 0, work: int = 0) -> dict[str, int]:
    """Enqueue ``enqueue`` reports, then claim and finish ``work`` jobs: the queue's counts after."""
    async with await Queue.open(path) as queue:
        start = (await queue.stats()).total
        await queue.enqueue_many([JobSpec(f"report-{start + n}", {"n": n}) for n in range(enqueue)])
        if work:
            for ticket in await queue.claim("worker-c", limit=work):
                await queue.finish(ticket, "ok")
        return dict((await queue.stats()).by_status)


def read_banner(process: subprocess.Popen[bytes], timeout: float = 15) -> dict[str, str]:
    """The ``dashboard: URL`` and ``token: T`` lines the child prints once it listens."""
    assert process.stdout is not None
    fd, data, deadline = process.stdout.fileno(), b"", time.monotonic() + timeout
    while data.count(b"\n") < 2:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"the dashboard printed only {data!r} in {timeout} s")
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                pytest.fail(f"the dashboard exited with {process.wait()} after printing {data!r}")
            data += chunk
    return dict(line.split(": ", 1) for line in data.decode().splitlines()[:2])


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """The queue file, and the dashboard child's URL and token."""
    path = tmp_path / "queue.db"
    asyncio.run(seed(path))
    command = [sys.executable, "-m", "asyncq", "dashboard", "--db", path.name, "--sample-seconds", "0.1"]
    with (tmp_path / "dashboard.err").open("wb") as errors:
        process = subprocess.Popen(
            [*command, "--refresh-seconds", "60"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=errors
        )
    try:
        banner = read_banner(process)
        yield path, banner["dashboard"], banner["token"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(timeout=10) == 0
        finally:
            process.kill()
            process.wait()


def latest_sample(url: str) -> dict[str, int] | None:
    with urllib.request.urlopen(url + "stats.json", timeout=5) as response:
        samples = json.load(response)["samples"]
    return {status: samples[-1][status] for status in STATUSES} if samples else None


def move_the_queue(path: Path, url: str) -> None:
    """A few changes, each seen by the sampler before the next, so the chart has a shape."""
    for enqueue, work in ((0, 0), (8, 0), (0, 5), (0, 4), (6, 0), (0, 3), (0, 0)):
        counts = asyncio.run(step(path, enqueue, work))
        eventually_sync(lambda counts=counts: latest_sample(url) == counts, f"a sample of {counts}", timeout=10)


def redrive(browser: Any, job_id: str, note: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    row = browser.find_element(By.CSS_SELECTOR, f"tr[data-job='{job_id}']")
    row.find_element(By.NAME, "note").send_keys(note)
    row.find_element(By.NAME, "token").send_keys(token)
    row.find_element(By.XPATH, ".//button[text()='Redrive']").click()


def test_an_operator_reads_the_counts_and_redrives_a_dead_job(browser: Any, dashboard: tuple[Path, str, str]) -> None:
    from selenium.webdriver.common.by import By

    path, url, token = dashboard
    move_the_queue(path, url)
    browser.get(url)
    expected = asyncio.run(step(path))
    assert {s: int(browser.find_element(By.ID, f"count-{s}").text) for s in STATUSES} == expected
    assert expected["dead"] == 3 and expected["leased"] == 2
    dead_rows = browser.find_elements(By.CSS_SELECTOR, "#dead tbody tr")
    assert {row.get_attribute("data-job") for row in dead_rows} == {"invoice-17", "invoice-18", "webhook-3"}
    assert "<b>rush</b>" in browser.find_element(By.CSS_SELECTOR, "tr[data-job='invoice-17']").text  # shown as text
    assert "worker-b" in browser.find_element(By.ID, "leases").text
    points = browser.find_element(By.CSS_SELECTOR, "#chart polyline.series-pending").get_attribute("points")
    assert len(points.split()) >= 6  # at least one sample of each of the six states the queue went through

    redrive(browser, "invoice-17", "fixed-parser", "not-the-token")
    eventually_sync(lambda: browser.find_elements(By.ID, "message"), "the refusal page", timeout=10)
    assert "nothing changed" in browser.find_element(By.ID, "message").text
    browser.get(url)
    assert browser.find_element(By.ID, "count-dead").text == "3"

    redrive(browser, "invoice-17", "fixed-parser", token)
    eventually_sync(lambda: "fixed-parser" in audit_text(browser), "the redrive's audit row", timeout=10)
    first = browser.find_element(By.CSS_SELECTOR, "#audit tbody tr").text.split()
    assert first[2:] == ["invoice-17", "redrive", "1", "fixed-parser"]
    assert browser.find_element(By.ID, "count-dead").text == "2"
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-job='invoice-17']")
    if os.environ.get("ASYNCQ_UPDATE_SCREENSHOT") == "1":
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1100, int(height) + 40)
        browser.save_screenshot(str(SCREENSHOT))


def audit_text(browser: Any) -> str:
    """The audit table's text, or "" while the page after the redirect is still loading (the old page's
    element goes stale between finding it and reading it)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        tables = browser.find_elements(By.ID, "audit")
        return str(tables[0].text) if tables else ""
    except StaleElementReferenceException:
        return ""
