"""The page on a 400 px wide screen in headless Chromium: nothing scrolls the page sideways (wide
tables scroll in their own box) and the charts take the width they have."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pagekit import SMALL_JOB, open_page, wait_for
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

WIDTH = 400


@pytest.fixture
def narrow(driver: WebDriver) -> Iterator[WebDriver]:
    """The module's browser with a 400 px viewport (a window cannot be made that narrow)."""
    metrics = {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        yield driver
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def overflow(driver: WebDriver) -> dict[str, object]:
    """How far the page is wider than the viewport, and the elements that stick out of it."""
    return driver.execute_script(
        """const width = document.documentElement.clientWidth;
        const out = [...document.querySelectorAll('main *')].filter(e => {
            const box = e.getBoundingClientRect();
            if (!box.width || e.closest('.table-wrap')) return false;
            return box.right > width + 0.5 || box.left < -0.5;
        }).map(e => e.id || e.getAttribute('name') || e.tagName);
        return {extra: document.documentElement.scrollWidth - width, out: out.slice(0, 8)};"""
    )


def test_nothing_scrolls_the_page_sideways_at_400_px(narrow: WebDriver, base_url: str) -> None:
    driver = narrow
    open_page(driver, base_url)
    driver.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")
    assert overflow(driver) == {"extra": 0, "out": []}

    assert open_page(driver, base_url, SMALL_JOB) == "done"
    driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"]').click()  # its launch text too
    assert overflow(driver) == {"extra": 0, "out": []}
    wrap = driver.execute_script(
        "const w = document.querySelector('#plans').parentElement;"
        "return {cls: w.className, scroll: w.scrollWidth, client: w.clientWidth};"
    )
    assert wrap["cls"] == "table-wrap" and wrap["scroll"] > wrap["client"]  # the table scrolls in its box
    for testid in ("time-chart", "memory-chart"):
        size = driver.execute_script(
            """const c = document.querySelector(`[data-testid='${arguments[0]}']`);
            const [box, title] = [c.getBoundingClientRect(), c.querySelector('.gtitle').getBoundingClientRect()];
            return {svg: c.querySelector('.main-svg').getBoundingClientRect().width, room: c.parentElement.clientWidth,
                    title_in: title.left >= box.left && title.right <= box.right};""",
            testid,
        )
        assert size["svg"] == pytest.approx(size["room"], abs=1)
        assert size["title_in"], testid

    gpus = driver.find_element(By.ID, "sweep-gpus")
    gpus.clear()
    gpus.send_keys("8, 16")
    driver.find_element(By.ID, "sweep-start").click()
    assert wait_for(driver, "return document.body.dataset.sweep", "done", "error") == "done"
    assert overflow(driver) == {"extra": 0, "out": []}


def test_the_two_plan_charts_share_a_1280_px_screen(driver: WebDriver, base_url: str) -> None:
    driver.set_window_size(1280, 900)
    try:
        assert open_page(driver, base_url, SMALL_JOB) == "done"
        boxes = driver.execute_script(
            "return ['time-chart', 'memory-chart'].map(id => document.getElementById(id).getBoundingClientRect())"
            ".map(b => ({top: b.top, width: b.width}));"
        )
        main_width = driver.execute_script("return document.querySelector('main').clientWidth")
    finally:
        driver.set_window_size(1400, 1000)
    assert boxes[0]["top"] == boxes[1]["top"]  # side by side
    assert boxes[0]["width"] + boxes[1]["width"] > 0.8 * main_width
