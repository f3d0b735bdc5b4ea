"""Small closed-form quantities from the seed text that the cost model has no function for.

Section numbers refer to ``seed-notes`` (the digest of the source text). Collective times
(``optimizer.cost.comm``), pipeline bubbles (``optimizer.cost.pipeline``) and per-stage memory
(``optimizer.cost.memory``) are not repeated here: use those functions directly. The byte
constants of the memory helpers are the cost model's own, so both agree by construction.

Units are SI (bytes, seconds, bytes/s), as everywhere in the package.
"""

from __future__ import annotations

from optimizer.capacity.formulas import (  # noqa: F401  (section 6: owned by the capacity formulas)
    checkpoint_overhead_fraction,
    sharded_write_time_s,
    system_mtbf_s,
    young_daly_interval_s,
)
from optimizer.cost.memory import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES

STATIC_BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES
"""Mixed-precision Adam: 2 (bf16 weights) + 2 (grads) + 12 (fp32 master, momentum, variance)."""


# ---- section 1: step time -------------------------------------------------------------------


def scaling_efficiency(t_compute_per_n_s: float, t_step_s: float) -> float:
    """``eta = T_compute / (N * T_step)``, given the per-GPU share ``T_compute / N`` (section 1)."""
    return t_compute_per_n_s / t_step_s


# ---- section 2: alpha-beta and LogP -------------------------------------------------------


def critical_message_bytes(alpha_s: float, beta_bytes_per_s: float) -> float:
    """``n* = alpha * beta``: below it a transfer is latency-bound, above it bandwidth-bound (section 2)."""
    return alpha_s * beta_bytes_per_s


def logp_time_s(compute_s: float, latency_s: float, overhead_s: float) -> float:
    """LogP time of a message overlapped with compute (section 2).

    The network latency ``L`` hides behind compute; the processor overhead ``o`` on each side
    does not: ``2 * o + max(compute, L)``.
    """
    return 2.0 * overhead_s + max(compute_s, latency_s)


# ---- section 3 and 4: message sizes ------------------------------------------------------------


def tp_allreduce_payload_bytes(batch: float, seq: float, hidden: float, bytes_per_elem: float) -> float:
    """Megatron TP all-reduce payload: ``B * S * d_model * bytes`` (section 3)."""
    return batch * seq * hidden * bytes_per_elem


def pp_boundary_bytes(micro_batch: float, seq: float, hidden: float, bytes_per_elem: float) -> float:
    """Activation tensor sent across one pipeline-stage boundary: ``B_micro * S * d_model * bytes`` (section 4)."""
    return micro_batch * seq * hidden * bytes_per_elem


# ---- section 5: memory -------------------------------------------------------------------------


def static_memory_bytes(params: float, bytes_per_param: float = STATIC_BYTES_PER_PARAM) -> float:
    """Weights + gradients + optimizer state, unsharded (section 5: 16 bytes/param with Adam)."""
    return params * bytes_per_param


def zero_memory_bytes_per_gpu(params: float, stage: int, n: int) -> float:
    """Static bytes per GPU under ZeRO ``stage`` over ``n`` data-parallel ranks (section 5).

    ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the weights.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
    weights = WEIGHT_BYTES / (n if stage >= 3 else 1)
    grads = GRAD_BYTES / (n if stage >= 2 else 1)
    optim = OPTIMIZER_BYTES / (n if stage >= 1 else 1)
    return params * (weights + grads + optim)


def kv_cache_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_elem: float = 2) -> float:
    """KV cache per token per sequence: ``2 * N_L * H_kv * d_head * bytes`` (section 5, K and V)."""
    return 2.0 * layers * kv_heads * head_dim * bytes_per_elem


# ---- section 6: reliability ----------------------------------------------------------------


def cluster_failure_probability(survival_per_node: float, n: int) -> float:
    """Probability that at least one of ``n`` independent nodes fails in a period: ``1 - p**n`` (section 6)."""
    return 1.0 - survival_per_node**n
