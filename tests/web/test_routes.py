"""The page's and the docs' routes without a browser: every asset is served by the service."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.web import STATIC_DIR


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app()) as test_client:
        yield test_client


def asset_urls(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


@pytest.mark.parametrize("path", ["/", "/docs", "/redoc"])
def test_pages_load_only_assets_of_the_service(client: TestClient, path: str) -> None:
    page = client.get(path)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    urls = [u for u in asset_urls(page.text) if not u.startswith(("data:", "#"))]
    assert urls
    for url in urls:
        assert url.startswith("/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 0


def test_page_scripts_and_test_ids(client: TestClient) -> None:
    html = client.get("/").text
    for testid in ("time-chart", "memory-chart", "sweep-chart", "error"):
        assert f'data-testid="{testid}"' in html
    plotly = client.get("/static/vendor/plotly.min.js")
    assert plotly.headers["content-type"].startswith("text/javascript")
    assert len(plotly.content) > 1_000_000  # the whole bundle, not a stub
    scripts = sorted(STATIC_DIR.glob("*.js"))
    assert "app.js" in [s.name for s in scripts]
    for script in scripts:
        text = script.read_text()
        assert "http://" not in text and "https://" not in text, script.name


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_docs_forbid_other_hosts(client: TestClient, path: str) -> None:
    policy = client.get(path).headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "img-src 'self' data:" in policy


def test_docs_routes_are_not_in_the_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/", "/docs", "/redoc"} & set(paths)
