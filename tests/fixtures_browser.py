"""The `chromium` fixture: a headless Chromium driven by Selenium, for the monitor and chat pages.

Skips where Chromium or its driver is missing, except in CI (CI=true), where that fails the test:
.ci/run installs them. The browser's profile and its driver's log go to the test's tmp_path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["chromium"]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Any]:
    """A `selenium.webdriver.Chrome` with a 1280x900 window; quit at teardown."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        message = f"{CHROMIUM} / {CHROMEDRIVER} missing: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser test cannot run in CI: {message}")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    try:
        yield driver
    finally:
        driver.quit()
