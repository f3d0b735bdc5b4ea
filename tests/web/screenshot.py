"""Screenshot of the web page for the README: ``make screenshot`` (writes docs/img/plan-page.png).

Starts the service on a free loopback port, opens the link of an example job in headless
Chromium and saves the form, the ranked plans and their charts as a PNG.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import quote

from browser import chromium, serve
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from api.main import create_app

JOB = {
    "model": {"preset": "llama3.1-405b"},
    "training": {"seq_len": 8192, "global_batch_size": 1024, "precision": "bf16"},
    "cluster": {"preset": "dgx-h100", "num_gpus": 1024},
    "search": {"top_k": 3},
}
WIDTH, HEIGHT = 1400, 1600  # tall enough for the form, the plans and the charts


def main(out: Path) -> None:
    with serve(create_app()) as base_url, chromium(WIDTH, HEIGHT) as driver:
        driver.get(f"{base_url}/?job={quote(json.dumps(JOB))}")
        WebDriverWait(driver, 120).until(lambda d: d.execute_script("return document.body.dataset.state") == "done")
        driver.execute_script("document.querySelector('#sweep').hidden = true")
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.find_element(By.TAG_NAME, "main").screenshot(str(out))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/plan-page.png"))
