"""The sweep panel's table and warnings in headless Chromium, against the service's /sweeps: every
point with its status (an infeasible one with the reason), tokens/s, days and cost; the MFU
warnings of several points on one line, as ``pplan sweep`` prints them."""

from __future__ import annotations

from typing import Any

import httpx
from pagekit import open_page, shown_errors, type_into, wait_for
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from api.sweep_cli import sweep_warnings
from optimizer.capacity.sweep import SweepStatus

JOB = {
    "model": {"preset": "llama3-8b"},
    "training": {"seq_len": 4096, "global_batch_size": 256, "total_tokens": 10**11},
    "cluster": {"preset": "dgx-h100", "num_gpus": 8},
    "search": {"top_k": 1},
}
COUNTS = [16, 8, 1000]  # 1,000 GPUs cannot split this job evenly: infeasible


def table(driver: WebDriver) -> list[dict[str, str]]:
    return driver.execute_script(
        """return [...document.querySelectorAll('[data-testid="sweep-table"] tbody tr')].map(r =>
            Object.fromEntries([...r.querySelectorAll('td')].map(td => [td.dataset.field, td.textContent])));"""
    )


def test_sweep_table_lists_every_point_and_warnings_are_grouped(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url, JOB)
    gpus = driver.find_element(By.ID, "sweep-gpus")
    gpus.clear()
    gpus.send_keys(", ".join(map(str, COUNTS)))
    start = driver.find_element(By.ID, "sweep-start")
    start.click()
    assert not start.is_enabled()  # one sweep at a time
    assert wait_for(driver, "return document.body.dataset.sweep", "done", "error", "cancelled") == "done"
    assert start.is_enabled()
    sweep_id = driver.execute_script("return sweepId")
    answer = httpx.get(f"{base_url}/sweeps/{sweep_id}")
    sweep: dict[str, Any] = answer.json()

    by_gpus = sorted(sweep["results"], key=lambda r: r["point"]["num_gpus"])
    rows = table(driver)
    assert [row["num_gpus"] for row in rows] == [f"{r['point']['num_gpus']:,}" for r in by_gpus]
    for row, result in zip(rows, by_gpus, strict=True):
        plan = result["plan"]
        if plan is None:
            assert result["status"] == "infeasible"
            assert row["status"] == f"infeasible: {result['explanation']}"
            assert row["tokens_per_s"] == row["days"] == row["cost_usd"] == "–"
            continue
        ttt = plan["time_to_train"]
        assert row["status"] == result["status"] == "done"
        assert row["tokens_per_s"] == f"{int(plan['tokens_per_s'] + 0.5):,}"
        assert row["days"] == f"{ttt['days']:.1f}"
        assert row["cost_usd"] == f"${int(ttt['cost_usd'] + 0.5):,}"

    shown = driver.execute_script(
        "return [...document.querySelectorAll('#sweep-warnings li')].map(li => li.textContent)"
    )
    expected = sweep_warnings(SweepStatus.model_validate_json(answer.text))
    assert shown == expected
    assert len(shown) < sum(len(r["warnings"]) for r in sweep["results"])  # two points' MFU lines are one


def test_a_sweep_refused_for_a_job_field_marks_that_field(driver: WebDriver, base_url: str) -> None:
    open_page(driver, base_url, JOB)
    type_into(driver, "training.global_batch_size", "-4")
    driver.execute_script("baseJob.reliability = {gpu_mtbf_hours: -1}")  # a field without a box
    gpus = driver.find_element(By.ID, "sweep-gpus")
    gpus.clear()
    gpus.send_keys("8, 16")
    body = {
        "job": {**driver.execute_script("return formToJob()"), "search": {"top_k": 1}},
        "vary": {"num_gpus": [8, 16]},
    }
    answer = httpx.post(f"{base_url}/sweeps", json=body)
    assert answer.status_code == 422
    by_loc = {tuple(d["loc"]): d["msg"] for d in answer.json()["detail"]}
    batch = by_loc[("body", "job", "training", "global_batch_size")]
    mtbf = by_loc[("body", "job", "reliability", "gpu_mtbf_hours")]
    assert batch.startswith("at point num_gpus 8: ")

    driver.find_element(By.ID, "sweep-start").click()
    wait_for(driver, "return document.querySelector('#sweep-error').hidden", False)
    marked = [(e.get_attribute("data-for"), e.text) for e in shown_errors(driver) if e.get_attribute("data-for")]
    assert marked == [("training.global_batch_size", batch)]
    assert driver.execute_script("return document.activeElement.name") == "training.global_batch_size"
    assert driver.find_element(By.ID, "sweep-error").text == (
        f"invalid request: see the marked fields of the form; job.reliability.gpu_mtbf_hours: {mtbf}"
    )

    type_into(driver, "training.global_batch_size", "256")
    driver.execute_script("delete baseJob.reliability")
    driver.find_element(By.ID, "sweep-start").click()
    assert wait_for(driver, "return document.body.dataset.sweep", "done", "error") == "done"
    assert [e for e in shown_errors(driver) if e.get_attribute("data-for")] == []
