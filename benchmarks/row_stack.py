"""Map a calibration row's training and cluster fields (``benchmarks/calibration_rows.py``).

Training
  - ``seq_len`` from the model block; global batch = ``global_batch_size`` or
    ``global_batch_tokens / seq_len``; when neither is stated, ``micro_batch_size * dp *
    grad_accum_steps`` (torchtitan runs use no gradient accumulation: ``grad_accum_steps = 1``).
  - precision: ``fp8`` / ``float8`` -> fp8 (torchtitan "bf16 + float8 linears" runs its linears in
    FP8), ``fp16`` -> fp16, ``bf16`` -> bf16, not stated -> bf16.
  - ``tp_comm_overlap`` when ``config.other`` names ``--tp-comm-overlap`` or async TP;
    ``ep_comm_overlap`` when the config or the row's notes name a (1F1B) A2A overlap;
    ``moe_dispatcher`` from the row, else per the source's recipe (``map_moe_dispatcher``);
    ``pp_comm_overlap`` false on DeepSpeed's pipeline engine (the source or notes name DeepSpeed);
    ``tp_dgrad_overlap`` for Megatron-family runs from 2022 on (``map_tp_dgrad_overlap``);
    ``dp_collectives`` flat for DeepSpeed ZeRO-3 rows of 2021 (``map_dp_collectives``), else
    hierarchical; ``dp_comm_overlap`` false for the same rows and for DeepSpeed's pipeline engine
    (``map_dp_comm_overlap``), else true;
    ``fused_kernels`` false for torchtitan runs without ``torch.compile``; torchtitan runs keep
    and reduce gradients in fp32 (``grad_reduce_in_fp32``: FSDP2's ``mixed_precision_reduce`` takes
    only float32) and compute the loss with PyTorch's fp32 cross-entropy (``cross_entropy``
    unfused), DeepSpeed pipeline-engine runs in bf16 keep fp32 gradients too (``BF16_Optimizer``,
    ``map_grad_reduce_in_fp32``), every other run 16-bit gradients and a fused loss; fp8 runs keep their GEMM inputs
    for backward in fp8 (``fp8_saved_inputs``: Transformer Engine) except torchtitan's (torchao);
    torchtitan runs expand the key/value heads before attention (``kv_expanded``); ``attention_kernel``
    unfused for sources dated 2022 or earlier (materialised scores, before FlashAttention),
    flash3 for non-torchtitan sources dated 2025 or later (Transformer Engine 2.x), flash2 for
    the rest (FlashAttention-2 era; torchtitan's PyTorch SDPA flash backend).

Cluster
  - GPU: A100 40/80 GB -> ``a100-sxm-40gb`` / ``a100-sxm-80gb``; H100 80 GB -> ``h100-sxm-80gb``;
    torchtitan's H100 96 GB capped at 500 W -> ``h100-sxm-80gb`` as well (the catalog has no such
    part: memory capacity is understated by 16 GB and the power cap is not modelled).
  - Network from ``inter_node``: HDR -> ``ib-hdr-200``; NDR or "400 Gb/s" -> ``ib-ndr-400``;
    RoCE -> ``roce-400``; Omni-Path (BLOOM, 4 x 100 Gb/s links per node) -> ``ib-hdr-200`` with
    2 NICs per node (the same 400 Gb/s per node); not stated -> ``ib-hdr-200`` for A100,
    ``ib-ndr-400`` for H100. ``nics_per_node`` from the row, else 8. ``gpus_per_node`` and
    ``nvlink_domain_size`` from the row, else 8. Leaf span and oversubscription: catalog defaults.

``map_recompute`` and ``map_zero_stage`` read the phrasings of the layout rules
(``benchmarks/row_layout.py``); ``is_torchtitan`` and ``names_deepspeed`` tell the stacks apart.
"""

from __future__ import annotations

import json
import re
from typing import Any

from benchmarks.mbridge_recipes import recipe_moe
from benchmarks.row_errors import Unmappable

# ---------------------------------------------------------------------------------------- cluster


def map_gpu(row: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(catalog GPU id, "A100"/"H100", notes)."""
    hw = row["hardware"]
    text = (hw.get("gpu") or "").lower()
    mem = hw.get("gpu_memory_gb")
    notes: list[str] = []
    if "a100" in text:
        if mem is None:
            raise Unmappable("A100 memory size not stated")
        return ("a100-sxm-40gb" if mem <= 40 else "a100-sxm-80gb"), "A100", notes
    if "h100" in text:
        if mem is not None and mem > 80:
            notes.append(f"H100 {mem} GB{' 500 W' if '500' in text else ''} modelled as h100-sxm-80gb with {mem} GiB")
        return "h100-sxm-80gb", "H100", notes
    if "h200" in text:
        return "h200-sxm-141gb", "H200", notes
    if "gb200" in text:
        return "gb200", "GB200", notes
    if "b200" in text:
        return "b200", "B200", notes
    raise Unmappable(f"GPU {hw.get('gpu')!r} not in the mapping")


def map_network(row: dict[str, Any], gpu_class: str) -> tuple[str, int, list[str]]:
    """(network id, NICs per node, notes)."""
    hw = row["hardware"]
    text = (hw.get("inter_node") or "").lower()
    nics = hw.get("nics_per_node") or int(hw.get("gpus_per_node") or 8)  # one NIC per GPU
    notes: list[str] = []
    if "omni-path" in text or "omnipath" in text or "opa" in text.split():
        links = hw.get("nics_per_node") or 4
        nics = max(1, links * 100 // 200)
        notes.append(f"Omni-Path {links}x100G modelled as {nics}x HDR-200 (same Gb/s per node)")
        return "ib-hdr-200", nics, notes
    if "hdr" in text:
        return "ib-hdr-200", nics, notes
    if "ndr" in text:
        return "ib-ndr-400", nics, notes
    if "roce" in text:
        return "roce-400", nics, notes
    if "400 gb" in text or "400gb" in text or "50 gb/s" in text:
        return "ib-ndr-400", nics, notes
    if text:
        notes.append(f"fabric {hw.get('inter_node')!r} not recognised: default for {gpu_class}")
    if not text:
        notes.append(f"fabric not stated: {'HDR' if gpu_class == 'A100' else 'NDR'} InfiniBand, one NIC per GPU")
    return ("ib-hdr-200" if gpu_class == "A100" else "ib-ndr-400"), nics, notes


# ---------------------------------------------------------------------------------------- training


def map_tp_comm_overlap(other: str | None) -> bool:
    """``config.other`` names Megatron's ``--tp-comm-overlap`` or torchtitan's async TP."""
    t = str(other or "").lower()
    return "tp-comm-overlap" in t or "async tp" in t or "async-tp" in t


def map_ep_comm_overlap(row: dict[str, Any]) -> bool:
    """The row's config or notes name a batch-level (1F1B) all-to-all overlap, or its
    Megatron-Bridge recipe sets one (``mbridge_recipes``)."""
    t = f"{row['config'].get('other') or ''} {row.get('notes') or ''}".lower()
    recipe = recipe_moe(row)
    return "a2a overlap" in t or "overlap-moe-expert-parallel-comm" in t or (recipe is not None and recipe.a2a_overlap)


def map_moe_dispatcher(row: dict[str, Any]) -> str:
    """The row's ``config.moe_dispatcher`` (DeepEP -> deepep, HybridEP -> hybridep, else the name);
    unstated: the Megatron-Bridge recipe's (``mbridge_recipes``), else alltoall (Megatron-Core's
    all-to-all dispatcher, the NeMo and Megatron-Bridge default with expert parallelism)."""
    stated = str(row["config"].get("moe_dispatcher") or "").lower()
    for name in ("deepep", "hybridep", "allgather", "alltoall"):
        if name in stated.replace("-", "").replace("_", ""):
            return name
    recipe = recipe_moe(row)
    return recipe.dispatcher if recipe is not None else "alltoall"


def names_deepspeed(row: dict[str, Any]) -> bool:
    """The row's source, ``config.other`` or notes name DeepSpeed."""
    text = f"{json.dumps(row.get('source', {}))} {row['config'].get('other') or ''} {row.get('notes') or ''}"
    return "deepspeed" in text.lower()


def map_pp_comm_overlap(row: dict[str, Any]) -> bool:
    """Runs on DeepSpeed's pipeline engine (MT-NLG, Megatron-DeepSpeed for BLOOM) send and
    receive activations with blocking calls: no pipeline communication overlap."""
    return not names_deepspeed(row)


def map_tp_dgrad_overlap(row: dict[str, Any]) -> bool:
    """Megatron's linear layers overlap their backward input-gradient collectives with the GEMMs
    since September 2021 (Megatron-LM commit 16c90445, ``--async-tensor-model-parallel-allreduce``,
    later always on): runs of Megatron-LM, NeMo and Megatron-Bridge from 2022 on. The SC'21 runs
    predate it; torchtitan (DTensor) and DeepSpeed stacks (MT-NLG, BLOOM) do not overlap them."""
    m = re.search(r"(19|20)\d\d", str(row.get("source", {}).get("date") or ""))
    year = int(m.group(0)) if m else 0
    return year >= 2022 and not is_torchtitan(row) and not names_deepspeed(row)


def map_dp_collectives(row: dict[str, Any]) -> str:
    """DeepSpeed's ZeRO-3 of 2021 (the SC'21 Table 2 baseline) gathers parameters as flat rings:
    at a fixed batch its measured step does not fall as GPUs are added (66.7 s for 175B on 768
    and on 1,536 GPUs, about 180 s for 530B on 1,120 and 2,240), the signature of a per-GPU
    bandwidth floor; flat rings put one at 3x the parameter bytes over one HDR NIC (47 s for
    175B), hierarchical gathers at an eighth of that. Rows of later DeepSpeed versions and every
    other stack in the set run hierarchical collectives."""
    year = str(row.get("source", {}).get("date") or "")[:4]
    deepspeed_2021 = names_deepspeed(row) and year.isdigit() and int(year) <= 2021
    return "flat" if row["config"].get("zero_stage") == 3 and deepspeed_2021 else "hierarchical"


def map_dp_comm_overlap(row: dict[str, Any]) -> bool:
    """DeepSpeed's ZeRO-3 of 2021 (the SC'21 Table 2 baseline) gathers weights on demand: its
    parameter prefetch is capped at ``stage3_prefetch_bucket_size`` elements, 5e7 by default,
    under 3% of one GPT-3 175B layer (1.8e9) and 1% of one 530B layer, so each module's weights
    are gathered when it runs; its gradient reduce-scatters overlap backward (``overlap_comm``,
    on by default at stage 3 since ZeRO-3's release in March 2021). Costed with
    ``training.dp_comm_overlap`` false, which means exactly that for ZeRO-3. DeepSpeed's pipeline
    engine (Megatron-DeepSpeed runs with pp > 1: MT-NLG, BLOOM) reduces gradients after the
    step's last backward: it turns ``overlap_comm`` off under a ``PipelineModule``
    (``deepspeed/runtime/engine.py`` ``_configure_zero_optimizer``), so those rows are costed with
    it false too. Every other stack in the set overlaps both (Megatron's overlapped gradient
    reduction and parameter gather, FSDP2)."""
    pipeline_engine = names_deepspeed(row) and (row["config"].get("pp") or 1) > 1
    return map_dp_collectives(row) != "flat" and not pipeline_engine


def map_grad_reduce_in_fp32(row: dict[str, Any], precision: str) -> bool:
    """torchtitan: FSDP2's ``mixed_precision_reduce`` takes only float32. DeepSpeed's pipeline
    engine with bf16 (BLOOM; MT-NLG, whose precision is not stated, is mapped to bf16): at the
    profile's pin it reduces the gradients of ``BF16_Optimizer``, which accumulates them in fp32
    (``deepspeed/runtime/pipe/engine.py`` ``_bf16_reduce_grads``: ``optimizer.get_grads_for_reduction``,
    defined only there). An approximation for these rows: their DeepSpeed reduced in its default
    16-bit ``communication_data_type`` (so the costed reduction bytes are an upper estimate), and
    MT-NLG's runs predate that bf16 pipeline path (April 2022). Every other run keeps 16-bit
    gradients (Megatron's ``--grad-reduce-in-bf16`` era recipes, DeepSpeed's ZeRO with bf16 or
    fp16: ``engine.py`` ``get_data_types``)."""
    if is_torchtitan(row):
        return True
    pipeline_engine = names_deepspeed(row) and (row["config"].get("pp") or 1) > 1
    return pipeline_engine and precision in ("bf16", "fp8")


def map_fused_kernels(row: dict[str, Any]) -> bool:
    """torchtitan runs without ``torch.compile`` in ``config.other`` are eager (unfused); every
    other stack in the set fuses its elementwise kernels (Megatron / Transformer Engine, DeepSpeed
    with Megatron's fused kernels)."""
    return not is_torchtitan(row) or "compile" in str(row["config"].get("other") or "").lower()


def map_attention_kernel(row: dict[str, Any]) -> str:
    """Stacks of 2025 and later run Hopper-native attention kernels (Transformer Engine 2.x with
    cuDNN 9 fused attention); 2023-2024 stacks ran FlashAttention-2-class kernels (FlashAttention-3
    was released in July 2024; torchtitan's context parallelism of December 2024 wraps PyTorch
    SDPA's flash backend, FlashAttention-2); stacks of 2022 and before materialised the attention
    scores (Megatron-LM / Megatron-DeepSpeed before FlashAttention). The year is the first one in
    the source's date."""
    m = re.search(r"(19|20)\d\d", str(row.get("source", {}).get("date") or ""))
    year = int(m.group(0)) if m else 0
    if year and year <= 2022:
        return "unfused"
    return "flash3" if year >= 2025 and not is_torchtitan(row) else "flash2"


def map_precision(text: str | None) -> tuple[str, list[str]]:
    t = (text or "").lower()
    if "fp8" in t or "float8" in t:
        return "fp8", []
    if "fp16" in t and "bf16" not in t:
        return "fp16", []
    if "bf16" in t and "fp16" not in t:
        return "bf16", []
    return "bf16", [f"precision {text!r}: bf16 assumed"]


def map_recompute(text: str | None) -> str | None:
    if text is None:
        return None
    t = str(text).lower().strip()
    if t.startswith("full") or "full" in t.split(" (")[0]:
        return "full"
    if "selective" in t:
        modules = t.split("(", 1)[1].rstrip(")") if "(" in t else ""
        if "moe" in [m.strip() for m in modules.split(",")]:
            return "moe"  # Megatron --recompute-modules ... moe: the whole MoE block
        return "selective"
    if t in ("none", "no", "off", "false", "disabled"):
        return "none"
    raise Unmappable(f"activation_recompute {text!r} not understood")


def map_zero_stage(cfg: dict[str, Any]) -> int | None:
    if cfg.get("zero_stage") is not None:
        return int(cfg["zero_stage"])
    fsdp = cfg.get("fsdp")
    if fsdp is not None and fsdp is not False and str(fsdp).lower() not in ("0", "off", "false", "no"):
        return 3
    dist_opt = cfg.get("distributed_optimizer")
    if dist_opt is not None:
        return 1 if dist_opt else 0
    return None


def is_torchtitan(row: dict[str, Any]) -> bool:
    return "torchtitan" in row["id"] or "torchtitan" in json.dumps(row.get("source", {})).lower()


def global_batch_size(row: dict[str, Any], seq: int) -> tuple[int, list[str]]:
    cfg = row["config"]
    if cfg.get("global_batch_size"):
        return int(cfg["global_batch_size"]), []
    if cfg.get("global_batch_tokens"):
        return int(cfg["global_batch_tokens"]) // seq, []
    ga = cfg.get("grad_accum_steps") or (1 if is_torchtitan(row) else None)
    if cfg.get("micro_batch_size") and cfg.get("dp") and ga:
        gbs = int(cfg["micro_batch_size"]) * int(cfg["dp"]) * int(ga)
        return gbs, [f"global batch {gbs} = local batch x dp x grad-accum {ga} (not stated)"]
    raise Unmappable("global batch not stated")
