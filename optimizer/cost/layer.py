"""Per-layer, per-micro-batch cost on one GPU: compute, exposed communication, memory.

All quantities are for one micro-batch of ``b`` sequences passing through one layer on one GPU,
after the TP / CP / EP splits. ``T = b * s / cp`` is the number of tokens a tensor-parallel rank
feeds its GEMMs (sequence parallelism gathers the ``T / tp`` shard before each GEMM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from optimizer.cost.comm import hierarchical_allreduce_time_s
from optimizer.cost.context import JobContext, LayerKind
from optimizer.cost.dispatch import dispatch_time_s
from optimizer.cost.flops import MEGATRON_SELECTIVE
from optimizer.cost.num import Num
from optimizer.cost.routing import router_bytes_fwd, routing_load
from optimizer.cost.topology import AxisGroups, GroupGeometry

ACT_BYTES = 2.0
"""Activations, activation gradients and TP/EP/PP messages are bf16 (also in FP8 runs)."""


PERMUTE_BYTES = 8.0
"""HBM bytes per routed token copy per hidden unit in an MoE layer's forward (bf16): the
permutation gathers each token's ``top_k`` copies into expert order (read and write each copy)
and the unpermutation reads the expert outputs back and accumulates them, weighted, into the
token's output. A middle value: fused kernels (Transformer Engine) move about ``4 + 4 / top_k``
bytes per copy, unfused index_select / multiply / scatter_add chains 12-14. Backward moves the
same bytes the other way (a scatter and a gather)."""


UNFUSED_SCORE_BYTES_FWD = 13.0
"""HBM bytes per attention-score element in forward when the scores are materialised
(``attention_kernel`` 'unfused', 16-bit): QK^T writes S (2), the fused scale-mask-softmax reads S
and writes P (4), attention dropout reads P and writes P' and a 1-byte mask (5), the PV GEMM
reads P' (2)."""
UNFUSED_SCORE_BYTES_BWD = 19.0
"""The same in backward: the dP' GEMM writes it (2), dropout backward reads dP' and the mask and
writes dP (5), softmax backward reads P and dP and writes dS (6), the dQ and dK GEMMs read dS
(4), the dV GEMM reads P' (2)."""
UNFUSED_SCORE_BYTES_STORED = 5.0
"""Bytes per score element kept for backward (Korthikanti et al. 2022: softmax output 2, dropout
mask 1, dropout output 2; ``5 a s^2 b`` per layer)."""


ATTENTION_CORE_RECOMPUTED = frozenset({"selective", "moe", "full", MEGATRON_SELECTIVE})
"""Recompute modes that re-run the attention core in backward (``op`` keeps its output)."""

MLA_UP_RECOMPUTED = frozenset({"selective", "moe", MEGATRON_SELECTIVE})
"""Recompute modes that, on MLA models, keep the compressed query / key-value latents instead of
the per-head q, k, v and re-run the up-projections in backward (DeepSeek-V3 report section 3.2.3;
Megatron-Core's ``mla_up_proj`` recompute module). ``full`` re-runs them with the whole layer."""


@dataclass(frozen=True)
class Dims:
    """The layout numbers the per-layer cost depends on."""

    tp: int
    cp: int
    ep: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str


@dataclass(frozen=True)
class LayerCost:
    fwd_s: float
    bwd_s: float
    """Backward compute, including recomputed forward work."""
    tp_s: float
    cp_s: float
    ep_s: float
    stored_act_bytes: float
    """Activations kept from forward to backward for one micro-batch."""
    working_act_bytes: float
    """Transient activations of this layer while it runs (the full set for one micro-batch)."""
    dense_params: float
    """Parameters on this GPU that are replicated over data parallel (after TP split)."""
    expert_params: float
    """Routed-expert parameters on this GPU (after EP split)."""

    @property
    def time_s(self) -> float:
        """Forward + backward compute with the exposed TP/CP/EP communication of this layer."""
        return self.fwd_s + self.bwd_s + self.tp_s + self.cp_s + self.ep_s


def gemm_time_s(ctx: JobContext, flops: float, m: float, n: float, k: float, rate_flops: float | None = None) -> float:
    """One GEMM of ``flops`` with dimensions (m, n, k) at the shape-dependent achievable rate
    (``rate_flops`` for large shapes; default the training precision's)."""
    if flops <= 0:
        return 0.0
    if rate_flops is None:
        rate_flops = ctx.gemm_peak_flops * ctx.gemm_efficiency
    d0 = ctx.cal.gemm_dim_half
    shape = (m / (m + d0)) * (n / (n + d0)) * (k / (k + d0))
    return flops / (rate_flops * shape)


def expert_gemm_times_s(ctx: JobContext, kind: LayerKind, d: Dims) -> tuple[float, float]:
    """(GPU time, host issue time) of one MoE layer's routed-expert GEMMs on one GPU per
    micro-batch, forward (fc1 and fc2 of each local expert; backward is twice each).

    The GPU time is the grouped GEMM at its shape. The host's: the per-expert split sizes come
    from the router on the device, so the host waits for them (a device-to-host sync) and then
    issues each expert's GEMMs in turn, ``cal.expert_gemm_host_s`` each, with the GPU idle until
    it catches up (0 when ``training.expert_gemm_host_splits`` is false: the stack keeps the host
    out of the loop). The layer takes the larger of the two (``layer_cost``)."""
    moe = ctx.job.model.moe
    assert moe is not None and kind.is_moe
    h = float(ctx.job.model.hidden_size or 0)
    each = kind.params.routed_expert_each
    routed = routed_tokens_per_gpu(ctx, d)
    per_expert = routed * d.ep / moe.num_experts
    gpu = gemm_time_s(ctx, 2 * routed * each, per_expert, h, each / (2 * h))
    if not ctx.job.training.expert_gemm_host_splits:
        return gpu, 0.0
    return gpu, 2.0 * moe.num_experts / d.ep * ctx.cal.expert_gemm_host_s


RESIDUAL_STREAM_BYTES = 22.0
"""Of ``cal.elementwise_bytes_per_token_hidden``, the forward HBM bytes per token per hidden unit of
the kernels on the residual stream, which every tensor-parallel rank repeats on the full hidden
state unless sequence parallelism splits it: two norms (read and write 2 B each: 8) and two fused
bias-dropout-add kernels (read the input and the residual, write the sum: 6, and a 1-byte dropout
mask: 14). The rest (rotary, bias and scaling on q, k, v and the MLP's inputs) works on tensors
already split over TP. Korthikanti et al. 2022, Table 4: sequence parallelism alone saves 0.5 ms
of 7.7 ms in the forward of one 22B layer at TP8 (micro-batch 4, 2,048 tokens), which is 7/8 of
21 bytes per token and hidden unit at the A100's achievable HBM bandwidth."""


def elementwise_bytes_fwd(ctx: JobContext, tokens: float, tp: int, sp_div: int, ffn_active: float) -> float:
    """Forward HBM bytes of one layer's memory-bound kernels on one GPU (bf16, fused; before FP8
    casts): the residual-stream share split by sequence parallelism only (``sp_div``), the rest
    and the FFN activation by TP."""
    cal = ctx.cal
    h = float(ctx.job.model.hidden_size or 0)
    residual = min(RESIDUAL_STREAM_BYTES, cal.elementwise_bytes_per_token_hidden)
    split = cal.elementwise_bytes_per_token_hidden - residual
    return tokens * (residual * h / sp_div + (split * h + cal.elementwise_bytes_per_token_ffn * ffn_active) / tp)


def routed_tokens_per_gpu(ctx: JobContext, d: Dims) -> float:
    """Routed token copies an MoE layer's experts on one GPU process per micro-batch (experts are
    not tensor-split: each TP rank routes its own sequence shard)."""
    moe = ctx.job.model.moe
    assert moe is not None
    tok_gpu = d.micro_batch_size * ctx.job.training.seq_len / d.cp / d.tp
    return tok_gpu * moe.top_k * routing_load(ctx)


def layer_cost(ctx: JobContext, kind: LayerKind, d: Dims, groups: AxisGroups) -> LayerCost:
    cal = ctx.cal
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    s = ctx.job.training.seq_len
    p = kind.params
    tp, cp, ep, b = d.tp, d.cp, d.ep, d.micro_batch_size
    sp_div = tp if d.sequence_parallel else 1
    tokens = b * s / cp  # tokens per GEMM on a TP rank
    # ---- compute (forward) ---------------------------------------------------------------
    t_attn_gemm = gemm_time_s(ctx, kind.attn_proj_flops * tokens / tp, tokens, h, p.attention / (2 * h * tp))
    t_core, t_core_bwd = attention_core_times_s(ctx, kind, d)
    if kind.is_moe:
        moe = model.moe
        assert moe is not None
        tok_gpu = tokens / tp  # experts are not tensor-split: each TP rank routes its own shard
        routed_tokens = routed_tokens_per_gpu(ctx, d)
        t_mlp = max(expert_gemm_times_s(ctx, kind, d))  # host bound when the expert GEMMs are small
        t_mlp += gemm_time_s(ctx, 2 * tok_gpu * p.router, tok_gpu, h, moe.num_experts)
        if p.shared_experts:
            t_mlp += gemm_time_s(ctx, 2 * tokens * p.shared_experts / tp, tokens, h, p.shared_experts / (2 * h * tp))
        ffn_active = moe.top_k * p.routed_expert_each / (3 * h) * tp + p.shared_experts / (3 * h)
    else:
        t_mlp = gemm_time_s(ctx, kind.mlp_flops * tokens / tp, tokens, h, p.mlp_dense / (2 * h * tp))
        ffn_active = p.mlp_dense / (3 * h) if model.activation == "swiglu" else p.mlp_dense / (2 * h)
    elementwise_bytes = elementwise_bytes_fwd(ctx, tokens, tp, sp_div, ffn_active)
    if kind.is_moe:
        elementwise_bytes += router_bytes_fwd(ctx, tokens / tp)
    if ctx.job.training.precision in ("fp8", "fp4"):
        # FP8 (and FP4) GEMM operands are cast from bf16 (scaling amax fused upstream). A block h -> w -> h with P
        # parameters on this GPU has 2h + P/h input+output elements per token (attention: qkv and
        # output projections; MLP: fc1 and fc2, gated or not).
        cast_elems = tokens * (2 * h + p.attention / tp / h)
        if kind.is_moe:
            cast_elems += routed_tokens * (2 * h + p.routed_expert_each / h)
            if p.shared_experts:
                cast_elems += tokens * (2 * h + p.shared_experts / tp / h)
        else:
            cast_elems += tokens * (2 * h + p.mlp_dense / tp / h)
        elementwise_bytes += cal.fp8_cast_bytes * cast_elems
    if not ctx.job.training.fused_kernels:
        elementwise_bytes *= cal.unfused_elementwise_factor
    hbm_bytes_per_s = ctx.hbm_bytes_per_s
    t_elem = elementwise_bytes / hbm_bytes_per_s
    t_perm = routed_tokens * h * PERMUTE_BYTES / hbm_bytes_per_s if kind.is_moe else 0.0
    fwd = t_attn_gemm + t_core + t_mlp + t_elem + t_perm
    bwd = 2.0 * (t_attn_gemm + t_mlp + t_elem) + t_core_bwd + t_perm
    mla_up_kept = model.mla is None or d.recompute not in MLA_UP_RECOMPUTED
    if not mla_up_kept:
        assert model.mla is not None
        q_up, kv_up = ctx.mla_up_params
        heads_local = float(model.num_attention_heads or 0) / tp
        q_in = float(model.mla.q_lora_rank or h)  # the query latent, or the hidden state
        bwd += gemm_time_s(ctx, 2 * tokens * q_up / tp, tokens, heads_local * ctx.d_qk, q_in)
        kv_rank = float(model.mla.kv_lora_rank)
        bwd += gemm_time_s(
            ctx, 2 * tokens * kv_up / tp, tokens, heads_local * (model.mla.qk_nope_head_dim + ctx.d_v), kv_rank
        )
    moe_block = d.recompute == "moe" and kind.is_moe  # the MoE block is re-run in backward
    if d.recompute == "full":
        bwd += fwd
    elif d.recompute in ("selective", "moe"):
        bwd += t_core + t_elem + (t_mlp + t_perm if moe_block else 0.0)
    elif d.recompute == MEGATRON_SELECTIVE:
        bwd += t_core  # the norms and activation functions are not re-run
    elif d.recompute == "op":
        # torchtitan's op-level policy: every second matmul's output is recomputed (half the
        # forward GEMM time), the attention core's is kept
        bwd += 0.5 * (t_attn_gemm + t_mlp) + t_elem + t_perm  # gathers and scatters are not saved
    # ---- communication (each term depends only on its own axis's group) --------------------
    tp_s = tp_comm_s(ctx, kind, d, groups.tp)
    cp_s = cp_comm_s(ctx, d, groups.cp, t_core, t_core_bwd)
    ep_s = ep_comm_s(ctx, kind, d, groups.ep)
    heads = float(model.num_attention_heads or 0)
    kv_width_local = _kv_width_local(ctx, tp)
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
        attn_inner = heads * ctx.d_qk / tp + kv_width_local  # q, and k/v (replicated if tp > kv heads)
        mla_up_out = 0.0
    core_out = heads * ctx.d_v / tp
    gated = model.activation == "swiglu"
    if kind.is_moe:
        moe = model.moe
        assert moe is not None
        f_e = p.routed_expert_each / (3 * h if gated else 2 * h)
        per_routed = h + (2 * f_e if gated else f_e)  # expert input + fc1 output
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
    recomputable = hid + mlp_in + mlp_act_out  # norm outputs and activation-function output
    always = ln_inputs + attn_inner + core_out + mlp_keep
    full_elems = always + recomputable
    if d.recompute == "full":
        stored_elems = hid  # only the layer input
    elif moe_block:
        # the MoE block keeps only its input (never more than what selective keeps)
        stored_elems = always - mlp_keep + min(mlp_keep, mlp_in)
    elif d.recompute == "op" and not kind.is_moe and model.mla is None:
        f_local = p.mlp_dense / (3 * h if gated else 2 * h) / tp
        stored_elems = _op_saved_elems(ctx, d, hid, core_out, f_local, gated)
    elif d.recompute in ("selective", "moe", "op"):
        stored_elems = always  # op on MoE and MLA layers: counted like selective (an upper bound)
    else:  # none, and Megatron's core_attn (which keeps what none keeps but the two below)
        stored_elems = full_elems
    if not mla_up_kept:
        stored_elems -= mla_up_out  # re-made from the latents in backward (still in the working set)
    per_token_bytes = ACT_BYTES * tokens
    stored = stored_elems * per_token_bytes
    working = full_elems * per_token_bytes
    if ctx.attention_kernel == "unfused" and d.recompute not in ATTENTION_CORE_RECOMPUTED:
        # materialised scores, kept for backward unless the attention core is recomputed
        # (Korthikanti et al.'s 5as^2b). Not added to the transient working set of a recomputed
        # layer: Korthikanti et al. count stored activations only, and with it the SC'21 ZeRO-3
        # 530B run that fit on 640 A100 80GB would be predicted 7 GiB over capacity.
        stored += UNFUSED_SCORE_BYTES_STORED * _score_elements(ctx, kind, d)
    # ---- parameters on this GPU --------------------------------------------------------------
    dense, expert = p.on_rank(tp, ep)
    return LayerCost(fwd, bwd, tp_s, cp_s, ep_s, stored, working, dense, expert)


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


def _kv_width_local(ctx: JobContext, tp: int) -> float:
    """K and V elements per token on one TP rank (replicated when tp > KV heads; MLA exchanges
    decompressed K and V)."""
    model = ctx.job.model
    heads = float(model.num_attention_heads or 0)
    kv_heads = float(model.num_kv_heads or 0)
    if model.mla is not None:
        return heads * (ctx.d_qk + ctx.d_v) / tp
    return kv_heads * (ctx.d_qk + ctx.d_v) / min(tp, max(kv_heads, 1.0))


def tp_comm_s(ctx: JobContext, kind: LayerKind, d: Dims, geo: GroupGeometry) -> float:
    """Exposed tensor-parallel collective time of one layer and micro-batch (forward, backward,
    recomputed forward): all-reduces, or reduce-scatter + all-gather with sequence parallelism."""
    if d.tp <= 1:
        return 0.0
    h = float(ctx.job.model.hidden_size or 0)
    tokens = d.micro_batch_size * ctx.job.training.seq_len / d.cp
    per_ar = hierarchical_allreduce_time_s(tokens * h * ACT_BYTES, geo.levels)
    blocks = 1 if kind.is_moe else 2  # attention (+ dense MLP); expert MLPs are not tensor-split
    count: float = 2 * blocks + (blocks if d.recompute == "full" else 0)
    if d.recompute == "op":
        # the op-level policy re-runs the forward collectives it does not save: the all-gathers
        # (half of each RS + AG pair) with sequence parallelism, the all-reduces without
        count += 0.5 * blocks if d.sequence_parallel else blocks
    # GEMM/collective overlap (userbuffers, async TP), when the stack does it: needs sequence
    # parallelism and the group inside one scale-up domain
    overlap = ctx.job.training.tp_comm_overlap and d.sequence_parallel
    in_domain = len(geo.levels) == 1 and geo.outermost_tier == "nvlink"
    hidden = ctx.cal.tp_comm_overlap if overlap and in_domain else 0.0
    return cast(float, count * per_ar * exposed_fraction(ctx, hidden))  # a number for one layout


def exposed_fraction(ctx: JobContext, hidden: float) -> float:
    """Share of a collective's time on the critical path when ``hidden`` of it overlaps compute:
    the overlapped part still delays compute by ``cal.overlap_contention`` (SM and HBM share)."""
    return 1.0 - hidden * (1.0 - ctx.cal.overlap_contention)


def contended(ctx: JobContext, exposed: Num, total: Num) -> Num:
    """Critical-path time of ``total`` seconds of communication of which ``exposed`` is not
    hidden: the hidden rest still costs ``cal.overlap_contention`` of its time (numbers or arrays)."""
    c = ctx.cal.overlap_contention
    return (1.0 - c) * exposed + c * total


def cp_comm_s(ctx: JobContext, d: Dims, geo: GroupGeometry, t_core: float, t_core_bwd: float) -> float:
    """Exposed context-parallel K/V ring time of one layer and micro-batch: ``cp - 1`` steps at
    the slowest tier, forward once and backward twice, hidden behind the attention core
    (``t_core`` forward, ``t_core_bwd`` backward: ``attention_core_times_s``)."""
    if d.cp <= 1 or not geo.levels:
        return 0.0
    cal = ctx.cal
    s = ctx.job.training.seq_len
    chunk = d.micro_batch_size * (s / d.cp) * _kv_width_local(ctx, d.tp) * ACT_BYTES
    slowest = min(lv.beta_bytes_per_s for lv in geo.levels)
    alpha = max(lv.alpha_s for lv in geo.levels)
    ring = (d.cp - 1) * (alpha + chunk / slowest)
    # no ``overlap_contention``: a ring step is a point-to-point send/receive, which NCCL runs on
    # one or two channels per peer (a thread block each), not the 16-32 of a collective
    cp_fwd = max(0.0, ring - cal.cp_overlap * t_core)
    cp_bwd = max(0.0, 2 * ring - cal.cp_overlap * t_core_bwd)
    return cp_fwd + cp_bwd + (cp_fwd if d.recompute in ATTENTION_CORE_RECOMPUTED else 0.0)


def ep_comm_s(ctx: JobContext, kind: LayerKind, d: Dims, geo: GroupGeometry) -> float:
    """Exposed expert-parallel dispatch and combine time of one MoE layer and micro-batch
    (``dispatch.dispatch_time_s`` for the job's ``training.moe_dispatcher``): forward dispatch and
    combine, their bf16 mirrors in backward, and forward again when the block is recomputed
    (``op`` saves the all-to-all outputs). Nothing of it overlaps the same micro-batch's compute
    (Megatron-Core's dispatchers make the compute stream wait for them); batch-level overlap
    (``training.ep_comm_overlap``) hides ``cal.ep_comm_overlap_batched`` of it."""
    if not kind.is_moe or d.ep <= 1:
        return 0.0
    cal = ctx.cal
    moe = ctx.job.model.moe
    assert moe is not None
    training = ctx.job.training
    h = float(ctx.job.model.hidden_size or 0)
    tok_gpu = d.micro_batch_size * training.seq_len / d.cp / d.tp
    fp8 = training.precision in ("fp8", "fp4")
    dispatcher = training.moe_dispatcher
    disp, comb = dispatch_time_s(dispatcher, tok_gpu, h, moe.top_k, geo.levels, fp8, routing_load(ctx))
    # backward sends bf16 gradients both ways: two combine-sized transfers
    total = disp + 3 * comb + (disp + comb if d.recompute in ("full", "moe") else 0.0)
    hidden = cal.ep_comm_overlap_batched if training.ep_comm_overlap else 0.0
    return total * exposed_fraction(ctx, hidden)


def _score_elements(ctx: JobContext, kind: LayerKind, d: Dims) -> float:
    """Attention-score elements of one layer and micro-batch on one GPU (``b a/tp s^2``; the
    unfused kernels compute and store the full square, masked half included; no CP)."""
    if kind.attn_core_flops <= 0:
        return 0.0
    s = ctx.job.training.seq_len
    heads = float(ctx.job.model.num_attention_heads or 0)
    return d.micro_batch_size * heads / d.tp * s * s


def attention_core_times_s(ctx: JobContext, kind: LayerKind, d: Dims) -> tuple[float, float]:
    """Forward and backward attention-core time of one layer and micro-batch.

    Fused (flash) kernels: ``attention_core_time_s`` forward, 2.5x that backward (the scores are
    recomputed). Unfused: the QK^T and PV batched GEMMs at the bf16 GEMM rate of their shapes
    (twice as many GEMMs backward), plus the HBM traffic of the materialised scores."""
    if ctx.attention_kernel != "unfused":
        t = attention_core_time_s(ctx, kind, d)
        return t, 2.5 * t
    elems = _score_elements(ctx, kind, d)
    if elems <= 0:
        return 0.0, 0.0
    cal = ctx.cal
    s = float(ctx.job.training.seq_len)
    bf16_rate = ctx.bf16_peak_flops * ctx.gpu.gemm_efficiency_bf16.value * cal.gemm_training_fraction
    qk = gemm_time_s(ctx, 2.0 * elems * ctx.d_qk, s, s, ctx.d_qk, bf16_rate)
    pv = gemm_time_s(ctx, 2.0 * elems * ctx.d_v, s, ctx.d_v, s, bf16_rate)
    hbm = ctx.hbm_bytes_per_s
    fwd = qk + pv + UNFUSED_SCORE_BYTES_FWD * elems / hbm
    bwd = 2.0 * (qk + pv) + UNFUSED_SCORE_BYTES_BWD * elems / hbm
    return fwd, bwd


def attention_core_time_s(ctx: JobContext, kind: LayerKind, d: Dims) -> float:
    """Forward fused attention-core time of one layer and micro-batch (what CP's ring hides behind)."""
    cal = ctx.cal
    s = ctx.job.training.seq_len
    tokens = d.micro_batch_size * s / d.cp
    q_local = s / d.cp
    attn_eff = ctx.attention_efficiency * q_local / (q_local + cal.attention_seq_half)
    return kind.attn_core_flops * tokens / d.tp / (ctx.bf16_peak_flops * attn_eff)
