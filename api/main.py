"""The ASGI app: ``api.main:app``, built by ``create_app()`` (``uvicorn api.main:app``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import catalog, meta, planning, sweep_manager, sweeps
from api.errors import install_error_handlers
from api.middleware import ReferenceMiddleware, RequestContextMiddleware, configure_logging
from api.pool import SolverPool
from api.settings import MIB, Settings
from api.web import install_web
from optimizer.presets import load_model_presets
from optimizer.reference import ReferenceData, shipped

DESCRIPTION = """
Plans and scores parallel layouts (TP x PP x DP x CP x EP, ZeRO, recompute, placement on
network tiers) for large-model training.

* `POST /plan` searches ranked layouts for a job; `POST /evaluate` scores one layout.
* `POST /sweeps` plans a job over a grid of GPU counts, clusters, batches and sequence lengths.
* The catalogs (`/gpus`, `/networks`, `/clusters`, `/models`) list the ids requests may name.
* Invalid requests are a 422 naming the field and the reason; a job with no feasible layout is
  a 200 with `status: "infeasible"` and an explanation.
"""

TAGS = [
    {"name": "planning", "description": "Search and score parallel layouts."},
    {
        "name": "catalog",
        "description": "Hardware and model presets, with the sources of their numbers.",
    },
    {"name": "service", "description": "Liveness and versions."},
]


def create_app(settings: Settings | None = None, reference: ReferenceData | None = None) -> FastAPI:
    """Build the app.

    Args:
        settings: Service settings; default: read from the ``PPLAN_*`` environment.
        reference: The catalog, model presets and capacity catalog requests are validated and
            costed with (``optimizer.reference``); default: the package's own.

    Returns:
        A FastAPI app whose lifespan loads (and so validates) the catalogs at start-up.
    """
    settings = settings or Settings()
    configure_logging(settings.log_level, settings.log_rate_per_s)
    pool = SolverPool(workers=settings.solver_workers, max_queue=settings.max_queue)
    manager = sweep_manager.SweepManager(
        workers=settings.sweep_workers,
        max_running=settings.max_sweeps_running,
        reference=reference,
        space_memory_bytes=settings.search_memory_mib * MIB,
    )
    evaluate_pool = SolverPool(workers=settings.evaluate_workers, max_queue=settings.max_queue)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if reference is None:  # a broken catalog stops start-up instead of failing requests
            shipped()
            load_model_presets()
        try:
            yield
        finally:
            pool.close()
            manager.close()
            evaluate_pool.close()

    app = FastAPI(
        title="Parallelism planner",
        version=meta.package_version(),
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc are served offline by install_web
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.solver_pool = pool
    app.state.sweeps = manager
    app.state.evaluate_pool = evaluate_pool
    app.state.reference = reference
    install_error_handlers(app)
    if reference is not None:
        app.add_middleware(ReferenceMiddleware, reference=reference)
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
    )
    app.include_router(planning.router)
    app.include_router(sweeps.router)
    app.include_router(catalog.router)
    app.include_router(meta.router)
    install_web(app)
    return app


app = create_app()
