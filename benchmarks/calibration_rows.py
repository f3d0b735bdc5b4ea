"""Map the published-runs calibration set (``benchmarks/data/published_runs.json``) to cost-model inputs.

Each usable row becomes a :class:`MappedRow`: a ``JobSpec`` (model, training, cluster), the layout
fields the source stated (pinned) and a small grid of candidate values for the knobs it did not
state, plus the measured throughput in tokens/s/GPU and which measurement it came from. Rows that
cannot be mapped raise :class:`Unmappable` with the reason; ``map_all`` collects them.

Mapping rules (all applied in these modules and nowhere else), each documented where it is applied:

  - Model (and the sources' FLOP definitions): ``benchmarks/row_model.py``.
  - Training and Cluster: ``benchmarks/row_stack.py``.
  - Layout (stated fields pinned, unstated knobs searched): ``benchmarks/row_layout.py``.
  - Measured throughput: here, below.

Measured throughput (tokens/s/GPU), first available of:
  1. ``tokens_per_sec_per_gpu``; 2. ``tokens_per_sec_total / num_gpus``;
  3. ``global_batch_tokens / step_time_s / num_gpus``;
  4. ``tflops_per_gpu`` (else ``mfu`` x the row's MFU peak) divided by the source's own FLOPs per
     token (:func:`source_flops_per_token` in ``row_model``, see its docstring for the three
     definitions).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.mbridge_recipes import recipe_moe
from benchmarks.row_errors import Unmappable
from benchmarks.row_layout import LAYOUT_KNOBS, account_for_embedding_and_loss_split, layout_space
from benchmarks.row_model import INFER_MISSING_HEADS, flop_definition, map_model, source_flops_per_token
from benchmarks.row_stack import (
    global_batch_size,
    is_torchtitan,
    map_attention_kernel,
    map_dp_collectives,
    map_dp_comm_overlap,
    map_ep_comm_overlap,
    map_fused_kernels,
    map_gpu,
    map_grad_reduce_in_fp32,
    map_moe_dispatcher,
    map_network,
    map_pp_comm_overlap,
    map_precision,
    map_tp_comm_overlap,
    map_tp_dgrad_overlap,
    names_deepspeed,
)
from optimizer.specs import ClusterSpec, EvaluateRequest, JobSpec, Layout, ModelSpec, TrainingSpec

DATA_PATH = Path(__file__).resolve().parent / "data" / "published_runs.json"


@dataclass(frozen=True)
class MappedRow:
    id: str
    row: dict[str, Any] = field(repr=False)
    job: JobSpec
    fixed: dict[str, Any]
    """Layout fields the source stated (or that follow from stated fields)."""
    grid: dict[str, tuple[Any, ...]]
    """Candidate values of the knobs the source did not state."""
    measured_tokens_per_s_per_gpu: float
    measurement: str
    """Which measured quantity was used and how it was converted."""
    gpu_class: str
    """"A100" or "H100"."""
    kind: str
    """"dense" or "moe"."""
    comparison_group: str | None
    notes: tuple[str, ...] = ()

    @property
    def num_gpus(self) -> int:
        return self.job.cluster.num_gpus

    def layouts(self) -> list[Layout]:
        """Every candidate layout: the pinned fields times the grid of unstated knobs."""
        keys = list(self.grid)
        out = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            out.append(Layout(**{**self.fixed, **dict(zip(keys, values, strict=True))}))
        return out

    def request(self, layout: Layout) -> EvaluateRequest:
        job = self.job
        return EvaluateRequest(model=job.model, training=job.training, cluster=job.cluster, config=layout)


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str


# ---------------------------------------------------------------------------------------- loading


def load_rows(path: Path | str = DATA_PATH) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        raise TypeError(f"{path}: expected a JSON list of rows")
    return rows


def map_all(rows: list[dict[str, Any]] | None = None) -> tuple[list[MappedRow], list[Skipped]]:
    rows = load_rows() if rows is None else rows
    mapped: list[MappedRow] = []
    skipped: list[Skipped] = []
    for row in rows:
        try:
            mapped.append(map_row(row))
        except Unmappable as exc:
            skipped.append(Skipped(row.get("id", "?"), str(exc)))
    return mapped, skipped


# ---------------------------------------------------------------------------------------- measured throughput


def measured_throughput(row: dict[str, Any], model: ModelSpec, seq: int, gbs: int) -> tuple[float, str]:
    """(tokens/s/GPU, which measurement)."""
    me = row["measured"]
    n = row["num_gpus"]
    if me.get("tokens_per_sec_per_gpu"):
        return float(me["tokens_per_sec_per_gpu"]), "tokens/s/GPU"
    if me.get("tokens_per_sec_total"):
        return float(me["tokens_per_sec_total"]) / n, "tokens/s total / N"
    if me.get("step_time_s"):
        return gbs * seq / float(me["step_time_s"]) / n, "batch tokens / step time / N"
    tflops = me.get("tflops_per_gpu")
    label = "TFLOP/s"
    if not tflops and me.get("mfu") and row["hardware"].get("peak_dense_tflops_used_for_mfu"):
        tflops = float(me["mfu"]) * float(row["hardware"]["peak_dense_tflops_used_for_mfu"])
        label = "MFU x peak"
    if not tflops:
        raise Unmappable("no measured throughput (tokens/s, step time or TFLOP/s)")
    causal, factor, definition = flop_definition(row)
    per_token = source_flops_per_token(model, seq, causal=causal, recompute_factor=factor)
    return float(tflops) * 1e12 / per_token, f"{label} / {definition}"


# ---------------------------------------------------------------------------------------- one row


def map_row(row: dict[str, Any]) -> MappedRow:
    rid = row.get("id", "?")
    notes: list[str] = []
    model, n_model = map_model(row)
    notes += n_model
    seq = row["model"].get("seq_len")
    if not seq:
        raise Unmappable("seq_len not stated")
    gbs, n_gbs = global_batch_size(row, int(seq))
    notes += n_gbs
    precision, n_prec = map_precision(row["config"].get("precision"))
    notes += n_prec
    tp_overlap = map_tp_comm_overlap(row["config"].get("other"))
    recipe = recipe_moe(row)
    if recipe is not None and recipe.tp_comm_overlap is not None:
        tp_overlap = recipe.tp_comm_overlap
    token_drop = recipe is not None and recipe.token_drop
    gpu, gpu_class, n_gpu = map_gpu(row)
    notes += n_gpu
    network, nics, n_net = map_network(row, gpu_class)
    notes += n_net
    hw = row["hardware"]
    gpn = int(hw.get("gpus_per_node") or 8)
    titan = is_torchtitan(row)
    try:
        training = TrainingSpec(
            seq_len=int(seq),
            global_batch_size=gbs,
            precision=precision,  # type: ignore[arg-type]
            tp_comm_overlap=tp_overlap,
            tp_dgrad_overlap=map_tp_dgrad_overlap(row),
            ep_comm_overlap=map_ep_comm_overlap(row),
            fused_kernels=map_fused_kernels(row),
            attention_kernel=map_attention_kernel(row),  # type: ignore[arg-type]
            pp_comm_overlap=map_pp_comm_overlap(row),
            dp_collectives=map_dp_collectives(row),  # type: ignore[arg-type]
            dp_comm_overlap=map_dp_comm_overlap(row),
            moe_dispatcher=map_moe_dispatcher(row),  # type: ignore[arg-type]
            # padded to capacity 1.0 (the host still issues every expert's GEMMs in turn)
            moe_capacity_factor=1.0 if token_drop else None,
            # torchtitan: FSDP2 reduces in float32 only, and PyTorch's cross_entropy on fp32 logits;
            # DeepSpeed's pipeline engine in bf16: BF16_Optimizer's fp32 gradients
            grad_reduce_in_fp32=map_grad_reduce_in_fp32(row, precision),
            cross_entropy="unfused" if titan else "fused",
            # torchao's float8 linears keep their 16-bit inputs, Transformer Engine's the fp8 ones
            fp8_saved_inputs=not titan,
            # torchtitan's attention expands the key/value heads (repeat_kv) before SDPA
            kv_expanded=titan,
            # ZeRO-2/3 buffers: FSDP2 and DeepSpeed hold a layer's worth, Megatron-FSDP its queues
            fsdp_buffers="fsdp2" if titan else "layer" if names_deepspeed(row) else "megatron-fsdp",
        )
        cluster = ClusterSpec(
            num_gpus=int(row["num_gpus"]),
            gpu=gpu,
            gpus_per_node=gpn,
            nvlink_domain_size=int(hw.get("nvlink_domain") or gpn),
            network=network,
            nics_per_node=int(nics),
            gpu_power_limit_w=500.0 if "500w" in (hw.get("gpu") or "").lower().replace(" ", "") else None,
            # parts with more memory than the catalog entry (torchtitan's 96 GB H100)
            gpu_memory_gib=float(hw["gpu_memory_gb"])
            if (hw.get("gpu_memory_gb") or 0) > 80 and gpu == "h100-sxm-80gb"
            else None,
        )
        job = JobSpec(model=model, training=training, cluster=cluster)
    except ValueError as exc:
        raise Unmappable(f"request rejected: {exc}") from exc
    fixed, grid, n_lay = layout_space(row, job)
    notes += n_lay
    measured, how = measured_throughput(row, model, int(seq), gbs)
    if not (measured > 0 and math.isfinite(measured)):
        raise Unmappable(f"measured throughput {measured} not usable")
    return MappedRow(
        id=rid,
        row=row,
        job=job,
        fixed=fixed,
        grid=grid,
        measured_tokens_per_s_per_gpu=measured,
        measurement=how,
        gpu_class=gpu_class,
        kind="moe" if model.moe is not None else "dense",
        comparison_group=row.get("comparison_group"),
        notes=tuple(notes),
    )


__all__ = [
    "DATA_PATH",
    "INFER_MISSING_HEADS",
    "LAYOUT_KNOBS",
    "MappedRow",
    "Skipped",
    "Unmappable",
    "account_for_embedding_and_loss_split",
    "flop_definition",
    "is_torchtitan",
    "load_rows",
    "map_all",
    "map_gpu",
    "map_precision",
    "map_row",
    "measured_throughput",
    "names_deepspeed",
    "source_flops_per_token",
]
