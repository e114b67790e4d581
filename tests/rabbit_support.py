"""Helpers for tests on the machine's real RabbitMQ (and headless Chromium for the browser test).

A test that needs the broker asks for the ``amqp_url`` fixture (import it into the test module). When the
broker cannot be reached the test is skipped with the reason, except under ``CI=true``, where that is a
failure: CI must never pass by skipping. Every test uses its own queue names (:func:`unique_queue`) with
``x-expires`` (:data:`QUEUE_ARGUMENTS`), so runs never see each other's messages and unused queues go away.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
QUEUE_EXPIRES_MS = 300_000
QUEUE_ARGUMENTS = {"x-expires": QUEUE_EXPIRES_MS}
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))


def in_ci() -> bool:
    """Whether this run is CI's, where a missing service fails instead of skipping."""
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Skip the test with ``reason``, or fail it under CI."""
    if in_ci():
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@functools.cache
def broker_problem(url: str = AMQP_URL) -> str | None:
    """``None`` if an AMQP 0-9-1 broker answers the protocol header at ``url``'s host and port, else why not."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            sock.settimeout(3)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            frame_type = sock.recv(1)
    except OSError as exc:
        return f"RabbitMQ is unreachable at {host}:{port}: {exc}"
    if frame_type != b"\x01":  # a method frame: connection.start
        return f"no AMQP 0-9-1 broker answers at {host}:{port}"
    return None


@pytest.fixture
def amqp_url() -> str:
    """The broker's URL, once it is known to answer (skip, or fail under CI, if it does not)."""
    problem = broker_problem()
    if problem is not None:
        unavailable(problem)
    return AMQP_URL


def unique_queue(prefix: str = "asyncq-test") -> str:
    """A queue name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def rabbitmqctl() -> str | None:
    """The ``rabbitmqctl`` program, if this machine has it."""
    return os.environ.get("RABBITMQCTL") or shutil.which("rabbitmqctl") or _existing("/usr/sbin/rabbitmqctl")


def _existing(path: str) -> str | None:
    return path if Path(path).exists() else None


def queue_counts(queue: str) -> tuple[int, int] | None:
    """``(ready, unacknowledged)`` for ``queue`` from ``rabbitmqctl``; ``None`` if it does not list it."""
    program = rabbitmqctl()
    if program is None:
        unavailable("rabbitmqctl is not installed")
    assert program is not None
    command = [program, "-q", "list_queues", "--no-table-headers", "name", "messages_ready"]
    done = subprocess.run([*command, "messages_unacknowledged"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        unavailable(f"rabbitmqctl failed: {done.stderr.strip()}")
    for line in done.stdout.splitlines():
        name, ready, unacked = line.split("\t")
        if name == queue:
            return int(ready), int(unacked)
    return None


def browser_problem() -> str | None:
    """``None`` if headless Chromium can be driven (selenium, chromium and chromedriver), else why not."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is not installed"
    return None


@contextlib.contextmanager
def headless_chromium(profile: Path, *arguments: str, prefs: dict[str, object] | None = None) -> Iterator[Any]:
    """Debian's Chromium driven by Selenium, headless, with a fresh profile in ``profile``; skips (or fails
    under CI=true) when it cannot run. Extra ``arguments`` and ``prefs`` (downloads …) are the caller's."""
    problem = browser_problem()
    if problem is not None:
        unavailable(problem)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"):
        options.add_argument(argument)
    options.add_argument("--disable-dev-shm-usage")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, read by get_log("browser")
    for argument in arguments:
        options.add_argument(argument)
    if prefs:
        options.add_experimental_option("prefs", prefs)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    driver.implicitly_wait(10)  # a click that navigates returns before the next page exists
    try:
        yield driver
    finally:
        driver.quit()
