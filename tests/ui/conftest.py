"""Fixtures of the dashboard's browser tests: Debian's Chromium, headless, driven by selenium
through Debian's matching chromedriver, against a real dispatcher on a fresh database.

Invariants: no browser or driver is ever downloaded (selenium gets both paths); when Chromium is
missing, `scripts/install_browser.sh` installs it (root with apt-get), else the tests skip saying
why, except in CI (CI=true) where a missing browser fails them. The browser's console is captured
and every test ends asserting it logged no error (`expect_console_errors` names the ones a test
provokes on purpose). Screenshots go to `.artifacts/ui/` (or TASKPLAT_ARTIFACTS_DIR).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from ui_browser import Console

from taskplat.testkit.dispatcher_harness import Dispatcher, serve_dispatcher

ROOT = Path(__file__).resolve().parents[2]


def _binaries() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    found = _binaries()
    if found is None:
        subprocess.run([str(ROOT / "scripts" / "install_browser.sh")], check=False)
        found = _binaries()
    if found is None:
        reason = (
            "Chromium and chromedriver are not installed and cannot be installed here "
            "(needs root and apt-get: `apt-get install chromium chromium-driver`)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    base = Path(os.environ.get("TASKPLAT_ARTIFACTS_DIR") or ROOT / ".artifacts")
    directory = base / "ui" / request.node.name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def browser(chromium: tuple[str, str]) -> Iterator[webdriver.Chrome]:
    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900", "--lang=en-US"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def console(browser: webdriver.Chrome) -> Console:
    return Console(browser)


@pytest.fixture
def dispatcher(db_url: str) -> Iterator[Dispatcher]:
    with serve_dispatcher(db_url) as served:
        served.clock.set(datetime.now(UTC))  # the page's relative times read as they would live
        yield served
