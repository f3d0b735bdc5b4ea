"""What a GPU's tensor cores deliver for a job: the dense GEMM peak at the training precision, the
fraction of it large GEMMs reach, and the clock a power cap leaves. The one place the cost model,
the board-power estimate (``capacity.annotate``) and the plan notes read these catalog numbers."""

from __future__ import annotations

from hardware_catalog.schema import GpuEntry, Quantity
from optimizer.calibration import DEFAULT, Calibration
from optimizer.errors import InvalidLayout
from optimizer.modes import is_low_bit
from optimizer.specs import JobSpec


def catalog_gemm_efficiency(gpu: GpuEntry, low_bit: bool) -> Quantity:
    """The catalog's best large-GEMM fraction of the dense peak (with its source and kind). FP4 has
    no published large-GEMM measurement and takes the FP8 fraction; a GPU with no FP8 one takes its
    bf16 fraction (the plan notes say so)."""
    if low_bit:
        return gpu.gemm_efficiency_fp8 or gpu.gemm_efficiency_bf16
    return gpu.gemm_efficiency_bf16


def gemm_efficiency_of(job: JobSpec, gpu: GpuEntry, low_bit: bool | None = None) -> float:
    """The best large-GEMM fraction of the dense peak at the job's precision (``low_bit``: fp8 / fp4
    when None), before the calibration's ``gemm_training_fraction``: the request's
    ``cluster.gemm_efficiency`` at the training precision, else the catalog's."""
    job_low_bit = is_low_bit(job.training.precision)
    low_bit = job_low_bit if low_bit is None else low_bit
    given = job.cluster.gemm_efficiency
    if given is not None and low_bit == job_low_bit:
        return given
    return catalog_gemm_efficiency(gpu, low_bit).value


def gemm_peak_and_efficiency(job: JobSpec, gpu: GpuEntry) -> tuple[float, float]:
    """The datasheet dense GEMM peak at the training precision and the fraction of it large GEMMs
    reach (``gemm_efficiency_of``). Raises ``InvalidLayout`` when the GPU has no tensor cores for
    the precision."""
    precision = job.training.precision
    name = job.cluster.gpu
    if precision == "fp8":
        if gpu.fp8_dense_flops is None:
            raise InvalidLayout("training.precision", f"fp8 needs FP8 tensor cores; {name} has none (use bf16)")
        return gpu.fp8_dense_flops.value, gemm_efficiency_of(job, gpu)
    if precision == "fp4":
        if gpu.fp4_dense_flops is None:
            raise InvalidLayout("training.precision", f"fp4 needs FP4 tensor cores; {name} has none (use fp8 or bf16)")
        return gpu.fp4_dense_flops.value, gemm_efficiency_of(job, gpu)
    peak = gpu.bf16_dense_flops.value if precision == "bf16" else gpu.fp16_dense_flops.value
    return peak, gemm_efficiency_of(job, gpu)


def power_clock(job: JobSpec, gpu: GpuEntry, cal: Calibration = DEFAULT) -> float:
    """The clock fraction a power cap below the GPU's TDP leaves (``cluster.gpu_power_limit_w``)."""
    limit = job.cluster.gpu_power_limit_w
    if limit is not None and limit < gpu.tdp_w.value:
        return float((limit / gpu.tdp_w.value) ** cal.power_clock_exponent)
    return 1.0
