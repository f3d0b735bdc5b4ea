"""Keyboard and screen-reader use of the page in headless Chromium: plan rows open with Enter and
Space and say whether they are open, errors are tied to their boxes and take the focus, and the
focused element has a ring one can see."""

from __future__ import annotations

from pagekit import SMALL_JOB, box, open_page, type_into, wait_state
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement


def focus_ring(driver: WebDriver, element: WebElement) -> dict[str, object]:
    return driver.execute_script(
        """const e = arguments[0], style = getComputedStyle(e);
        return {focused: document.activeElement === e, visible: e.matches(':focus-visible'),
                style: style.outlineStyle, width: parseFloat(style.outlineWidth)};""",
        element,
    )


def test_space_and_enter_open_a_focused_plan_row_that_says_whether_it_is_open(driver: WebDriver, base_url: str) -> None:
    assert open_page(driver, base_url, SMALL_JOB) == "done"
    row = driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"]')
    detail = driver.find_element(By.CSS_SELECTOR, "tr.detail")
    assert row.get_attribute("role") == "button"
    assert row.get_attribute("aria-expanded") == "false"
    assert row.get_attribute("aria-controls") == detail.get_attribute("id")

    driver.execute_script("window.scrollTo(0, 0)")
    box(driver, "cluster.num_gpus").click()
    actions = ActionChains(driver)
    for _ in range(60):  # the keyboard's way to the row
        if driver.execute_script("return document.activeElement") == row:
            break
        actions.send_keys(Keys.TAB).perform()
    ring = focus_ring(driver, row)
    assert ring["visible"] and ring["style"] == "solid" and float(str(ring["width"])) >= 2, ring
    scrolled = driver.execute_script("return window.scrollY")

    actions.send_keys(Keys.SPACE).perform()
    assert detail.is_displayed()
    assert row.get_attribute("aria-expanded") == "true"
    assert driver.execute_script("return window.scrollY") == scrolled  # Space did not scroll the page
    actions.send_keys(Keys.SPACE).perform()
    assert not detail.is_displayed() and row.get_attribute("aria-expanded") == "false"
    actions.send_keys(Keys.ENTER).perform()
    assert detail.is_displayed() and row.get_attribute("aria-expanded") == "true"


def test_errors_are_tied_to_their_boxes_and_the_first_takes_the_focus(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url)
    type_into(driver, "cluster.num_gpus", "64")
    type_into(driver, "training.seq_len", "0")
    type_into(driver, "search.top_k", "0")
    driver.execute_script("document.querySelector('details.advanced').open = false")
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "error"
    assert driver.find_element(By.ID, "status").text == "invalid request"

    tied = driver.execute_script(
        """return [...document.querySelectorAll('[data-for]')].map(e => {
            const field = document.querySelector(`[name="${e.dataset.for}"]`);
            return [e.dataset.for, e.id !== '' && (field.getAttribute('aria-describedby') || '').split(' ').includes(e.id),
                    field.getAttribute('aria-invalid')];});"""
    )
    assert tied == [["training.seq_len", True, "true"], ["search.top_k", True, "true"]]
    assert driver.execute_script("return document.activeElement.name") == "training.seq_len"
    assert driver.find_element(By.CSS_SELECTOR, "details.advanced").get_attribute("open") is not None
    ring = focus_ring(driver, box(driver, "training.seq_len"))
    assert ring["focused"] and ring["style"] == "solid" and float(str(ring["width"])) >= 2, ring

    type_into(driver, "training.seq_len", "4096")
    type_into(driver, "search.top_k", "1")
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"
    for name in ("training.seq_len", "search.top_k"):
        assert box(driver, name).get_attribute("aria-describedby") is None
        assert box(driver, name).get_attribute("aria-invalid") is None
