"""80% error bands on a plan's predicted throughput and step time.

The band of a job comes from the validation residuals of comparable published runs: the
calibration rows ``benchmarks/validation.py`` scores, split into classes by model kind (dense /
MoE), GPU generation (Ampere / Hopper / Blackwell) and precision (16-bit / FP8-class). For each
class with enough rows, ``benchmarks/error_bands.py`` stores the 10% and 90% split-conformal
quantiles (order statistics) of ``log(measured / predicted)`` tokens/s/GPU in ``optimizer/data/error_bands.toml``; a class with
too few rows uses its parent's band (precision merged first, then GPU generation, then model
kind). This module reads that file and turns a band into ranges around a prediction::

    tokens_per_s_per_gpu_range = predicted * [exp(min(q10, 0)), exp(max(q90, 0))]
    step_time_s_range          = step_time_s * [exp(-max(q90, 0)), exp(-min(q10, 0))]

The quantiles are clamped to bracket zero so that a range always holds its point prediction
(a class whose runs were all slower than predicted gets an upper end at the prediction).
"""

from __future__ import annotations

import functools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from types import MappingProxyType
from typing import Any

from optimizer.modes import is_low_bit
from optimizer.reference import current
from optimizer.specs import JobSpec

_DATA_PACKAGE = "optimizer"
DATA_FILE = "data/error_bands.toml"
ANY = "*"
"""A class axis merged into its parent (any value)."""

GENERATION_FAMILY = {"blackwell-ultra": "blackwell"}
"""Catalog generations banded with another (B300 / GB300 with B200 / GB200)."""


class ModelKind(StrEnum):
    DENSE = "dense"
    MOE = "moe"


class PrecisionClass(StrEnum):
    BITS16 = "16-bit"
    """bf16 and fp16 GEMMs."""
    FP8 = "fp8-class"
    """FP8 (per-tensor or block-scaled) and FP4 GEMMs."""


@dataclass(frozen=True, order=True)
class BandClass:
    """Which runs count as comparable: each axis a value or ``ANY``."""

    kind: str
    generation: str
    precision: str

    def lineage(self) -> tuple[BandClass, ...]:
        """This class, then its parents up to the root: precision merged first, then the GPU
        generation, then the model kind."""
        return (
            self,
            BandClass(self.kind, self.generation, ANY),
            BandClass(self.kind, ANY, ANY),
            BandClass(ANY, ANY, ANY),
        )

    @property
    def label(self) -> str:
        parts = [p for p in (self.kind, self.generation, self.precision) if p != ANY]
        return " / ".join(parts) or "all runs"


ROOT_CLASS = BandClass(ANY, ANY, ANY)


@dataclass(frozen=True)
class ErrorBand:
    """Quantiles of ``log(measured / predicted)`` tokens/s/GPU over one class's runs."""

    cls: BandClass
    rows: int
    log_low: float
    log_high: float

    @property
    def throughput_factors(self) -> tuple[float, float]:
        """(low, high) multipliers of a predicted tokens/s; they bracket 1."""
        return math.exp(min(self.log_low, 0.0)), math.exp(max(self.log_high, 0.0))

    def covers(self, log_ratio: float) -> bool:
        """Whether a run with ``log(measured / predicted) = log_ratio`` lies inside the band."""
        return min(self.log_low, 0.0) <= log_ratio <= max(self.log_high, 0.0)


@dataclass(frozen=True)
class ErrorBands:
    """The fitted bands of every class that has its own, and how they were fitted."""

    bands: Mapping[BandClass, ErrorBand]
    quantile_low: float
    quantile_high: float
    min_rows: int
    generations: tuple[str, ...]
    """GPU generations with calibration rows."""
    coverage: float
    """Leave-one-source-out coverage of the bands on the calibration rows."""

    def lookup(self, cls: BandClass) -> ErrorBand:
        return lookup_band(self.bands, cls)


def lookup_band(bands: Mapping[BandClass, ErrorBand], cls: BandClass) -> ErrorBand:
    """The band of ``cls``, or of its nearest parent that has one."""
    for c in cls.lineage():
        if c in bands:
            return bands[c]
    raise KeyError(f"no error band for {cls.label} (the root band is missing)")


@dataclass(frozen=True)
class PlanRanges:
    tokens_per_s_per_gpu: tuple[float, float]
    step_time_s: tuple[float, float]
    band: ErrorBand
    note: str | None
    """Said when the job's GPU generation has no calibration rows at all."""


# ---------------------------------------------------------------------------------------- classes


def precision_class(precision: str) -> PrecisionClass:
    return PrecisionClass.FP8 if is_low_bit(precision) else PrecisionClass.BITS16


def generation_of(gpu_id: str) -> str:
    generation = current().catalog.gpus[gpu_id].generation
    return GENERATION_FAMILY.get(generation, generation)


def band_class(job: JobSpec) -> BandClass:
    """The class of a job: model kind, GPU generation, precision class."""
    assert job.cluster.gpu is not None  # ClusterSpec fills it
    kind = ModelKind.MOE if job.model.moe is not None else ModelKind.DENSE
    return BandClass(str(kind), generation_of(job.cluster.gpu), str(precision_class(job.training.precision)))


# ---------------------------------------------------------------------------------------- ranges


def plan_ranges(job: JobSpec, step_time_s: float, tokens_per_s_per_gpu: float) -> PlanRanges:
    """The 80% ranges of a plan's throughput and step time (``tokens_per_s = tokens / step``)."""
    bands = load_error_bands()
    cls = band_class(job)
    band = bands.lookup(cls)
    lo, hi = band.throughput_factors
    note = None
    if cls.generation not in bands.generations:
        note = (
            f"no calibration run on {cls.generation} GPUs: the 80% ranges come from {band.rows} runs "
            f"({band.cls.label}) on {', '.join(bands.generations)} GPUs"
        )
    return PlanRanges(
        tokens_per_s_per_gpu=(tokens_per_s_per_gpu * lo, tokens_per_s_per_gpu * hi),
        step_time_s=(step_time_s / hi, step_time_s / lo),
        band=band,
        note=note,
    )


# ---------------------------------------------------------------------------------------- file


def parse_error_bands(data: Mapping[str, Any]) -> ErrorBands:
    """Bands from the parsed TOML (``[meta]`` plus one ``[[band]]`` table per class)."""
    meta = data["meta"]
    bands: dict[BandClass, ErrorBand] = {}
    for t in data.get("band", []):
        cls = BandClass(str(t["kind"]), str(t["generation"]), str(t["precision"]))
        bands[cls] = ErrorBand(cls, int(t["rows"]), float(t["log_low"]), float(t["log_high"]))
    if ROOT_CLASS not in bands:
        raise ValueError(f"{DATA_FILE}: no band for all runs (kind, generation, precision all {ANY!r})")
    return ErrorBands(
        bands=MappingProxyType(bands),
        quantile_low=float(meta["quantile_low"]),
        quantile_high=float(meta["quantile_high"]),
        min_rows=int(meta["min_rows"]),
        generations=tuple(str(g) for g in meta["generations"]),
        coverage=float(meta["loso_coverage"]),
    )


@functools.cache
def load_error_bands() -> ErrorBands:
    """The shipped bands (``optimizer/data/error_bands.toml``), parsed once."""
    ref = resources.files(_DATA_PACKAGE).joinpath(DATA_FILE)
    return parse_error_bands(tomllib.loads(ref.read_text(encoding="utf-8")))


__all__ = [
    "ANY",
    "BandClass",
    "ErrorBand",
    "ErrorBands",
    "ModelKind",
    "PlanRanges",
    "PrecisionClass",
    "ROOT_CLASS",
    "band_class",
    "load_error_bands",
    "lookup_band",
    "parse_error_bands",
    "plan_ranges",
]
