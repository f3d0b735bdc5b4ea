"""'Compare your layout' in headless Chromium: the page scores the planned job under the typed
layout and plan #1's through POST /compare, shows that answer's numbers, and puts a 422 at its box."""

from __future__ import annotations

import json
from typing import Any

import httpx
from pagekit import SMALL_JOB, WAIT_S, open_page, post_plan, wait_for
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

JOB = {**SMALL_JOB, "search": {"top_k": 2, "memory_headroom_gib": 2}}
FIELDS = ["tp", "pp", "cp", "ep", "vpp", "micro_batch_size", "zero_stage", "recompute"]


def compare_box(driver: WebDriver, name: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'#compare-form [name="{name}"]')


def compare(driver: WebDriver, **typed: str) -> str:
    """Type ``typed`` into the layout boxes, press Compare and wait for the answer."""
    for name, text in typed.items():
        box = compare_box(driver, name)
        box.clear()
        box.send_keys(text)
    driver.execute_script("delete document.body.dataset.compare")
    driver.find_element(By.ID, "compare-button").click()
    return str(wait_for(driver, "return document.body.dataset.compare", "done", "error"))


def value(cell: WebElement) -> Any:
    return json.loads(cell.get_attribute("data-value") or "null")


def deltas(driver: WebDriver, table_id: str) -> dict[str, float]:
    cells = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} td[data-value]")
    return {c.get_attribute("data-field"): value(c) for c in cells}


def test_the_comparison_shows_the_numbers_compare_answers_for_the_same_body(driver: WebDriver, base_url: str) -> None:
    plan = post_plan(base_url, JOB)["plans"][0]
    assert open_page(driver, base_url, JOB) == "done"
    assert [compare_box(driver, n).get_attribute("value") for n in FIELDS] == [str(plan["config"][n]) for n in FIELDS]
    assert compare(driver, tp="2", micro_batch_size="1") == "done"

    yours = {n: plan["config"][n] for n in FIELDS} | {"tp": 2, "micro_batch_size": 1}
    job = {k: v for k, v in JOB.items() if k != "search"}
    body = {**job, "memory_headroom_gib": 2, "layouts": [yours, plan["config"]]}
    assert driver.execute_script("return compareBody()") == body
    answer = httpx.post(f"{base_url}/compare", json=body, timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    expected = answer.json()

    rows = driver.find_elements(By.CSS_SELECTOR, '[data-testid="compare-entry"]')
    assert [r.find_element(By.TAG_NAME, "th").text for r in rows] == ["your layout", "plan #1"]
    for row, entry in zip(rows, expected["entries"], strict=True):
        p, m = entry["plan"], entry["plan"]["memory_gib"]
        cells = {c.get_attribute("data-field"): c for c in row.find_elements(By.TAG_NAME, "td")}
        assert value(cells["step_time_s"]) == p["step_time_s"]
        assert cells["step_time_s"].text == f"{p['step_time_s']:.3f} s"
        assert value(cells["mfu"]) == p["mfu"]
        assert cells["mfu"].text == f"{100 * p['mfu']:.1f}%"
        assert value(cells["memory"]) == [m["total"], m["capacity"] - m["headroom"]]
        assert m["headroom"] == 2
        assert value(cells["fits_memory"]) == p["fits_memory"]
    theirs = expected["entries"][1]
    assert (
        value(rows[1].find_element(By.CSS_SELECTOR, '[data-field="step_time_delta_s"]')) == theirs["step_time_delta_s"]
    )
    assert theirs["time_deltas_s"] and deltas(driver, "compare-time-deltas") == theirs["time_deltas_s"]
    assert theirs["memory_deltas_gib"] and deltas(driver, "compare-memory-deltas") == theirs["memory_deltas_gib"]
    summaries = driver.find_elements(By.CSS_SELECTOR, '[data-testid="compare-summary"]')
    assert [s.text for s in summaries] == [e["summary"] for e in expected["entries"]]
    warnings = driver.find_elements(By.CSS_SELECTOR, '[data-testid="compare-warnings"] li')
    assert [w.text for w in warnings] == expected["warnings"]


def test_a_refused_layout_field_is_marked_at_its_box(driver: WebDriver, base_url: str) -> None:
    assert open_page(driver, base_url, JOB) == "done"
    assert compare(driver, tp="3") == "error"
    body = driver.execute_script("return compareBody()")
    answer = httpx.post(f"{base_url}/compare", json=body, timeout=WAIT_S)
    assert answer.status_code == 422
    [item] = answer.json()["detail"]
    assert item["loc"] == ["body", "layouts", 0, "tp"]

    errors = [e for e in driver.find_elements(By.CSS_SELECTOR, '#compare [data-testid="error"]') if e.is_displayed()]
    assert [e.text for e in errors] == [item["msg"]]
    tp = compare_box(driver, "tp")
    label = driver.execute_script("return arguments[0].previousElementSibling", errors[0])
    assert label == tp.find_element(By.XPATH, "./ancestor::label")
    assert tp.get_attribute("aria-invalid") == "true"
    assert tp.get_attribute("aria-describedby") == errors[0].get_attribute("id")
    assert driver.switch_to.active_element == tp
    assert not driver.find_element(By.ID, "compare-result").is_displayed()

    assert compare(driver, tp="2") == "done"
    assert not [e for e in driver.find_elements(By.CSS_SELECTOR, '#compare [data-testid="error"]') if e.is_displayed()]
    assert tp.get_attribute("aria-invalid") is None
