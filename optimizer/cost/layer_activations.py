"""Activation bytes of one layer and micro-batch on one GPU: what is stored from forward to backward
under each recompute mode, and the transient working set (Korthikanti et al. 2022, adapted: flash
attention, GQA/MLA, gated MLP, MoE)."""

from __future__ import annotations

from optimizer.cost import layer_base
from optimizer.cost.attention import UNFUSED_SCORE_BYTES_STORED, score_elements
from optimizer.cost.context import JobContext, LayerKind
from optimizer.cost.layer_base import ACT_BYTES, ATTENTION_CORE_RECOMPUTED, Dims
from optimizer.cost.routing import routing_load
from optimizer.modes import RecomputeMode, is_low_bit


def activation_bytes(
    ctx: JobContext, kind: LayerKind, d: Dims, tokens: float, mla_up_kept: bool, moe_block: bool
) -> tuple[float, float]:
    """(stored, working) activation bytes of one layer and micro-batch on one GPU: kept from
    forward to backward under ``d.recompute``, and the layer's full transient set. ``tokens`` per
    GEMM on a TP rank; ``mla_up_kept`` false when the MLA up-projections are re-run in backward;
    ``moe_block`` when the MoE block is."""
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    p = kind.params
    tp, sp_div = d.tp, (d.tp if d.sequence_parallel else 1)
    heads = float(model.num_attention_heads or 0)
    kv_width_local = layer_base.kv_width_local(ctx, tp)
    # ---- activations (Korthikanti et al. 2022, adapted: flash attention, GQA/MLA, gated MLP, MoE)
    hid = h / sp_div  # norm inputs/outputs and residual-stream tensors (sequence-parallel split)
    if model.mla is not None:
        # compressed latents (replicated over TP, split with sequence parallelism) and the shared
        # rotary key, plus the per-head q, k, v the up-projections make (split over TP; without
        # query compression q is projected from the norm output, counted in ``hid``)
        mla = model.mla
        mla_up_out = heads * ctx.d_qk / tp + kv_width_local
        attn_inner = ((mla.q_lora_rank or 0) + mla.kv_lora_rank) / sp_div + mla.qk_rope_head_dim + mla_up_out
    else:
        # q, and k/v (replicated if tp > kv heads; query-wide where the stack expands them)
        attn_inner = heads * ctx.d_qk / tp + layer_base.attention_kv_width(ctx, tp)
        mla_up_out = 0.0
    core_out = heads * ctx.d_v / tp
    gated = model.activation == "swiglu"
    routed_share = 0.0
    if kind.is_moe:
        moe = model.moe
        assert moe is not None
        f_e = p.routed_expert_each / (3 * h if gated else 2 * h)
        # expert input (etp x the copies after the expert-TP all-gather) + fc1 output (1/etp wide)
        per_routed = h * d.etp + (2 * f_e if gated else f_e)
        act_out_routed = f_e
        routed_share = moe.top_k * routing_load(ctx) / tp  # routed copies per token on this GPU
        mlp_keep = routed_share * per_routed
        mlp_act_out = routed_share * act_out_routed
        if p.shared_experts:
            f_s = p.shared_experts / (3 * h if gated else 2 * h)
            mlp_keep += (2 * f_s if gated else f_s) / tp
            mlp_act_out += f_s / tp
        mlp_in = hid
    else:
        f_d = p.mlp_dense / (3 * h if gated else 2 * h)
        mlp_keep = (2 * f_d if gated else f_d) / tp
        mlp_act_out = f_d / tp
        mlp_in = hid
    ln_inputs = 2 * hid
    # norm outputs, activation output; eager SwiGLU also keeps silu's (silu keeps its input, mul both)
    recomputable = hid + mlp_in + mlp_act_out * (2.0 if gated and not ctx.job.training.fused_kernels else 1.0)
    always = ln_inputs + attn_inner + core_out + mlp_keep
    full_elems = always + recomputable
    if d.recompute == RecomputeMode.FULL:
        stored_elems = hid  # only the layer input
    elif moe_block:
        # the MoE block keeps only its input (never more than what selective keeps)
        stored_elems = always - mlp_keep + min(mlp_keep, mlp_in)
    elif d.recompute == RecomputeMode.OP and not kind.is_moe and model.mla is None:
        f_local = p.mlp_dense / (3 * h if gated else 2 * h) / tp
        stored_elems = _op_saved_elems(ctx, d, hid, core_out, f_local, gated)
    elif d.recompute in (RecomputeMode.SELECTIVE, RecomputeMode.MOE, RecomputeMode.OP):
        stored_elems = always  # op on MoE and MLA layers: counted like selective (an upper bound)
    else:  # none, and Megatron's core_attn (which keeps what none keeps but the two below)
        stored_elems = full_elems + _gathered_inputs_kept(ctx, kind, d, hid, mlp_in)
    masks = dropout_mask_elems(ctx, hid)
    stored_elems += (masks if d.recompute != RecomputeMode.FULL else 0.0) - (0.0 if mla_up_kept else mla_up_out)
    full_elems += masks  # the MLA up-projections' outputs, re-made from the latents, stay working
    per_token_bytes = ACT_BYTES * tokens
    gemm_in = _gemm_inputs(ctx, kind, d.etp * routed_share * h, hid, mlp_in, mlp_act_out)
    stored = stored_elems * per_token_bytes - _quantized_saving_bytes(ctx, kind, d, moe_block, gemm_in) * tokens
    working = _working_elems(ctx, kind, d, full_elems, (routed_share * h, hid), moe_block) * per_token_bytes
    if ctx.attention_kernel == "unfused" and d.recompute not in ATTENTION_CORE_RECOMPUTED:
        # materialised scores, kept for backward unless the attention core is recomputed
        # (Korthikanti et al.'s 5as^2b). Not added to the transient working set of a recomputed
        # layer: Korthikanti et al. count stored activations only, and with it the SC'21 ZeRO-3
        # 530B run that fit on 640 A100 80GB would be predicted 7 GiB over capacity.
        stored += UNFUSED_SCORE_BYTES_STORED * score_elements(ctx, kind, d)
    return stored, working


def dropout_mask_elems(ctx: JobContext, hid: float) -> float:
    """With ``model.dropout`` above 0, the residual dropout after attention and after the MLP keeps a
    1-byte mask each for backward: one bf16 element a token per (sequence-parallel split) hidden
    unit ``hid``; full recompute re-makes them."""
    return hid if ctx.job.model.dropout > 0 else 0.0


MOE_TRANSIENT_COPIES = 4
"""Routed-token copies (``top_k`` rows of each token, ``hidden`` wide) alive at once in an MoE
layer with several local experts (Megatron-Core ``moe/moe_layer.py`` ``custom_forward`` at
000c4ac2): the permuted copy before the all-to-all and its output stay referenced until the layer
returns, beside the experts' fc2 output and the copy sorted back for the combine; the layer's
input (``hid``) comes on top."""


def _working_elems(
    ctx: JobContext, kind: LayerKind, d: Dims, full_elems: float, rows: tuple[float, float], moe_block: bool
) -> float:
    """A layer's transient set, elements per token: its whole kept set; in an MoE layer with
    several local experts at least ``MOE_TRANSIENT_COPIES`` copies of its routed rows (``rows``:
    routed elements per token on this GPU, and the layer input's), on top of the kept set when
    the block is re-run (full or moe recompute)."""
    moe = ctx.job.model.moe
    if not kind.is_moe or moe is None or moe.num_experts <= d.ep:
        return full_elems
    routed, layer_in = rows
    copies = MOE_TRANSIENT_COPIES * routed + layer_in
    block_rerun = d.recompute == RecomputeMode.FULL or moe_block
    return full_elems + copies if block_rerun else max(full_elems, copies)


def _gathered_inputs_kept(ctx: JobContext, kind: LayerKind, d: Dims, hid: float, mlp_in: float) -> float:
    """Elements per token a DTensor TP stack (``training.tp_dgrad_overlap`` false) keeps beyond the
    sequence-parallel shards of the column-parallel linears' inputs: the matmul saves the gathered,
    full-width input for its backward (Megatron-Core keeps the shard and re-gathers). The
    attention's (not MLA's, whose down-projections take the shard) and a dense MLP's."""
    if ctx.job.training.tp_dgrad_overlap or not d.sequence_parallel or d.tp <= 1:
        return 0.0
    h = float(ctx.job.model.hidden_size or 0)
    attention = h - hid if ctx.job.model.mla is None else 0.0
    return attention + (0.0 if kind.is_moe else h - mlp_in)


QUANTIZED_INPUT_BYTES = 1.0
"""Bytes per element of a GEMM input kept quantized for backward: fp8 data (MXFP8 adds one scale
byte per 32 elements, not counted); with fp4 GEMMs an upper bound (NVFP4: half a byte plus
scales)."""


def _keeps_quantized_inputs(ctx: JobContext) -> bool:
    """Whether the stack keeps GEMM inputs for backward in the GEMMs' 8- or 4-bit format
    (``training.fp8_saved_inputs`` with fp8 or fp4 GEMMs)."""
    training = ctx.job.training
    return training.fp8_saved_inputs and is_low_bit(training.precision)


def _gemm_inputs(
    ctx: JobContext, kind: LayerKind, routed_in: float, hid: float, mlp_in: float, mlp_act_out: float
) -> tuple[float, float, float]:
    """GEMM input elements per token of a layer that a stack may keep quantized: those selective
    recompute keeps (the routed experts' inputs), those only kept without it (norm outputs feeding
    one linear layer: not an MLA layer's first, which feeds two that keep a copy each, nor an MoE
    layer's second, which feeds the router and the dispatcher; activation outputs, fc2's input),
    and the extra quantized copy of an MoE layer's second norm output its shared experts keep."""
    one_linear = (0.0 if ctx.job.model.mla is not None else hid) + (0.0 if kind.is_moe else mlp_in)
    shared_copy = mlp_in if kind.is_moe and kind.params.shared_experts else 0.0
    return routed_in, one_linear + mlp_act_out, shared_copy


def _quantized_saving_bytes(
    ctx: JobContext, kind: LayerKind, d: Dims, moe_block: bool, gemm_in: tuple[float, float, float]
) -> float:
    """Bytes per token a stack that keeps GEMM inputs quantized saves on one layer: one byte for
    each GEMM input element the layer keeps under ``d.recompute``, less the quantized copies it
    adds. ``gemm_in``: the GEMM input elements per token kept by selective recompute, those only
    kept without it, and the extra copy kept without it (norm outputs re-made under selective
    are saved unquantized: Megatron-Core's ``set_save_original_input``)."""
    if not _keeps_quantized_inputs(ctx) or d.recompute == RecomputeMode.FULL or moe_block:
        return 0.0
    if d.recompute == RecomputeMode.OP and not kind.is_moe and ctx.job.model.mla is None:
        return 0.0  # torchtitan's op-level policy keeps matmul outputs (its stack keeps 16-bit inputs)
    always, recomputable, extra_copy = gemm_in
    if d.recompute in (RecomputeMode.SELECTIVE, RecomputeMode.MOE, RecomputeMode.OP):
        return (ACT_BYTES - QUANTIZED_INPUT_BYTES) * always
    return (ACT_BYTES - QUANTIZED_INPUT_BYTES) * (always + recomputable) - QUANTIZED_INPUT_BYTES * extra_copy


def _op_saved_elems(ctx: JobContext, d: Dims, hid: float, core_out: float, f_local: float, gated: bool) -> float:
    """Elements per token a dense layer keeps under torchtitan's op-level checkpointing
    (``torchtitan/distributed/activation_checkpoint.py``, ``_custom_policy``): the output of every
    matmul but every second one of the layer, in forward order (wq, wk, wv, wo, then w1, w3, w2 or
    fc1, fc2), the attention kernel's output and, with sequence parallelism, the two
    reduce-scatters' outputs; the layer input stays as the checkpoint's input. wo and the last MLP
    matmul produce full-width partial sums before their reduce-scatter."""
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    heads, kv_heads = float(model.num_attention_heads or 0), float(model.num_kv_heads or 0)
    kv_split = min(d.tp, max(kv_heads, 1.0))
    mlp = [f_local, f_local, h] if gated else [f_local, h]
    outputs = [heads * ctx.d_qk / d.tp, kv_heads * ctx.d_qk / kv_split, kv_heads * ctx.d_v / kv_split, h, *mlp]
    saved = sum(outputs[0::2])  # the 1st, 3rd, ... matmul of the layer
    scatters = 2 * hid if d.sequence_parallel and d.tp > 1 else 0.0
    return hid + core_out + saved + scatters
