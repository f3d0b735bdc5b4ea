"""Liveness and version endpoints."""

from __future__ import annotations

from importlib import metadata
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from optimizer.reference import current

DISTRIBUTION = "parallelism-planner"

router = APIRouter(tags=["service"])


def package_version() -> str:
    """The installed version of the planner distribution (``0+unknown`` when not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class VersionInfo(BaseModel):
    version: str = Field(description="Version of the parallelism-planner package.")
    catalog_version: str = Field(description="Version of the hardware catalog data.")


@router.get("/healthz", response_model=Health, operation_id="healthz", summary="Liveness probe")
async def healthz() -> Health:
    """Answers as long as the process serves requests."""
    return Health()


@router.get(
    "/version",
    response_model=VersionInfo,
    operation_id="version",
    summary="Package and catalog versions",
)
async def version() -> VersionInfo:
    return VersionInfo(version=package_version(), catalog_version=current().catalog.version)
