"""Fixtures of the browser tests: one live server and one headless Chromium per module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from browser import browser_available, chromium, serve
from selenium.webdriver.remote.webdriver import WebDriver

from api.main import create_app


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve(create_app()) as url:
        yield url


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    if not browser_available():
        message = "needs Debian's chromium and chromium-driver (make test installs them as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with chromium() as browser:
        yield browser
