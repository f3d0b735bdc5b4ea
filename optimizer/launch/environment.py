"""Environment variables a Megatron-LM launch needs for the plan to run as costed.

``CUDA_DEVICE_MAX_CONNECTIONS`` sets how many hardware queues a process's CUDA streams map to.
Megatron-LM (``megatron/training/arguments.py`` ``validate_args`` at commit 000c4ac2) asserts:

* ``!= "1"`` with Megatron-FSDP (``--use-megatron-fsdp``, our ZeRO-2/3): "FSDP always requires
  CUDA_DEVICE_MAX_CONNECTIONS value large than one";
* ``== "1"`` with tensor or context parallelism on GPUs before Blackwell (compute capability
  below 10, AMD's included), unless FSDP or ``--overlap-moe-expert-parallel-comm`` is on: with the
  latter it warns that "1" favours TP/CP and a larger value the expert all-to-all overlap.

Megatron-Core's asynchronous TP collectives (``tensor_parallel/layers.py``, the backward overlap
the cost model counts with ``training.tp_dgrad_overlap``) rely on "1" to start the collective
before the GEMM it hides under; on Blackwell it is no longer asserted and "1" still orders them.
Megatron-Bridge sets the variable itself (``training/comm_overlap.py``
``_set_num_cuda_device_max_connections`` at v0.1.0rc4, when the recipe configures
``comm_overlap``), so its launch names none."""

from __future__ import annotations

from optimizer.cost.rules import ResolvedLayout
from optimizer.launch.megatron import ATTENTION_BACKEND, MEGATRON_FSDP_STRATEGY
from optimizer.specs import ModelSpec, TrainingSpec

CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
MANY_CONNECTIONS = "32"
"""The value Megatron-LM's warning suggests when a plan prefers concurrent streams."""


def megatron_env(model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout) -> dict[str, str]:
    """The variables a Megatron-LM launch of ``layout`` sets (empty: none)."""
    if layout.zero_stage in MEGATRON_FSDP_STRATEGY:
        return {CONNECTIONS: MANY_CONNECTIONS}
    if model.is_moe and training.ep_comm_overlap and layout.ep > 1:
        return {CONNECTIONS: MANY_CONNECTIONS}  # the costed expert all-to-all overlap
    if layout.tp > 1 or layout.cp > 1:
        return {CONNECTIONS: "1"}
    return {}


ORDERED_WITHOUT_ONE = frozenset({"blackwell", "blackwell-ultra"})
"""GPU generations on which Megatron-LM no longer needs "1" to order TP/CP collectives
(``validate_args`` at 000c4ac2: the requirement and its warnings stop at compute capability 10)."""


def unordered_tp_overlap_note(
    model: ModelSpec, training: TrainingSpec, layout: ResolvedLayout, generation: str | None
) -> list[str]:
    """A Megatron-LM plan with tensor or context parallelism launched with many connections
    (Megatron-FSDP asserts them; the expert all-to-all overlap wants them) on a GPU before
    Blackwell: Megatron-Core's asynchronous TP backward collectives, which the plan hides under
    GEMMs, are then not ordered ahead of those GEMMs (``tensor_parallel/layers.py`` relies on
    "1"; ``validate_args`` warns), which the cost model cannot say."""
    many = megatron_env(model, training, layout).get(CONNECTIONS) == MANY_CONNECTIONS
    if not many or layout.tp * layout.cp == 1 or generation in ORDERED_WITHOUT_ONE:
        return []
    return [
        f"Megatron-LM runs this plan with {CONNECTIONS}={MANY_CONNECTIONS}: before Blackwell its asynchronous "
        "TP/CP collectives, costed as hidden under GEMMs, are then not ordered ahead of them (validate_args "
        "warns), so they may take longer than planned"
    ]


TE_ATTENTION_ENV = {
    "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
}
"""Transformer Engine's opt-out variables per ``AttnBackend`` (Megatron-Core
``language_module.py`` ``_set_attention_backend``, the values it writes)."""


def nemo_env(training: TrainingSpec) -> dict[str, str]:
    """The variables a Megatron-Bridge launch sets: the attention kernel. Bridge's override
    ``model.attention_backend=<name>`` arrives as a string (``omegaconf_utils.py`` at v0.1.0rc4
    converts only dtypes) that Megatron-Core 0.14's ``_set_attention_backend`` compares with its
    enum members only, so Transformer Engine would choose for itself; the launch keeps that
    override (it also keeps the default ``auto`` branch from asserting these variables are 1)."""
    return dict(TE_ATTENTION_ENV[ATTENTION_BACKEND[training.attention_kernel]])


def bridge_fsdp_connections_note(training: TrainingSpec, layout: ResolvedLayout, generation: str | None) -> list[str]:
    """A Megatron-Bridge plan on Megatron-FSDP (ZeRO-2/3) with tensor or context parallelism before
    Blackwell: Bridge sets CUDA_DEVICE_MAX_CONNECTIONS=1 there (``comm_overlap.py``
    ``_set_num_cuda_device_max_connections`` at v0.1.0rc4, without looking at FSDP), which
    Megatron-FSDP's overlap needs above 1 (Megatron-LM asserts it)."""
    if layout.zero_stage not in MEGATRON_FSDP_STRATEGY or layout.tp * layout.cp == 1:
        return []
    if generation in ORDERED_WITHOUT_ONE or not training.dp_comm_overlap:
        return []
    return [
        f"Megatron-Bridge sets {CONNECTIONS}=1 for TP/CP before Blackwell, which Megatron-FSDP needs above 1: "
        "its gathers and reductions, costed as hidden, may not overlap"
    ]
