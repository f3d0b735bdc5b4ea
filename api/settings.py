"""Service settings, read from ``PPLAN_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Depends, Request
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIB = 1 << 20


class Settings(BaseSettings):
    """Every knob of the HTTP service; ``PPLAN_<NAME>`` overrides ``<name>``."""

    model_config = SettingsConfigDict(env_prefix="PPLAN_", extra="ignore", frozen=True, allow_inf_nan=False)

    host: str = Field(default="127.0.0.1", description="Address `pplan serve` binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port `pplan serve` listens on.")
    workers: int = Field(default=1, ge=1, le=256, description="Uvicorn worker processes (`pplan serve`).")
    solver_workers: int = Field(
        default=2,
        ge=1,
        le=1024,
        description=(
            "Searches (POST /plan) that run at once, per worker process, whatever the core count; "
            "each may take up to search_memory_mib."
        ),
    )
    evaluate_workers: int = Field(
        default=2,
        ge=1,
        le=1024,
        description="Threads for POST /evaluate, apart from the searches so they never wait behind them.",
    )
    max_queue: int = Field(
        default=32,
        ge=0,
        le=100_000,
        description=(
            "Calls that may wait for a thread, per pool; beyond workers + queue: 503. A call that "
            "waited longer than its time limit (search.time_limit_s after clamping; "
            "max_time_limit_s for /evaluate) is answered 503 instead of run late."
        ),
    )
    search_memory_mib: int = Field(
        default=512,
        ge=16,
        le=1 << 20,
        description="Memory one search's layout space may take; a larger space is a 422.",
    )
    time_limit_grace_s: float = Field(
        default=2.0,
        ge=0,
        description=(
            "Documented margin: a search answers within its time limit plus this (ranking, the "
            "launch arguments and one last layer-split model after the deadline)."
        ),
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A connection whose request headers are not complete this long is closed.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A request body not fully received this long after its headers: 408, closed.",
    )
    keep_alive_timeout_s: int = Field(default=5, ge=1, description="Idle keep-alive connections are closed after this.")
    max_connections: int = Field(
        default=4096,
        ge=16,
        le=1_000_000,
        description=(
            "Open connections per worker process; a new one beyond it evicts the oldest idle or partial connection."
        ),
    )
    backlog: int = Field(default=2048, ge=1, description="Listen backlog of the server socket.")
    log_rate_per_s: float = Field(
        default=20.0,
        gt=0,
        description="Error log records per second and message (bursts of 5 s worth), the rest counted.",
    )
    max_body_bytes: int = Field(
        default=8 * MIB,
        ge=1024,
        description=(
            "Largest request body accepted (else 413); 8 MiB holds a 16,384-node topology with GKE-style "
            "node names and labels (about 7 MB)."
        ),
    )
    max_top_k: int = Field(default=50, ge=1, description="Largest search.top_k accepted (else 422).")
    max_time_limit_s: float = Field(default=30.0, gt=0, description="search.time_limit_s is clamped to this.")
    default_time_limit_s: float = Field(
        default=10.0, gt=0, description="search.time_limit_s when a request does not give one."
    )
    sweep_workers: int = Field(
        default=2,
        ge=1,
        le=1024,
        description="Processes that plan sweep points, per worker process, whatever the core count.",
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
                f"default_time_limit_s ({self.default_time_limit_s}) exceeds max_time_limit_s ({self.max_time_limit_s})"
            )
        return self


def get_settings(request: Request) -> Settings:
    """The settings the running app was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def settings_message(exc: ValidationError) -> str:
    """A bad ``PPLAN_*`` variable, named as the user set it."""
    lines = ["PPLAN_* settings: invalid environment"]
    for item in exc.errors():
        msg = item["msg"].removeprefix("Value error, ")
        field = "_".join(str(part) for part in item["loc"]) or msg.split(" ", 1)[0]  # a cross-field check
        name = f"PPLAN_{field.upper()}" if field in Settings.model_fields else "(settings)"
        lines.append(f"  {name}: {msg}")
    return "\n".join(lines)
