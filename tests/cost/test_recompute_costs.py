"""Recompute policies: torchtitan's op-level checkpointing and MLA's up-projection recompute."""

from __future__ import annotations

import pytest

from optimizer.cost import Estimate, best_estimate, build_context, resolve_layout
from optimizer.specs import JobSpec, Layout
from optimizer.units import GIB
from tests.cost.cost_helpers import _deepseek_v3_h800, _scored


def test_op_level_recompute_sits_between_none_and_full_and_reruns_tp_collectives():
    """``op`` (torchtitan's policy) re-runs every second matmul and the elementwise ops, keeps the
    attention core's output, and re-runs the sequence-parallel all-gathers: half of each layer's
    forward TP traffic."""

    def est(recompute: str):
        return _scored(
            "llama3-8b",
            "dgx-h100",
            64,
            {"seq_len": 8192, "global_batch_size": 96, "tp_dgrad_overlap": False},  # torchtitan's TP
            tp=8,
            pp=1,
            micro_batch_size=12,
            zero_stage=3,
            recompute=recompute,
        )[1]

    none, sel, op, full = (est(r) for r in ("none", "selective", "op", "full"))
    assert none.breakdown_s["compute"] < op.breakdown_s["compute"] < full.breakdown_s["compute"]
    assert op.breakdown_s["tp_comm"] == pytest.approx(1.25 * none.breakdown_s["tp_comm"])  # 4 -> 5 per layer
    assert full.breakdown_s["tp_comm"] == pytest.approx(1.5 * none.breakdown_s["tp_comm"])
    assert sel.breakdown_s["tp_comm"] == pytest.approx(none.breakdown_s["tp_comm"])
    # op keeps the output of every second matmul per token and layer, w2's full-width partial
    # sum among them at TP 8 (8,576 elements against selective's 5,888; docs/cost-model.md)
    kept = 32 * (8576 - 5888) * 12 * 8192 * 2  # layers x elements x tokens x bytes
    assert op.memory[0].activations_bytes - sel.memory[0].activations_bytes == pytest.approx(kept)
    assert none.hardware_flops_per_step < op.hardware_flops_per_step < full.hardware_flops_per_step
    assert op.model_flops_per_step == none.model_flops_per_step


def test_op_level_recompute_keeps_the_attention_core_outputs():
    """With materialised scores, ``op`` keeps them (the attention core is not re-run) where
    selective recompute drops them; its HFU counts no re-run of the core either."""
    from optimizer.cost.layer import UNFUSED_SCORE_BYTES_STORED

    def est(recompute: str, kernel: str = "unfused"):
        return _scored(
            "llama2-7b",
            "dgx-a100",
            8,
            {"seq_len": 4096, "global_batch_size": 8, "attention_kernel": kernel},
            tp=2,
            pp=1,
            micro_batch_size=1,
            zero_stage=1,
            recompute=recompute,
        )

    (ctx, op), (_, sel), (_, none) = est("op"), est("selective"), est("none")
    scores = 32 * UNFUSED_SCORE_BYTES_STORED * (32 / 2) * 4096**2
    acts = {name: e.memory[0].activations_bytes for name, e in (("op", op), ("sel", sel))}
    assert acts["op"] - est("op", "flash2")[1].memory[0].activations_bytes == pytest.approx(scores)
    assert acts["sel"] == pytest.approx(est("selective", "flash2")[1].memory[0].activations_bytes)
    masked = ctx.flops.attn_core_forward_per_token * 8 * 4096  # one run of the masked half
    op_extra = op.hardware_flops_per_step - op.model_flops_per_step
    none_extra = none.hardware_flops_per_step - none.model_flops_per_step
    assert none_extra == pytest.approx(3 * masked)
    assert op_extra - none_extra == pytest.approx(0.5 * (ctx.flops.forward_layers_per_token * 8 * 4096 - masked))


def test_mla_selective_recompute_keeps_the_latents_and_reruns_the_up_projections():
    """On MLA models selective recompute keeps the compressed latents and the rotary key and re-makes
    the per-head q, k, v in backward (DeepSeek-V3 report 3.2.3; Megatron's ``mla_up_proj``):
    128 heads x (192 + 192 + 128) elements per token fewer per layer than ``op`` (which keeps them,
    memory otherwise counted the same), at the cost of the two up-projection GEMMs."""
    from optimizer.cost.layer import ACT_BYTES, Dims, layer_cost
    from optimizer.cost.topology import axis_groups

    ctx, sel = _deepseek_v3_h800("selective")
    _, op = _deepseek_v3_h800("op")
    _, none = _deepseek_v3_h800("none")
    tokens = 15360 * 4096
    # q_b 1536 x 128 x 192 and kv_b 512 x 128 x (128 + 128), 61 layers, 2 FLOPs per multiply-add
    up_flops_per_token = 2 * 61 * (1536 * 128 * 192 + 512 * 128 * 256)
    assert ctx.flops.mla_up_forward_per_token == up_flops_per_token
    assert sel.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(
        (ctx.flops.attn_core_forward_per_token + up_flops_per_token) * tokens
    )
    groups = axis_groups(ctx.topology, sel.order, sel.layout.sizes())
    moe_kind = next(k for k in ctx.kinds if k.is_moe)

    def cost(recompute: str):
        return layer_cost(ctx, moe_kind, Dims(1, 1, 64, 1, False, recompute), groups)

    per_head_qkv = 128 * (192 + 192 + 128) * 4096 * ACT_BYTES  # one micro-batch of 4,096 tokens
    assert cost("op").stored_act_bytes - cost("selective").stored_act_bytes == pytest.approx(per_head_qkv)
    assert cost("selective").working_act_bytes == pytest.approx(cost("op").working_act_bytes)
    # the published layout ran on DeepSeek's stack, which cached activations in FP8; costed with
    # bf16 activations as Megatron-Core keeps them (and the MoE layer's four routed copies in
    # flight) it is 78.7 GiB on stage 1, 0.04 GiB over the H800's usable 78.6: predicted not to
    # fit, by less than the allocator's slack. Keeping the per-head q, k, v it would need ~111 GiB
    usable_gib = ctx.usable_bytes(None) / GIB
    assert not sel.fits_memory
    assert sel.peak_memory_bytes / GIB == pytest.approx(78.7, abs=0.05)
    assert 0 < sel.peak_memory_bytes / GIB - usable_gib < 0.1
    assert op.peak_memory_bytes / GIB > 100


def test_mla_up_projection_recompute_costs_its_two_gemms_and_keeps_split_latents(monkeypatch):
    """Backward re-runs q_b (1536 -> 128 x 192) and kv_b (512 -> 128 x 256) on every token of the
    micro-batch, heads split over TP; with sequence parallelism the latents are split too."""
    from optimizer.cost import layer as layer_mod
    from optimizer.cost.layer import ACT_BYTES, Dims, gemm_time_s, layer_cost
    from optimizer.cost.topology import axis_groups

    ctx, sel = _deepseek_v3_h800("selective")
    groups = axis_groups(ctx.topology, sel.order, sel.layout.sizes())
    moe_kind = next(k for k in ctx.kinds if k.is_moe)
    tp, tokens = 2, 4096.0
    dims = Dims(tp, 1, 64, 1, True, "selective")
    recomputed = layer_cost(ctx, moe_kind, dims, groups)
    monkeypatch.setattr(layer_mod, "MLA_UP_RECOMPUTED", frozenset())
    kept = layer_cost(ctx, moe_kind, dims, groups)
    gemms = gemm_time_s(ctx, 2 * tokens * 1536 * 128 * 192 / tp, tokens, 128 * 192 / tp, 1536) + gemm_time_s(
        ctx, 2 * tokens * 512 * 128 * 256 / tp, tokens, 128 * 256 / tp, 512
    )
    assert recomputed.bwd_s - kept.bwd_s == pytest.approx(gemms)
    assert recomputed.fwd_s == kept.fwd_s
    # stored per token: norm inputs 2 x 7168/2, latents (1536 + 512)/2, rotary key 64, attention
    # output 128 x 128/2, routed copies 8/2 x (7168 + 2 x 2048), shared expert 2 x 2048/2
    elements = 7168 + 1024 + 64 + 8192 + 4 * 11264 + 2048
    assert recomputed.stored_act_bytes == pytest.approx(elements * tokens * ACT_BYTES)


def test_mla_without_query_compression_re_makes_q_from_the_hidden_state():
    """Megatron's mla_up_proj checkpoint also re-runs the direct query projection when a model
    has no query latent (DeepSeek-V2-Lite): q is dropped and its GEMM re-run in backward."""
    mla = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    model = {"name": "mla-lite", "num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16,
             "num_kv_heads": 16, "vocab_size": 32000, "ffn_hidden_size": 8192, "mla": mla}  # fmt: skip
    job = JobSpec(
        model=model, training={"seq_len": 4096, "global_batch_size": 8},
        cluster={"preset": "dgx-h100", "num_gpus": 8},
    )  # fmt: skip
    ctx = build_context(job)
    assert ctx.mla_up_params == (2048 * 16 * 192, 512 * 16 * 256)
    assert ctx.flops.mla_up_forward_per_token == 2 * 4 * (2048 * 16 * 192 + 512 * 16 * 256)

    def est(recompute: str) -> Estimate:
        lay = Layout(tp=1, pp=1, micro_batch_size=1, zero_stage=1, recompute=recompute)
        return best_estimate(ctx, resolve_layout(job, lay))

    sel, op = est("selective"), est("op")
    per_head_qkv = 4 * 16 * (192 + 192 + 128) * 4096 * 2  # layers x elements per token x tokens x bytes
    assert op.memory[0].activations_bytes - sel.memory[0].activations_bytes == pytest.approx(per_head_qkv)


@pytest.mark.parametrize(
    ("tp", "op_elems", "selective_elems"),
    [
        # wq, wv, w1, w2 of the seven matmuls, the layer input and the attention output:
        # 4 x 4096 + 1024 + 14336 + 4096 = 31,744 against selective's 4h + 2 kv + 2 f
        (1, 31744, 47104),
        # TP 8 with sequence parallelism: w2's partial sum is full width (4096), plus the two
        # reduce-scatter outputs; selective splits everything over TP
        (8, 8576, 5888),
    ],
)
def test_op_level_checkpointing_keeps_every_second_matmul_output(tp, op_elems, selective_elems):
    """torchtitan's op-level policy (``_custom_policy``: every mm output saved but every second
    one of the layer) on Llama 3 8B, elements kept per token and layer."""
    op = _scored("llama3-8b", "dgx-h100", 8, {"seq_len": 8192, "global_batch_size": 8},
                 tp=tp, pp=1, micro_batch_size=1, zero_stage=3, recompute="op")[1]  # fmt: skip
    sel = _scored("llama3-8b", "dgx-h100", 8, {"seq_len": 8192, "global_batch_size": 8},
                  tp=tp, pp=1, micro_batch_size=1, zero_stage=3, recompute="selective")[1]  # fmt: skip
    per_elem = 32 * 8192 * 2  # layers x tokens x bytes
    assert op.memory[0].activations_bytes - sel.memory[0].activations_bytes == pytest.approx(
        (op_elems - selective_elems) * per_elem
    )
