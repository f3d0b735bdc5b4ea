"""Chart colours in headless Chromium: each time and memory category keeps one colour in both plan
charts and across jobs whose charts show different sets of categories."""

from __future__ import annotations

from pagekit import SMALL_JOB, open_page
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

MOE_JOB = {**SMALL_JOB, "model": {"preset": "mixtral-8x7b"}}  # adds ep_comm and a pipelined plan


def trace_colours(driver: WebDriver, testid: str) -> list[tuple[str, str | None]]:
    return driver.execute_script(
        'return document.querySelector(`[data-testid="${arguments[0]}"]`).data'
        ".map(t => [t.name, t.marker && t.marker.color || null])",
        testid,
    )


def test_each_category_has_one_colour_in_every_chart_and_job(driver: WebDriver, base_url: str) -> None:
    seen: dict[str, set[str | None]] = {}
    by_chart: dict[str, set[str]] = {"time-chart": set(), "memory-chart": set()}
    for job in (SMALL_JOB, MOE_JOB):
        assert open_page(driver, base_url, job) == "done"
        for row in driver.find_elements(By.CSS_SELECTOR, '[data-testid="plan-row"]'):
            row.click()  # each plan's memory chart
            for chart in by_chart:
                for name, colour in trace_colours(driver, chart):
                    seen.setdefault(name, set()).add(colour)
                    by_chart[chart].add(name)
    assert {"compute", "ep_comm", "pp_bubble", "optimizer", "weights", "activations"} <= set(seen)
    assert "optimizer" in by_chart["time-chart"] & by_chart["memory-chart"]  # the same colour in both
    assert all(len(colours) == 1 and None not in colours for colours in seen.values()), seen
    colours = [next(iter(c)) for c in seen.values()]
    assert len(set(colours)) == len(colours), seen  # no two categories share one
