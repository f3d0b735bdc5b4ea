"""Small steps the browser tests share: open a page or a job link, wait for a state, fill a box."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
from browser import requested_urls
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 120
SMALL_JOB = {  # plans in well under a second
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 256},
    "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    "search": {"top_k": 2},
}


def post_plan(base_url: str, job: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{base_url}/plan", json=job, timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def wait_for(driver: WebDriver, script: str, *values: Any, args: tuple[Any, ...] | list[Any] = ()) -> Any:
    """Wait until ``script`` (given ``args``) returns one of ``values``; returns it."""
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(script, *args) in values)
    return driver.execute_script(script, *args)


def wait_state(driver: WebDriver, *states: str) -> str:
    return str(wait_for(driver, "return document.body.dataset.state", *states))


def open_page(driver: WebDriver, base_url: str, job: dict[str, Any] | None = None) -> str:
    """Open the page (with ``job`` as its link) and wait until it is idle or has planned."""
    requested_urls(driver)  # drain what earlier tests logged
    driver.get(f"{base_url}/?job={quote(json.dumps(job))}" if job else f"{base_url}/")
    return wait_state(driver, "idle", "done", "error")


def box(driver: WebDriver, name: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'[name="{name}"]')


def type_into(driver: WebDriver, name: str, text: str) -> WebElement:
    """Clear the form box ``name`` (opening its <details>) and type ``text`` into it."""
    field = box(driver, name)
    driver.execute_script("const d = arguments[0].closest('details'); if (d) d.open = true;", field)
    field.clear()
    field.send_keys(text)
    return field


def shown_errors(driver: WebDriver) -> list[WebElement]:
    return [e for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="error"]') if e.is_displayed()]


def plan_requests(driver: WebDriver) -> list[str]:
    """The POST /plan (and /sweeps) URLs the page asked for since the last call."""
    return [u for u in requested_urls(driver) if u.endswith(("/plan", "/sweeps"))]
