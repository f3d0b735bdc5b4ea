"""The plans panel in headless Chromium: each plan's 80% band, the job's warnings in their own box,
answers without a plan, and the launch text's copy buttons."""

from __future__ import annotations

import json

from pagekit import SMALL_JOB, box, open_page, post_plan, type_into, wait_for, wait_state
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


STUB_CLIPBOARD = """Object.defineProperty(navigator.clipboard, 'writeText', {configurable: true,
    value: arguments[0] ? (text) => { window.copied = text; return Promise.resolve(); }
                        : () => Promise.reject(new DOMException('Write permission denied.', 'NotAllowedError'))});"""


def launch_blocks(driver: WebDriver) -> list[dict[str, str]]:
    """The open plan's launch blocks: heading, the button's label and the text of the box under it."""
    return driver.execute_script(
        """return [...document.querySelectorAll('tr.detail:not([hidden]) .launch')].map(b => ({
            heading: b.querySelector('h4').firstChild.textContent.trim(), button: b.querySelector('button').textContent,
            text: b.querySelector('pre').textContent}));"""
    )


def test_launch_blocks_name_the_framework_and_copy_env_and_arguments_apart(driver: WebDriver, base_url: str) -> None:
    job = {**SMALL_JOB, "model": {"preset": "llama3-70b"}}
    plan = post_plan(base_url, job)["plans"][0]
    env = plan["launch"]["megatron_env"]
    assert env  # CUDA_DEVICE_MAX_CONNECTIONS
    assert open_page(driver, base_url, job) == "done"
    row = driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"]')
    row.click()
    blocks = launch_blocks(driver)
    assert blocks == [
        {
            "heading": "megatron-lm environment",
            "button": "Copy",
            "text": "\n".join(f"export {k}={v}" for k, v in env.items()),
        },
        {"heading": "megatron-lm arguments", "button": "Copy", "text": plan["launch"]["megatron"]},
    ]
    assert row.find_element(By.CSS_SELECTOR, 'td[data-field="frameworks"]').text == "megatron-lm"

    driver.execute_script(STUB_CLIPBOARD, True)
    buttons = driver.find_elements(By.CSS_SELECTOR, "tr.detail:not([hidden]) .launch button")
    for button, block in zip(buttons, blocks, strict=True):
        button.click()
        assert driver.execute_script("return window.copied") == block["text"]
        assert button.text == "Copied"
    driver.execute_script(STUB_CLIPBOARD, False)
    buttons[1].click()
    wait_for(driver, "return arguments[0].textContent", "Copy failed", args=[buttons[1]])
    assert "Write permission denied." in str(buttons[1].get_attribute("title"))


def test_megatron_bridge_overrides_are_headed_by_the_frameworks_name(driver: WebDriver, base_url: str) -> None:
    job = {**SMALL_JOB, "training": {**SMALL_JOB["training"], "framework": "megatron-bridge"}}
    plan = post_plan(base_url, job)["plans"][0]
    assert open_page(driver, base_url, job) == "done"
    driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"]').click()
    env = "\n".join(f"export {k}={v}" for k, v in plan["launch"]["nemo_env"].items())
    assert env.count("NVTE_") == 3  # Transformer Engine's attention kernel variables
    assert launch_blocks(driver) == [
        {"heading": "megatron-bridge environment", "button": "Copy", "text": env},
        {"heading": "megatron-bridge recipe overrides", "button": "Copy", "text": plan["launch"]["nemo"]},
    ]
