"""What the console's browser tests share: a real ``python -m asyncq dashboard`` child on a store (its URL read from
its stdout, role tokens from its environment), a store seeded in a SQLite file or a PostgreSQL schema of its own, and
an operator's browser (headless Chromium through selenium) that signs in, opens screens, fills forms, reads the
page's console log and, with ``ASYNCQ_UPDATE_SCREENSHOT=1``, saves screens to ``docs/console-*.png``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from console_support import TOKENS
from postgres_support import fresh_schema
from waiting import eventually_sync

from asyncq.queue import Queue

ROOT = Path(__file__).resolve().parents[1]


def run(target: str, make: Any) -> Any:
    """``make(queue)`` on the target's queue, in this thread (the browser test is synchronous)."""

    async def main() -> Any:
        async with await Queue.open(target) as queue:
            return await make(queue)

    return asyncio.run(main())


def seeded(
    request: pytest.FixtureRequest,
    kind: str,
    path: Path,
    seed: Callable[[Queue], Awaitable[Any]],
    clock: list[int] | None = None,
) -> Iterator[str]:
    """A store seeded by ``seed(queue)`` (the queue on ``clock`` if given): a SQLite file at ``path``, or (``kind``
    ``postgresql``) a PostgreSQL schema of its own, dropped after. Its target (a path or URL)."""

    async def open_at(target: str) -> None:
        opened = Queue.open(target) if clock is None else Queue.open(target, clock=lambda: clock[0])
        async with await opened as queue:
            await seed(queue)

    if kind == "sqlite":
        asyncio.run(open_at(str(path)))
        yield str(path)
        return
    request.getfixturevalue("postgres_database")  # this run's database (skips, or fails under CI, without a server)
    schema = fresh_schema()  # entered and left on two event loops: it holds no connection between them
    url, _name = asyncio.run(schema.__aenter__())
    try:
        asyncio.run(open_at(url))
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

    def submit_live(self, css: str, arrived: Callable[[], object], what: str) -> None:
        """Click the button ``css`` of a form in a live region once, and wait until ``arrived()``. An update that
        lands between the click's press and release waits for the release (``console.js``): one click is enough,
        however often the region is updated (under a load of 4 the updates land every second)."""
        self.click(css)
        eventually_sync(arrived, what, timeout=20)

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
        """The ``data-job`` of each row of ``table``, read in one script: row by row, a live update that replaced the
        table between two reads made the next one stale (seen on a machine with a load of 4)."""
        script = "return [...document.querySelectorAll(arguments[0])].map(row => row.getAttribute('data-job'))"
        return [str(job) for job in self.driver.execute_script(script, f"#{table} tbody tr")]

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
        """Save the whole page (``ASYNCQ_UPDATE_SCREENSHOT=1``): the window grown until the page fits its viewport."""
        if os.environ.get("ASYNCQ_UPDATE_SCREENSHOT") == "1":
            for _ in range(4):  # the window's frame takes its share of the height: measure again once resized
                page, viewport, window = self.driver.execute_script(
                    "return [document.documentElement.scrollHeight, window.innerHeight, window.outerHeight]"
                )
                if page <= viewport:
                    break
                self.driver.set_window_size(1280, min(int(page) + int(window) - int(viewport) + 8, 2400))
            self.driver.save_screenshot(str(ROOT / "docs" / f"console-{name}.png"))
            self.driver.set_window_size(1280, 1000)


def shots(target: str) -> bool:
    return not target.startswith("postgres")
