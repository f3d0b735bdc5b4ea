"""Capacity numbers on the web page in headless Chromium: suggested GPU counts, each plan's goodput,
time to train and cost, and the sweep chart's time-to-train view, against /plan and /sweeps."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
from browser import foreign_urls, requested_urls
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

WAIT_S = 180
BUDGET = {"seq_len": 4096, "global_batch_size": 256, "total_tokens": 10**11}
SUGGESTING = {  # 72 = 9 x 8 GPUs cannot split 256 sequences evenly: 64 GPUs are suggested
    "model": {"preset": "llama3-8b"},
    "training": BUDGET,
    "cluster": {"preset": "dgx-h100", "num_gpus": 72},
    "search": {"top_k": 2},
}
SWEPT = {
    "model": {"preset": "llama3-8b"},
    "training": BUDGET,
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {"top_k": 1},
}
GPU_COUNTS = [8, 16, 32, 64]


def open_job(driver: WebDriver, base_url: str, job: dict[str, Any]) -> None:
    requested_urls(driver)
    driver.get(f"{base_url}/?job={quote(json.dumps(job))}")
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.execute_script("return document.body.dataset.state") in ("done", "error")
    )
    assert driver.execute_script("return document.body.dataset.state") == "done"


def test_suggestions_and_capacity_of_each_plan_match_plan(driver: WebDriver, base_url: str) -> None:
    expected = httpx.post(f"{base_url}/plan", json=SUGGESTING, timeout=WAIT_S).json()
    assert [s["num_gpus"] for s in expected["suggestions"]] == [64]
    open_job(driver, base_url, SUGGESTING)

    box = driver.find_element(By.CSS_SELECTOR, '[data-testid="suggestions"]')
    assert box.is_displayed()
    items = box.find_elements(By.TAG_NAME, "li")
    assert len(items) == len(expected["suggestions"])
    for item, s in zip(items, expected["suggestions"], strict=True):
        assert int(item.get_attribute("data-num-gpus")) == s["num_gpus"]
        assert float(item.get_attribute("data-tokens-per-s")) == s["tokens_per_s"]
        assert item.text.startswith(f"Try {s['num_gpus']} GPUs: {int(s['tokens_per_s'] + 0.5):,} tokens/s")
        assert s["reason"] in item.text

    rows = driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]')
    assert len(rows) == len(expected["plans"]) == 2
    for i, (row, plan) in enumerate(zip(rows, expected["plans"], strict=True)):
        row.click()
        detail = driver.find_elements(By.CSS_SELECTOR, "tr.detail")[i]
        assert detail.is_displayed()
        shown = {
            span.get_attribute("data-field"): (float(span.get_attribute("data-value")), span.text)
            for span in detail.find_elements(By.CSS_SELECTOR, '[data-testid="capacity"] span')
        }
        assert_capacity_shown(shown, plan)
    assert foreign_urls(requested_urls(driver)) == []


def assert_capacity_shown(shown: dict[str, tuple[float, str]], plan: dict[str, Any]) -> None:
    """The capacity line's spans (data-field -> number, text) against the plan's goodput and
    time_to_train: the price used, GPU-hours, energy and expected failures too."""
    ttt, goodput = plan["time_to_train"], plan["goodput"]
    assert shown["goodput_fraction"] == (goodput["fraction"], f"goodput {100 * goodput['fraction']:.1f}%")
    steps = goodput["checkpoint_interval_steps"]
    assert shown["checkpoint_interval_steps"] == (steps, f"checkpoint every {steps:,} steps")
    assert shown["time_to_train_days"] == (ttt["days"], f"{ttt['days']:.1f} days to train")
    assert shown["gpu_hours"] == (ttt["gpu_hours"], f"{int(ttt['gpu_hours'] + 0.5):,} GPU-hours")
    assert shown["cost_usd"] == (ttt["cost_usd"], f"${int(ttt['cost_usd'] + 0.5):,}")
    price = ttt["price_per_gpu_hour_usd"]
    assert shown["price_per_gpu_hour_usd"] == (price, f"at ${price:.2f} per GPU-hour")
    energy, failures = ttt["energy_mwh"], ttt["expected_failures"]
    assert shown["energy_mwh"] == (energy, f"{float(f'{energy:.3g}'):,g} MWh")
    assert shown["expected_failures"] == (failures, f"{float(f'{failures:.2g}'):g} expected failures")


def capacity_spans(driver: WebDriver) -> dict[str, tuple[float, str]]:
    return {
        span.get_attribute("data-field"): (float(span.get_attribute("data-value")), span.text)
        for span in driver.find_elements(By.CSS_SELECTOR, 'tr.detail:not([hidden]) [data-testid="capacity"] span')
    }


def test_the_price_box_prices_the_run(driver: WebDriver, base_url: str) -> None:
    open_job(driver, base_url, SUGGESTING)
    field = driver.find_element(By.CSS_SELECTOR, '[name="costs.price_per_gpu_hour_usd"]')
    field.send_keys("2.5")
    driver.find_element(By.ID, "plan-button").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script("return document.body.dataset.state") == "done")
    expected = httpx.post(f"{base_url}/plan", json={**SUGGESTING, "costs": {"price_per_gpu_hour_usd": 2.5}}).json()
    assert expected["plans"][0]["time_to_train"]["price_per_gpu_hour_usd"] == 2.5
    driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"]').click()
    assert_capacity_shown(capacity_spans(driver), expected["plans"][0])
    sent = json.loads(parse_qs(urlsplit(driver.current_url).query)["job"][0])
    assert sent["costs"] == {"price_per_gpu_hour_usd": 2.5}


def test_no_budget_no_time_to_train_and_no_suggestions(driver: WebDriver, base_url: str) -> None:
    job = {**SWEPT, "training": {"seq_len": 4096, "global_batch_size": 256}}
    expected = httpx.post(f"{base_url}/plan", json=job, timeout=WAIT_S).json()
    assert expected["suggestions"] == [] and expected["plans"][0]["time_to_train"] is None
    open_job(driver, base_url, job)
    assert not driver.find_element(By.CSS_SELECTOR, '[data-testid="suggestions"]').is_displayed()
    driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"]').click()
    fields = [
        s.get_attribute("data-field") for s in driver.find_elements(By.CSS_SELECTOR, '[data-testid="capacity"] span')
    ]
    assert fields == ["goodput_fraction", "checkpoint_interval_steps"]


def sweep_chart(driver: WebDriver) -> dict[str, Any]:
    return driver.execute_script(
        """const gd = document.querySelector('[data-testid="sweep-chart"]');
        return {id: sweepId, title: gd.layout.title.text, axis: gd.layout.yaxis.title.text,
                traces: gd.data.map(t => ({name: t.name, x: t.x, y: t.y}))};"""
    )


def test_sweep_chart_toggles_to_time_to_train(driver: WebDriver, base_url: str) -> None:
    open_job(driver, base_url, SWEPT)
    metric = Select(driver.find_element(By.ID, "sweep-metric"))
    box = driver.find_element(By.ID, "sweep-gpus")
    box.clear()
    box.send_keys(", ".join(map(str, GPU_COUNTS)))
    driver.find_element(By.ID, "sweep-start").click()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: d.execute_script("return document.body.dataset.sweep") not in (None, "running")
    )
    assert driver.execute_script("return document.body.dataset.sweep") == "done"
    sweep = httpx.get(f"{base_url}/sweeps/{sweep_chart(driver)['id']}").json()
    assert [r["status"] for r in sweep["results"]] == ["done"] * len(GPU_COUNTS)

    throughput = sweep_chart(driver)
    assert throughput["axis"] == "tokens/s"
    assert throughput["traces"][0]["y"] == [r["plan"]["tokens_per_s"] for r in sweep["results"]]

    assert metric.options[1].is_enabled()
    metric.select_by_value("days")
    days = sweep_chart(driver)
    assert days["title"] == "Time to train against GPU count" and days["axis"] == "days"
    points, front = days["traces"]
    assert points["x"] == GPU_COUNTS
    assert points["y"] == [r["plan"]["time_to_train"]["days"] for r in sweep["results"]]
    # the front is the API's, in GPU order, at its time_to_train_days
    by_gpus = sorted(sweep["pareto"], key=lambda e: e["num_gpus"])
    assert front["name"] == "Pareto front" and len(by_gpus) >= 1
    assert front["x"] == [e["num_gpus"] for e in by_gpus]
    assert front["y"] == [e["time_to_train_days"] for e in by_gpus]
    # more GPUs train faster here: 64 GPUs take the fewest days
    assert min(points["y"]) == points["y"][-1] < points["y"][0] / 4
    metric.select_by_value("throughput")
    assert sweep_chart(driver)["traces"][0]["y"] == throughput["traces"][0]["y"]
    assert foreign_urls(requested_urls(driver)) == []


def test_days_view_is_disabled_without_a_budget(driver: WebDriver, base_url: str) -> None:
    job = {**SWEPT, "training": {"seq_len": 4096, "global_batch_size": 256}}
    open_job(driver, base_url, job)
    driver.execute_script(
        "sweepChart(arguments[0])",
        {"results": [{"point": {"num_gpus": 8}, "plan": {"tokens_per_s": 1.0}}], "pareto": []},
    )
    metric = Select(driver.find_element(By.ID, "sweep-metric"))
    assert not metric.options[1].is_enabled()
    assert metric.first_selected_option.get_attribute("value") == "throughput"


def test_a_suggested_gpu_count_is_a_button_that_plans_at_that_count(driver: WebDriver, base_url: str) -> None:
    open_job(driver, base_url, SUGGESTING)
    item = driver.find_element(By.CSS_SELECTOR, '[data-testid="suggestions"] li')
    button = item.find_element(By.TAG_NAME, "button")
    assert button.text == "Try 64 GPUs"
    button.click()
    planned_at_64 = "return document.body.dataset.state === 'done' && document.querySelector('#planned').textContent.includes('on 64 × ')"
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(planned_at_64))
    assert driver.find_element(By.CSS_SELECTOR, '[name="cluster.num_gpus"]').get_attribute("value") == "64"
    at_64 = {**SUGGESTING, "cluster": {**SUGGESTING["cluster"], "num_gpus": 64}}
    expected = httpx.post(f"{base_url}/plan", json=at_64, timeout=WAIT_S).json()
    first = driver.find_element(By.CSS_SELECTOR, '[data-testid="plan-row"] td[data-field="step_time_s"]')
    assert first.text == f"{expected['plans'][0]['step_time_s']:.3f} s"
    assert json.loads(parse_qs(urlsplit(driver.current_url).query)["job"][0])["cluster"]["num_gpus"] == 64
