"""What the Megatron-Bridge performance recipes behind the calibration's H100 MoE rows ran.

The performance summary (``docs/performance-summary-archive.md``) prints the layout of each
row but not the MoE settings; the recipe of the same release does. Read from the
NVIDIA-NeMo/Megatron-Bridge repository at the tag of each container's release:

- NeMo 25.09 (``v0.1.0rc4``, Oct. 2025): ``scripts/performance/run_script.py`` applies
  ``apply_moe_token_drop`` to Qwen3-30B-A3B and Qwen3-235B-A22B (capacity factor 1.0, inputs
  padded to capacity; ``moe_token_drop.py`` asserts the all-to-all dispatcher) with
  ``CommOverlapConfig(tp_comm_overlap=True)``; DeepSeek-V3 on H100 runs DeepEP with forced load
  balancing and the 1F1B all-to-all overlap (``A2A_1F1B``: ``overlap_moe_expert_parallel_comm``
  and ``delay_wgrad_compute``).
- NeMo 25.11 (``v0.2.0``, Nov. 2025): ``scripts/performance/configs/qwen3/workload_base_configs.py``
  sets ``moe_a2a_overlap=True`` for both Qwen3 models on H100 and no flex-dispatcher backend
  (the all-to-all dispatcher); ``qwen3_llm_pretrain.py`` forces load balancing (dropless) and
  sets ``tp_comm_overlap`` false for Qwen3-235B-A22B on H100. GPT-OSS 120B on H100
  (``configs/gpt_oss``) sets no overlap and no flex backend.

Recompute, from the same files: in 25.09, ``configs/qwen3/qwen3_*_llm_pretrain.yaml`` set
``recompute_granularity: null`` (none); DeepSeek-V3's YAML sets ``"selective"`` and
``run_script.py`` sets ``recipe.model.recompute_modules = ["mla_up_proj", "mlp"]`` on H100: the
MLA up-projections re-made (and the MLPs of the three dense layers). The nearest cost-model mode
is ``core_attn`` (Megatron-Core's selective), which on MLA models re-makes the up-projections
too and also re-runs the attention core, which that run did not (slightly more recompute than
it had); the cost model's ``selective`` would also drop the norm and activation outputs it
kept. In 25.11, ``qwen3_llm_pretrain.py`` sets ``recompute_granularity = None``. GPT-OSS's
``workload_base_configs.py`` sets ``recompute_modules=["layernorm", "moe_act"]`` with a
micro-batch of 1, but the summary's row prints a micro-batch of 4 (and a gradient accumulation
that matches neither), so its recompute stays searched. The summary's layouts are taken as
printed where they differ from the recipe's (Qwen3-30B: VP 24 printed, ``vp: 12`` in the recipe).

DeepSeek-V3's H100 run keeps the recipe's multi-token-prediction layer (``deepseek_v3.py``
``mtp_num_layers=1``; ``run_script.py``'s layout ``"Et|(tt|)*30mL"`` puts it, with the loss, in the
last virtual stage). The cost model has no MTP layer: it costs the main model, without one more
MoE layer (1/61 of the layers) and a second output head (6 x 129,280 x 7,168 FLOPs a token, 2.5%
of the main model's 6 x 37.5B), so that row is expected to be predicted a few percent fast.

Padding to capacity fixes every expert's token count on the host (Megatron-Core's all-to-all
dispatcher then needs no device-to-host synchronisation: ``cuda_sync_point = "no_sync"``), but the
host still issues each local expert's GEMMs in turn; with Qwen3-30B-A3B's 16 small local experts
that issue time exceeds the GPU's, so ``training.expert_gemm_host_splits`` keeps its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class RecipeMoE:
    """The MoE settings of one Megatron-Bridge performance recipe."""

    dispatcher: Literal["alltoall", "deepep"]
    a2a_overlap: bool
    token_drop: bool
    tp_comm_overlap: bool | None = None
    """None: the recipe's value is not read here (the row's own mapping stands)."""
    recompute: str | None = None
    """The recipe's activation recompute in the cost model's names (None: not read here)."""


_RECIPES: dict[tuple[str, str], RecipeMoE] = {
    ("25.09", "qwen3-30b"): RecipeMoE("alltoall", False, True, tp_comm_overlap=True, recompute="none"),
    ("25.09", "qwen3-235b"): RecipeMoE("alltoall", False, True, tp_comm_overlap=True, recompute="none"),
    ("25.09", "dsv3"): RecipeMoE("deepep", a2a_overlap=True, token_drop=False, recompute="core_attn"),
    ("25.11", "qwen3-30b"): RecipeMoE("alltoall", True, False, tp_comm_overlap=True, recompute="none"),
    ("25.11", "qwen3-235b"): RecipeMoE("alltoall", True, False, tp_comm_overlap=False, recompute="none"),
    # recompute not read: the row's micro-batch (4) is not the recipe's (1), so which ran is unknown
    ("25.11", "gptoss-120b"): RecipeMoE("alltoall", a2a_overlap=False, token_drop=False),
}


def recipe_moe(row: dict[str, Any]) -> RecipeMoE | None:
    """The recipe of a Megatron-Bridge H100 MoE row (``mbridge-<release>-<model>-h100-...``), or
    None for every other row."""
    parts = str(row.get("id", "")).split("-")
    if len(parts) < 4 or parts[0] != "mbridge" or "h100" not in parts:
        return None
    release = parts[1]
    model = "-".join(parts[2 : parts.index("h100")])
    return _RECIPES.get((release, model))


UNCOSTED_TECHNIQUES: dict[str, str] = {
    "mbridge-26.04.01-llama3-70b-gb200-64gpu-fp8": (
        "the release's recipe ran no recompute with CPU activation offloading of 40 of 80 layers (Megatron-Bridge "
        "v0.4.1 llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2), which the cost model "
        "does not cost: recompute is searched and only full fits (with none it predicts 6.50 s a step, 19% fast)"
    ),
}
"""Rows whose recipe used a technique the cost model has no term for: what it was and how the row
is scored instead."""
