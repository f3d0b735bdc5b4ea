"""A live planner server on the loopback and a headless system Chromium to drive it.

Chromium is Debian's ``chromium`` package driven by its ``chromium-driver`` (Selenium never
downloads a browser or driver here). Every host other than 127.0.0.1 resolves to nothing, so a
page that needs the network fails to render instead of passing by luck.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LOOPBACK = "127.0.0.1"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {LOOPBACK}",
)


def browser_available() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on a free loopback port; yields its base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile that logs every network request of the page."""
    with tempfile.TemporaryDirectory(prefix="pplan-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
        ):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def requested_urls(driver: WebDriver) -> list[str]:
    """URLs the page requested since the last call (drains the performance log).

    A request that the page's Content-Security-Policy blocked never left the browser and is not
    listed.
    """
    sent: dict[str, str] = {}
    blocked: set[str] = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message["params"]
        if message["method"] == "Network.requestWillBeSent":
            sent[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason") == "csp":
            blocked.add(params["requestId"])
    return [url for request_id, url in sent.items() if request_id not in blocked]


def foreign_urls(urls: list[str]) -> list[str]:
    """The network requests (http, https, ws, wss) to any host but the loopback server.

    ``data:`` and ``blob:`` URLs and the browser's own ``chrome:`` pages never leave the machine.
    """
    network = ("http", "https", "ws", "wss")
    return [u for u in urls if urlsplit(u).scheme in network and urlsplit(u).hostname != LOOPBACK]
