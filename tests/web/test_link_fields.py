"""A job link's fields that have no box on the form, in headless Chromium: shown in an "also from
the link" line, each with a button that clears it from later requests."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from pagekit import SMALL_JOB, open_page, wait_state
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

LINKED = {
    **SMALL_JOB,
    "search": {**SMALL_JOB["search"], "allow": {"tp": [1, 2]}},
    "reliability": {"gpu_mtbf_hours": 50000},
}


def extras(driver: WebDriver) -> list[tuple[str, str]]:
    line = driver.find_element(By.CSS_SELECTOR, '[data-testid="link-extras"]')
    if not line.is_displayed():
        return []
    return [(e.get_attribute("data-path"), e.text) for e in line.find_elements(By.CSS_SELECTOR, "[data-path]")]


def clear(driver: WebDriver, path: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'[data-testid="link-extras"] [data-path="{path}"] button').click()


def test_link_fields_without_a_box_are_shown_and_can_be_cleared(driver: WebDriver, base_url: str) -> None:
    assert open_page(driver, base_url, LINKED) == "done"
    line = driver.find_element(By.CSS_SELECTOR, '[data-testid="link-extras"]')
    assert line.text.startswith("Also from the link")
    assert extras(driver) == [
        ("search.allow.tp", "search.allow.tp = [1,2] clear"),
        ("reliability.gpu_mtbf_hours", "reliability.gpu_mtbf_hours = 50000 clear"),
    ]
    assert driver.execute_script("return formToJob().search.allow") == {"tp": [1, 2]}

    clear(driver, "search.allow.tp")
    assert [path for path, _ in extras(driver)] == ["reliability.gpu_mtbf_hours"]
    assert "allow" not in driver.execute_script("return formToJob().search")
    clear(driver, "reliability.gpu_mtbf_hours")
    assert extras(driver) == []
    assert "reliability" not in driver.execute_script("return formToJob()")

    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"
    sent = json.loads(parse_qs(urlsplit(driver.current_url).query)["job"][0])
    assert "allow" not in sent["search"] and "reliability" not in sent


def test_a_link_whose_fields_all_have_boxes_shows_no_line(driver: WebDriver, base_url: str) -> None:
    assert open_page(driver, base_url, SMALL_JOB) == "done"
    assert extras(driver) == []
