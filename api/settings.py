"""Service settings, read from ``PPLAN_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from fastapi import Depends, Request
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1 << 20


def _default_solver_workers() -> int:
    return os.cpu_count() or 2


class Settings(BaseSettings):
    """Every knob of the HTTP service; ``PPLAN_<NAME>`` overrides ``<name>``."""

    model_config = SettingsConfigDict(env_prefix="PPLAN_", extra="ignore", frozen=True)

    host: str = Field(default="127.0.0.1", description="Address `pplan serve` binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port `pplan serve` listens on.")
    workers: int = Field(
        default=1, ge=1, le=256, description="Uvicorn worker processes (`pplan serve`)."
    )
    solver_workers: int = Field(
        default_factory=_default_solver_workers,
        ge=1,
        le=1024,
        description="Threads that run planner calls, per worker process (default: CPU count).",
    )
    max_queue: int = Field(
        default=32,
        ge=0,
        le=100_000,
        description="Planner calls that may wait for a thread; beyond workers + queue: 503.",
    )
    max_body_bytes: int = Field(
        default=MIB, ge=1024, description="Largest request body accepted (else 413)."
    )
    max_top_k: int = Field(
        default=50, ge=1, description="Largest search.top_k accepted (else 422)."
    )
    max_time_limit_s: float = Field(
        default=30.0, gt=0, description="search.time_limit_s is clamped to this."
    )
    default_time_limit_s: float = Field(
        default=10.0, gt=0, description="search.time_limit_s when a request does not give one."
    )
    sweep_workers: int = Field(
        default_factory=_default_solver_workers,
        ge=1,
        le=1024,
        description="Processes that plan sweep points, per worker process (default: CPU count).",
    )
    max_sweep_points: int = Field(default=256, ge=1, description="Largest sweep (points) accepted (else 422).")
    max_sweeps_running: int = Field(default=2, ge=1, description="Sweeps running at once (else 429).")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_within_max(self) -> Settings:
        if self.default_time_limit_s > self.max_time_limit_s:
            raise ValueError(
                f"default_time_limit_s ({self.default_time_limit_s}) exceeds "
                f"max_time_limit_s ({self.max_time_limit_s})"
            )
        return self


def get_settings(request: Request) -> Settings:
    """The settings the running app was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]
