"""The plans panel in headless Chromium: each plan's 80% band, the job's warnings in their own box,
answers without a plan, and the launch text's copy buttons."""

from __future__ import annotations

import json

from pagekit import SMALL_JOB, box, open_page, post_plan, type_into, wait_state
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select


def test_each_plan_shows_its_80_percent_band_and_the_warnings_have_their_own_box(
    driver: WebDriver, base_url: str
) -> None:
    expected = post_plan(base_url, SMALL_JOB)
    assert expected["warnings"]  # an MFU above the best published
    assert open_page(driver, base_url, SMALL_JOB) == "done"

    box = driver.find_element(By.CSS_SELECTOR, '[data-testid="warnings"]')
    assert box.is_displayed()
    assert box.find_element(By.CSS_SELECTOR, "h3").text == "Warnings"
    assert [li.text for li in box.find_elements(By.TAG_NAME, "li")] == expected["warnings"]
    summary = driver.find_element(By.ID, "summary").text
    assert all(w not in summary for w in expected["warnings"])

    rows = driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]')
    for i, (row, plan) in enumerate(zip(rows, expected["plans"], strict=True)):
        row.click()
        band = driver.find_elements(By.CSS_SELECTOR, "tr.detail")[i].find_element(
            By.CSS_SELECTOR, '[data-testid="band"]'
        )
        spans = {s.get_attribute("data-field"): s for s in band.find_elements(By.TAG_NAME, "span")}
        (t_low, t_high), (r_low, r_high) = plan["step_time_s_range"], plan["tokens_per_s_per_gpu_range"]
        assert json.loads(spans["step_time_s_range"].get_attribute("data-value")) == [t_low, t_high]
        assert spans["step_time_s_range"].text == f"step time {t_low:.3f}–{t_high:.3f} s"
        assert json.loads(spans["tokens_per_s_per_gpu_range"].get_attribute("data-value")) == [r_low, r_high]
        assert (
            spans["tokens_per_s_per_gpu_range"].text == f"{int(r_low + 0.5):,}–{int(r_high + 0.5):,} tokens/s per GPU"
        )
        assert band.text.startswith("80% band of the prediction:")


def test_a_job_without_warnings_shows_no_warnings_box(driver: WebDriver, base_url: str) -> None:
    job = {**SMALL_JOB, "training": {**SMALL_JOB["training"], "framework": "deepspeed"}}
    assert post_plan(base_url, job)["warnings"] == []
    assert open_page(driver, base_url, job) == "done"
    assert not driver.find_element(By.CSS_SELECTOR, '[data-testid="warnings"]').is_displayed()


def test_an_answer_without_a_plan_shows_the_reason_and_no_empty_table_or_charts(
    driver: WebDriver, base_url: str
) -> None:
    assert open_page(driver, base_url, SMALL_JOB) == "done"  # plans and charts first, then none
    Select(box(driver, "model.preset")).select_by_value("llama3.1-405b")
    type_into(driver, "cluster.num_gpus", "8")
    expected = post_plan(base_url, driver.execute_script("return formToJob()"))
    assert expected["status"] == "infeasible" and expected["plans"] == []
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "done"

    panel = driver.find_element(By.CSS_SELECTOR, '[data-testid="no-plan"]')
    assert panel.is_displayed()
    assert panel.find_element(By.TAG_NAME, "h3").text == "No plan fits"
    assert panel.find_element(By.CSS_SELECTOR, '[data-field="explanation"]').text == expected["explanation"]
    solver = expected["solver"]
    counts = panel.find_element(By.CSS_SELECTOR, '[data-field="candidates"]').text
    assert f"{solver['candidates_enumerated']:,} layouts enumerated" in counts
    assert f"{solver['candidates_fitting_memory']:,} fit in memory" in counts
    for hidden in ("#plans", '[data-testid="time-chart"]', '[data-testid="memory-chart"]'):
        assert not driver.find_element(By.CSS_SELECTOR, hidden).is_displayed(), hidden
    assert driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]') == []
    assert expected["explanation"] not in driver.find_element(By.ID, "summary").text
