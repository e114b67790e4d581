"""The Nightjar site in headless Chromium: register, see the ticket being prepared, run the worker, then
open and download the ticket. Skipped with the reason when Chromium, chromedriver or selenium is missing
(a failure under ``CI=true``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rabbit_support import amqp_url, headless_chromium
from ticket_desk_support import TicketDesk
from waiting import eventually_sync

pytestmark = [pytest.mark.rabbitmq, pytest.mark.browser, pytest.mark.timeout(90)]
__all__ = ["amqp_url"]  # the fixture, imported for pytest


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium that downloads into ``tmp_path / "downloads"``."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    prefs = {"download.default_directory": str(downloads), "download.prompt_for_download": False}
    with headless_chromium(tmp_path / "chromium-profile", prefs=prefs) as driver:
        yield driver


def test_register_then_open_and_download_the_ticket(tmp_path: Path, amqp_url: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    def wait_for_url(suffix: str) -> None:
        WebDriverWait(browser, 30).until(expected_conditions.url_matches(f"{suffix}$"))

    desk = TicketDesk(tmp_path, amqp_url)
    try:
        browser.get(desk.start_site() + "/")
        browser.find_element(By.LINK_TEXT, "Explore the evening").click()
        browser.find_element(By.LINK_TEXT, "Plan your visit").click()
        browser.find_element(By.LINK_TEXT, "The evening").click()
        field = browser.find_element(By.ID, "name")
        assert browser.find_element(By.CSS_SELECTOR, "label[for=name]").text == "Guest name"
        field.send_keys("Normal guest")
        browser.find_element(By.XPATH, "//button[text()='Register for the evening']").click()

        wait_for_url("/registrations/R-0002")
        assert "Your ticket is being prepared" in browser.find_element(By.TAG_NAME, "body").text
        eventually_sync(lambda: desk.published("R-0002"), "the relay to publish R-0002", timeout=30)
        assert desk.worker() == ["Received R-0002 redelivered=False", "Handler returned."]

        browser.find_element(By.LINK_TEXT, "Your registrations").click()
        browser.find_element(By.PARTIAL_LINK_TEXT, "Normal guest").click()
        browser.find_element(By.LINK_TEXT, "Open ticket").click()
        assert "Normal guest" in browser.find_element(By.CLASS_NAME, "ticket").text
        browser.find_element(By.LINK_TEXT, "Download ticket").click()
        downloaded = tmp_path / "downloads" / "nightjar-ticket-R-0002.txt"
        eventually_sync(downloaded.exists, "the downloaded ticket", timeout=30)
        text = downloaded.read_text()
        assert "Registration: R-0002" in text and "Name: Normal guest" in text

        browser.find_element(By.LINK_TEXT, "Back to registration").click()
        wait_for_url("/registrations/R-0002")
        browser.get(desk.url + "/registrations/R-0001")
        browser.find_element(By.LINK_TEXT, "Open ticket").click()
        assert "Mina Patel" in browser.find_element(By.CLASS_NAME, "ticket").text
    finally:
        desk.close()
