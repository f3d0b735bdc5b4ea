"""Schema of the hardware catalog data files: every number carries a unit suffix, a kind and a source."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

QuantityKind = Literal["spec", "peak-dense", "measured", "derived", "reference-design", "model-constant"]
"""How a number was obtained.

- ``spec``: vendor datasheet / specification value (capacity, link rate, TDP).
- ``peak-dense``: theoretical peak dense (no 2:4 sparsity) FLOP/s at a precision.
- ``measured``: a published measurement (busbw, achievable GEMM TFLOP/s, visible memory).
- ``derived``: arithmetic on sourced numbers (the note says how).
- ``reference-design``: what the vendor's reference system uses (NICs per node, domain sizes).
- ``model-constant``: a constant of a published performance model (e.g. NCCL's tuner latency).
"""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quantity(_Strict):
    """One sourced number. Its unit is in the key that holds it (``..._bytes``, ``..._flops``)."""

    value: float = Field(gt=0, description="The number, in the unit named by the key (SI).")
    kind: QuantityKind
    source: str = Field(min_length=3, description="Where it comes from (document, table, URL).")
    note: str | None = None


class GpuEntry(_Strict):
    """One accelerator. FLOP/s are dense (no sparsity) peaks; bandwidths are per direction."""

    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd", "intel", "google"]
    generation: str = Field(min_length=1, description="Architecture, e.g. ampere, hopper, blackwell, cdna3.")
    memory_marketed_bytes: Quantity
    memory_usable_bytes: Quantity = Field(description="What the device exposes to software.")
    hbm_bandwidth_bytes_per_s: Quantity
    fp32_dense_flops: Quantity
    tf32_dense_flops: Quantity | None = None
    bf16_dense_flops: Quantity
    fp16_dense_flops: Quantity
    fp8_dense_flops: Quantity | None = None
    fp4_dense_flops: Quantity | None = None
    scale_up_link: str = Field(min_length=1, description="Scale-up link generation, e.g. nvlink4, xgmi3.")
    scale_up_topology: Literal["switch", "mesh"]
    scale_up_bandwidth_per_dir_bytes_per_s: Quantity = Field(
        description="Per-GPU scale-up bandwidth, one direction (NVLink 4: 450 GB/s)."
    )
    scale_up_busbw_fraction: Quantity = Field(
        description="Achievable ring collective bus bandwidth / per-direction link bandwidth (measured)."
    )
    default_nvlink_domain_size: int = Field(ge=1)
    tdp_w: Quantity
    gemm_efficiency_bf16: Quantity = Field(description="Best achievable large-GEMM fraction of BF16 peak (measured).")
    gemm_efficiency_fp8: Quantity | None = Field(
        default=None, description="Best achievable large-GEMM fraction of FP8 peak (measured)."
    )
    flash2_attention_fraction: Quantity | None = Field(
        default=None,
        description=(
            "Best published forward + backward rate of FlashAttention-2 (head dim 128, long sequences) / "
            "BF16 peak. Omitted where unpublished."
        ),
    )

    @field_validator(
        "gemm_efficiency_bf16", "gemm_efficiency_fp8", "scale_up_busbw_fraction", "flash2_attention_fraction"
    )
    @classmethod
    def _fraction(cls, q: Quantity | None) -> Quantity | None:
        if q is not None and not 0 < q.value <= 1.2:
            raise ValueError(f"must be a fraction in (0, 1.2], got {q.value}")
        return q


class NetworkEntry(_Strict):
    """A scale-out fabric (one NIC port per GPU on rail-optimised designs)."""

    name: str = Field(min_length=1)
    technology: Literal["infiniband", "roce", "ethernet"]
    port_rate_bits_per_s: Quantity = Field(description="Line rate of one port, one direction (bits/s).")
    latency_s: Quantity = Field(description="Effective per-collective-step alpha incl. software stack.")
    busbw_fraction: Quantity = Field(description="Achievable large-message bus bandwidth / line rate.")
    switch_radix_ports: Quantity = Field(description="Ports per switch at this rate.")

    @field_validator("busbw_fraction")
    @classmethod
    def _fraction(cls, q: Quantity) -> Quantity:
        if not 0 < q.value <= 1:
            raise ValueError(f"must be a fraction in (0, 1], got {q.value}")
        return q


class TierEntry(_Strict):
    """One level of the network hierarchy, innermost first."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    span_gpus: int | None = Field(
        default=None, ge=1, description="GPUs reachable inside one group of this tier; null = whole cluster."
    )
    oversubscription: float = Field(default=1.0, ge=1.0, description="Downlink:uplink ratio into this tier.")


class ClusterEntry(_Strict):
    """A cluster preset: a reference system design."""

    name: str = Field(min_length=1)
    gpu: str
    gpus_per_node: int = Field(ge=1)
    nvlink_domain_size: int = Field(ge=1)
    network: str
    nics_per_node: int = Field(ge=1)
    tiers: list[TierEntry] = Field(min_length=2)
    source: str = Field(min_length=3)
    note: str | None = None
