"""Requests that fail or take time, in headless Chromium: the previous results say they are old."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from browser import serve
from fastapi import FastAPI
from pagekit import SMALL_JOB, open_page, type_into, wait_for, wait_state
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from api.main import create_app

SLOW_FETCH = """const slow = window.fetch;
window.fetch = (...args) => new Promise((wake) => setTimeout(wake, 1500)).then(() => slow(...args));"""


def stale(driver: WebDriver, section: str) -> dict[str, object]:
    """Whether ``section`` is marked as old results: its class, label and the look of its content."""
    return driver.execute_script(
        """const s = document.querySelector(arguments[0]);
        const label = s.querySelector('[data-testid="stale"]');
        const content = [...s.children].find(c => c !== label && c.tagName !== 'H2' && !c.hidden);
        return {marked: s.classList.contains('stale'), busy: s.getAttribute('aria-busy'),
                label: label && !label.hidden ? label.textContent : null,
                opacity: Number(getComputedStyle(content).opacity)};""",
        section,
    )


def test_plans_of_the_previous_job_are_marked_while_planning_and_after_an_error(
    driver: WebDriver, base_url: str
) -> None:
    assert open_page(driver, base_url, SMALL_JOB) == "done"
    assert stale(driver, "#results") == {"marked": False, "busy": "false", "label": None, "opacity": 1}

    driver.execute_script(SLOW_FETCH)
    type_into(driver, "training.global_batch_size", "512")
    driver.find_element(By.ID, "plan-button").click()
    running = stale(driver, "#results")
    assert driver.execute_script("return document.body.dataset.state") == "running"
    assert running["marked"] and running["busy"] == "true" and running["opacity"] < 1
    assert str(running["label"]).startswith("Results for the previous job")
    assert wait_state(driver, "done", "error") == "done"
    assert stale(driver, "#results")["marked"] is False

    type_into(driver, "training.global_batch_size", "-4")
    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "error"
    failed = stale(driver, "#results")
    assert failed["marked"] and failed["busy"] == "false" and failed["opacity"] < 1
    assert str(failed["label"]).startswith("Results for the previous job")
    assert '"global_batch_size":512' in unquote(driver.current_url)  # the link is the job shown


def test_the_previous_sweep_is_marked_while_a_new_one_starts_and_when_it_is_refused(
    driver: WebDriver, base_url: str
) -> None:
    assert open_page(driver, base_url, {**SMALL_JOB, "cluster": {"preset": "dgx-h100", "num_gpus": 8}}) == "done"
    gpus = driver.find_element(By.ID, "sweep-gpus")
    gpus.clear()
    gpus.send_keys("8, 16")
    driver.find_element(By.ID, "sweep-start").click()
    assert wait_for(driver, "return document.body.dataset.sweep", "done", "error") == "done"
    assert stale(driver, "#sweep-results")["marked"] is False

    driver.execute_script(SLOW_FETCH)
    type_into(driver, "training.global_batch_size", "-4")
    driver.find_element(By.ID, "sweep-start").click()
    starting = stale(driver, "#sweep-results")
    assert starting["marked"] and starting["opacity"] < 1
    assert str(starting["label"]).startswith("Results for the previous sweep")
    wait_for(driver, "return document.querySelector('#sweep-error').hidden", False)
    refused = stale(driver, "#sweep-results")
    assert refused["marked"] and str(refused["label"]).startswith("Results for the previous sweep")


def endless_sweeps_app() -> FastAPI:
    """The planner app whose /sweeps start and then stay at 'running: 0 of N points'."""
    app = create_app()
    own = len(app.router.routes)

    @app.post("/sweeps", status_code=202)
    async def start(body: dict[str, Any]) -> dict[str, str]:
        return {"id": f"endless-{len(body['vary']['num_gpus'])}"}

    @app.get("/sweeps/{sweep_id}")
    async def progress(sweep_id: str) -> dict[str, Any]:
        total = int(sweep_id.rpartition("-")[2])
        return {"id": sweep_id, "status": "running", "done": 0, "total": total, "results": [], "pareto": []}

    app.router.routes[:] = [*app.router.routes[own:], *app.router.routes[:own]]  # these answer first
    return app


def uncaught(driver: WebDriver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if "Uncaught" in e["message"]]


def test_a_server_that_went_away_is_named_and_a_followed_sweep_stops(driver: WebDriver) -> None:
    with serve(endless_sweeps_app()) as base_url:
        open_page(driver, base_url)
        type_into(driver, "cluster.num_gpus", "64")
        driver.find_element(By.ID, "sweep-start").click()
        wait_for(driver, "return document.querySelector('#sweep-status').textContent", "running: 0 of 5 points")
        assert driver.find_element(By.ID, "sweep-cancel").is_displayed()
        uncaught(driver)
    host = base_url.removeprefix("http://")

    assert wait_for(driver, "return document.body.dataset.sweep", "error") == "error"
    message = driver.find_element(By.ID, "sweep-error").text
    assert message.startswith(f"cannot reach the planner at {host}: Failed to fetch"), message
    assert not driver.find_element(By.ID, "sweep-cancel").is_displayed()

    driver.find_element(By.ID, "plan-button").click()
    assert wait_state(driver, "done", "error") == "error"
    message = driver.find_element(By.ID, "form-error").text
    assert message.startswith(f"cannot reach the planner at {host}: Failed to fetch"), message
    driver.find_element(By.ID, "sweep-start").click()
    wait_for(driver, "return document.querySelector('#sweep-error').textContent.startsWith('cannot reach')", True)
    assert uncaught(driver) == []
