"""Debian's Chromium, headless, driven by Selenium through `chromium-driver`: how the explorer's browser
tests (tests/test_explorer_page.py) and its benchmark (benchmarks/explorer_page.py) open the page.

Selenium (the test extra) and the browser (`apt-get install chromium chromium-driver`) are needed
only here, and imported only when a browser starts.
"""

from __future__ import annotations

import shutil
from typing import Any


def chromium_missing() -> str | None:
    """Why the browser cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        return f"{' and '.join(missing)} not found: apt-get install chromium chromium-driver (.ci/run does)"
    return None


def headless_chromium(width: int, height: int, script_timeout: float, log_requests: bool = False) -> Any:
    """A Selenium driver of a headless Chromium window `width` x `height`; with `log_requests`, Chrome's
    performance log holds every request the page makes. The caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(shutil.which("chromium"))
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    if log_requests:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    driver.set_script_timeout(script_timeout)
    return driver
