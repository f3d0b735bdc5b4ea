"""The web page (``GET /``) and the offline API docs (``/docs``, ``/redoc``).

Everything the browser loads comes from this service: the page's own files (``api/static``),
the plotly.js bundle shipped inside the ``plotly`` package, and the Swagger UI / ReDoc bundles
shipped inside the ``fastapi-offline`` package. No page asks any other host for anything.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
DOCS_ASSETS_URL = "/static/docs"
PLOTLY_URL = "/static/vendor/plotly.min.js"
# Swagger UI would otherwise send the schema to an online validator.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
DOCS_CSP = (  # the docs pages load nothing from other hosts (ReDoc's footer links a CDN logo)
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


def package_dir(name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name!r} is not installed; reinstall parallelism-planner")
    return Path(next(iter(spec.submodule_search_locations)))


def plotly_js() -> Path:
    """The minified plotly.js bundle that the ``plotly`` Python package ships."""
    return package_dir("plotly") / "package_data" / "plotly.min.js"


def docs_assets() -> Path:
    """Swagger UI and ReDoc bundles shipped by ``fastapi-offline``."""
    return package_dir("fastapi_offline") / "static"


def _with_csp(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = DOCS_CSP
    return page


def install_web(app: FastAPI) -> None:
    """Serve the page at ``/``, its assets under ``/static`` and the offline ``/docs``, ``/redoc``.

    The app must be built with ``docs_url=None, redoc_url=None`` so that these routes replace
    FastAPI's CDN-based ones.
    """
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"
    plotly_path = plotly_js()

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get(PLOTLY_URL, include_in_schema=False)
    async def plotly() -> FileResponse:
        return FileResponse(plotly_path, media_type="text/javascript")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _with_csp(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{title} - Swagger UI",
                oauth2_redirect_url=oauth2_url,
                swagger_js_url=f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{DOCS_ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{DOCS_ASSETS_URL}/favicon.png",
                swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
            )
        )

    @app.get(oauth2_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _with_csp(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{title} - ReDoc",
                redoc_js_url=f"{DOCS_ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{DOCS_ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )

    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=docs_assets()), name="docs-assets")
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
