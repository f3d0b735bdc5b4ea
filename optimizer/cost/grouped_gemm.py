"""Routed-expert (grouped) GEMM time on one GPU: the GPU's share from measured grouped-GEMM
throughput by tokens per expert, the host's from the fitted per-GEMM issue time.

A grouped GEMM runs every local expert's ``(m x k) @ (k x n)`` product in one kernel; with ``m``
rows per group (tokens per expert) its throughput falls as ``m`` shrinks: each group's last row
tile is partly empty and few tiles leave SMs idle. ``m_efficiency`` reads that fall from the
measured table in ``optimizer/data/grouped_gemm.toml`` (DeepGEMM on H800, FP8 block scaling):
throughput at ``m`` over the same shape's at large ``m``, averaged over the table's shapes,
interpolated in ``log m`` (below the measured range it follows the dense curve's ``m`` factor
down). The ``n`` and ``k`` dimensions keep the dense curve of
``layer_base.gemm_time_s``. No published table varies ``m`` on Blackwell or in bf16, so the
Hopper FP8 curve stands for every GPU and precision.
"""

from __future__ import annotations

import bisect
import functools
import math
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from typing import Any

from optimizer.calibration import DEFAULT
from optimizer.cost.context import JobContext

DATA_FILE = "data/grouped_gemm.toml"
CURVE_TABLE = "deepgemm-h800-fp8"
"""The ``[[m_curve]]`` table the cost model reads."""


@dataclass(frozen=True)
class MCurve:
    """Grouped-GEMM throughput at ``m`` rows per group relative to large ``m`` (ascending ``m``)."""

    m: tuple[float, ...]
    efficiency: tuple[float, ...]

    def at(self, m: float, dim_half: float) -> float:
        """Log-linear between measured points, the last point's value above the largest; below
        the smallest ``m0`` (not measured) it follows the dense curve ``m / (m + dim_half)``
        down from the value at ``m0``."""
        if m <= 0:
            return 0.0
        if m <= self.m[0]:
            m0 = self.m[0]
            return self.efficiency[0] * (m / (m + dim_half)) / (m0 / (m0 + dim_half))
        if m >= self.m[-1]:
            return self.efficiency[-1]
        i = bisect.bisect_right(self.m, m)
        lo, hi = self.m[i - 1], self.m[i]
        t = math.log(m / lo) / math.log(hi / lo)
        return self.efficiency[i - 1] + t * (self.efficiency[i] - self.efficiency[i - 1])


def parse_m_curve(doc: dict[str, Any], table: str = CURVE_TABLE) -> MCurve:
    """The curve of ``table``: each row's throughput over its (n, k) shape's largest-``m`` row,
    averaged over the shapes measured at each ``m``."""
    rows = [r for r in doc["m_curve"] if r["table"] == table]
    if not rows:
        raise ValueError(f"grouped_gemm.toml has no m_curve rows for table {table!r}")
    best: dict[tuple[int, int], tuple[int, float]] = {}
    for r in rows:
        shape, m, flops = (int(r["n"]), int(r["k"])), int(r["m_per_group"]), float(r["flops"]["value"])
        if shape not in best or m > best[shape][0]:
            best[shape] = (m, flops)
    by_m: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        by_m[int(r["m_per_group"])].append(float(r["flops"]["value"]) / best[(int(r["n"]), int(r["k"]))][1])
    ms = sorted(by_m)
    return MCurve(tuple(float(m) for m in ms), tuple(sum(by_m[m]) / len(by_m[m]) for m in ms))


@functools.cache
def load_m_curve() -> MCurve:
    """The shipped curve (``optimizer/data/grouped_gemm.toml``), parsed once."""
    ref = resources.files("optimizer").joinpath(DATA_FILE)
    return parse_m_curve(tomllib.loads(ref.read_text(encoding="utf-8")))


def m_efficiency(m: float, dim_half: float = DEFAULT.gemm_dim_half) -> float:
    """Throughput of a grouped GEMM with ``m`` rows per group relative to large ``m``
    (``dim_half``: the dense curve's half-rate dimension, used below the measured range)."""
    return load_m_curve().at(m, dim_half)


def grouped_gemm_gpu_s(ctx: JobContext, flops: float, m: float, n: float, k: float) -> float:
    """GPU time of a grouped GEMM of ``flops`` with ``m`` rows per group and per-group (n, k):
    the training precision's achievable rate, ``m_efficiency(m)`` and the dense curve's ``n``
    and ``k`` factors (``layer_base.gemm_time_s``)."""
    if flops <= 0:
        return 0.0
    d0 = ctx.cal.gemm_dim_half
    rate = ctx.gemm_peak_flops * ctx.gemm_efficiency * m_efficiency(m, d0) * (n / (n + d0)) * (k / (k + d0))
    return flops / rate


def expert_gemm_host_s(ctx: JobContext, local_experts: float) -> float:
    """Host time to issue one MoE layer's forward expert GEMMs (fc1 and fc2 of each local
    expert, ``cal.expert_gemm_host_s`` each) when the stack reads the split sizes back to the
    host (``training.expert_gemm_host_splits``); 0 otherwise (device-side splits, CUDA graphs)."""
    if not ctx.job.training.expert_gemm_host_splits:
        return 0.0
    return 2.0 * local_experts * ctx.cal.expert_gemm_host_s
