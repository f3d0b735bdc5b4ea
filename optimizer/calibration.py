"""The cost model's fitted constants: few, each with a physical meaning and how it was set.

They were fitted to the calibration set of published runs (``benchmarks/validation.py`` prints
the fit; ``docs/validation.md`` records it) and are shared by every GPU, model and layout: there
is no per-model or per-row constant. Catalog numbers (peaks, link rates, measured GEMM and bus
bandwidth fractions) live in ``hardware_catalog/data``; this file only holds what no datasheet
gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.units import GIB, US


@dataclass(frozen=True)
class Calibration:
    # --- compute -------------------------------------------------------------------------
    gemm_training_fraction: float = 0.85
    """Training GEMMs reach this fraction of the catalog's best-shape GEMM efficiency (MAMF):
    real model shapes, clock throttling under sustained load and fused epilogues."""
    power_clock_exponent: float = 0.75
    """Under a power cap ``P < TDP`` sustained tensor-core clocks (and so compute rates) scale as
    ``(P / TDP) ** power_clock_exponent`` (dynamic power ~ f V^2 with V rising with f)."""
    gemm_dim_half: float = 96.0
    """Tile/wave quantisation: a GEMM dimension ``d`` runs at ``d / (d + gemm_dim_half)`` of the
    large-shape rate (the three dimensions multiply)."""
    attention_efficiency: float = 0.32
    """FlashAttention-2-class core kernels (``training.attention_kernel`` flash2, and every GPU
    before Hopper) reach this fraction of the bf16 dense peak at long sequences, forward and
    backward together, on the H100 the calibration rows ran on: 6% below FlashAttention-2's
    published best on H100 (335 TFLOP/s, 0.339). The 2024 long-sequence rows (NeMo, 4k-1M tokens)
    prefer more (0.33), torchtitan's context-parallel rows less; the set's median is smallest at
    0.32 (0.30: 5.3% and 13.1%, 0.32: 4.0% and 13.6%, 0.33: 4.0% and 15.8% with two more rows past 15%). Other GPUs scale it by their
    catalog ``flash2_attention_fraction`` over the H100's (the kernel's published best rate: 0.656
    of peak on A100 against 0.339 on H100, so 0.62 on A100); GPUs with none published keep it
    (``context.attention_efficiency``)."""
    attention_efficiency_flash3: float = 0.6
    """Same for kernels written for Hopper and later (FlashAttention-3, cuDNN fused attention):
    asynchronous warp-group MMA and TMA overlap softmax with the matrix products. FlashAttention-3
    (Shah et al. 2024) reaches 740 TFLOP/s forward (0.75 of the H100's peak) and a backward 1.5-1.75x
    FlashAttention-2's (0.5-0.6 of peak); weighted by their kernel FLOPs (1 : 2.5) that is 0.57-0.64.
    0.6 is also what the Qwen3-235B runs at 16k-128k tokens prefer (Megatron-Core 2025; the
    attention core is 36-82% of their work): 0.55 left them 6-18% slow, 0.6 3-12%."""
    attention_seq_half: float = 1024.0
    """Attention kernels on ``q`` local query tokens per sequence run at ``q / (q + attention_seq_half)``
    of ``attention_efficiency`` (tile quantisation and per-sequence work at short lengths)."""
    hbm_efficiency: float = 0.9
    """Memory-bound kernels (norms, activations, rotary, optimizer step) reach this fraction of
    the HBM bandwidth."""
    elementwise_bytes_per_token_hidden: float = 48.0
    """Bytes moved by memory-bound kernels per token per layer per hidden unit, forward
    (norms, residual adds, rotary, bias-free dropout-free blocks; bf16)."""
    elementwise_bytes_per_token_ffn: float = 8.0
    """Same, per FFN unit (gated activation: read gate and up, write product; bf16)."""
    unfused_elementwise_factor: float = 2.75
    """HBM traffic of memory-bound elementwise work without kernel fusion (``training.fused_kernels``
    false: eager PyTorch) relative to fused kernels: each op reads its inputs and writes its
    output instead of keeping intermediates in registers. Set from the two published pairs of the
    same layout with and without torch.compile (torchtitan Llama 3.1 8B FSDP on 8 and 128 H100,
    measured 1.157x and 1.162x; 2.75 predicts 1.153x and 1.154x)."""
    fp8_cast_bytes: float = 1.5
    """FP8 layers: forward HBM bytes per GEMM input+output element for casting operands from bf16.
    An unfused cast reads 2 B and writes 1 B and forward casts the inputs (about half of the
    elements): 1.5; casts fused into the producing norm/activation kernel cost less. Backward
    (output gradients and transposed inputs) is twice forward, like the other elementwise work."""
    # --- communication -------------------------------------------------------------------
    scale_up_alpha_s: float = 4.0 * US
    """Effective per-step latency of an NVLink/xGMI collective step (NCCL LL128/Simple per-hop
    constants are 1.9-3.4 us plus launch overhead)."""
    tp_comm_overlap: float = 0.25
    """Fraction of tensor-parallel collective time hidden behind GEMMs when the job enables TP
    communication overlap (``training.tp_comm_overlap``). Set from the five published pairs of
    the same layout with and without async TP (torchtitan; measured 1.06-1.16x): 0.25 predicts
    1.05-1.07x and orders every pair; 0.5 would match the mean speed-up. The whole-set fit alone
    prefers 0 (the other rows that use overlap are already over-predicted): with 0.25 the median
    error improves (7.9% -> 7.6%) and p90 worsens (25.1% -> 27.8%). A planner should rather under-
    than over-promise an overlap."""
    dp_overlap: float = 0.9
    """Fraction of the backward (forward for parameter gathers) window that can hide bucketed
    data-parallel communication; the last bucket is always exposed."""
    dp_bucket_bytes: float = 160e6
    """Gradient bucket size (Megatron default: 40 M fp32 elements)."""
    pp_comm_exposed: float = 0.25
    """Fraction of pipeline send/recv time left on the critical path when the stack overlaps it
    (``training.pp_comm_overlap``; all of it otherwise)."""
    ep_load_imbalance: float = 1.0
    """Busiest expert-parallel rank's routed copies / the mean (routing skew). Forced-balance
    routing (random expert choice, as the published runs use) leaves the busiest of ``ep`` ranks
    ``1 + z sqrt(1 / (tokens x top_k))`` of the mean, ``z`` the expected maximum of ``ep`` normal
    deviates: under 2% at thousands of tokens per rank and micro-batch, so 1."""
    ep_comm_overlap_batched: float = 0.4
    """Fraction of the expert dispatch and combine time hidden when the job sets
    ``training.ep_comm_overlap`` (one micro-batch's dispatch runs under another's compute:
    Megatron's combined 1F1B schedule, DualPipe). Without it nothing hides: Megatron-Core's
    dispatchers make the compute stream wait for them (DeepEP's ``async_finish`` is off in
    ``fused_a2a.py``). Set from the Qwen3-235B 256-GPU layout with cross-node EP32 and DeepEP
    measured without and with the overlap (19.7 s and 17.6 s a step, 1.12x): 0.4 predicts 1.16x."""
    scale_out_all_to_all_efficiency: float = 0.7
    """Share of a scale-out link's collective bandwidth (the catalog's ring ``busbw_fraction``)
    that MoE dispatch and combine traffic leaving a node gets, with NCCL's all-to-all and with
    DeepEP's RDMA stage alike. Every rank sends to every other node at once: flows collide at the
    receiving NICs and in the fabric (incast, ECMP collisions), which a ring's neighbour-to-
    neighbour traffic does not see, and an all-to-all cannot spread one GPU's traffic over the
    node's other NICs (NCCL's maintainers in nccl-tests issue 267). Fitted to the calibration
    set's cross-node expert-parallel rows, as each ran (Qwen3-235B EP32 on 256 H100 with DeepEP
    and with NCCL's all-to-all, with and without the 1F1B overlap; DeepSeek-V3 EP64 on 1,024 H100):
    at 1.0 they are predicted 11-25% fast; the set's median and p90 are flat from 0.63 to 0.77
    (``benchmarks/fit_calibration.py``). Expert-parallel groups inside one NVLink domain are not
    affected."""
    expert_gemm_host_s: float = 70.0 * US
    """Host (CPU) time to issue one routed-expert GEMM. Dropless MoE layers size each local
    expert's GEMM from the router's token counts, which the host reads back from the device (a
    synchronisation: Transformer Engine's grouped GEMM takes the splits as a host list), so the
    host cannot run ahead of the GPU there; it then issues each expert's GEMMs in turn. When the
    experts' GEMMs are small (many local experts, few tokens each) the GPU waits for the host:
    the "host-boundedness" of small expert GEMMs that Megatron-Core's MoE report names as one of
    MoE training's three walls, and that device-initiated grouped GEMMs and CUDA graphs remove.
    Set from the Qwen3-235B 256-GPU layouts with 16 local experts and 512 or 1,024 tokens per
    expert GEMM (TP4 EP8 and PP32 EP8, measured 29.0 s and 24.2 s a step, predicted 1.91x and
    1.42x too fast without it, 1% slow and 1.19x fast with it). Over the whole set the fit's
    objective (median + p90 / 2, ``benchmarks/fit_calibration.py``) is smallest at 70 us (4.0%
    and 13.6%; 4.3% and 13.6% at 65 and 75 us): ``benchmarks/grouped_gemm_check.py``.
    Layouts with 2,048 tokens or more per expert
    GEMM are GPU bound or nearly so and move by under 2% (docs/cost-model.md). No published
    measurement gives this time per GEMM: a Transformer Engine grouped linear forward takes
    about 1 ms in a DeepSeek-V2-Lite timeline on 8 H800, mostly host overhead by its
    maintainers' account (expert-parallel size and tokens not stated), the same order;
    ``optimizer/data/grouped_gemm.toml`` ``[host]`` lists what is published."""
    overlap_contention: float = 0.08
    """Fraction of communication time that still delays compute while it is overlapped with it
    (data-parallel buckets and ZeRO-3 gathers, expert all-to-all, TP collectives; not CP's or
    PP's point-to-point sends, which run on one or two channels per peer): the
    collective kernels occupy SMs and HBM bandwidth the GEMMs would use. NCCL runs one thread
    block per channel, 16-32 channels on an 8-GPU H100 node with 8 NICs (12-24% of 132 SMs);
    DeepEP's dispatch and combine take 20-24 of them (DeepSeek-V3 report section 3.2.2; DeepEP
    README). Hidden time ``x`` thus costs ``overlap_contention * x``. Set below the SM share
    because a GEMM slows by less than the SMs it loses while the collective waits on the network;
    0.08 is the largest value that keeps the Qwen3-235B 256-GPU layouts ordered as measured (the
    ZeRO-3 layout's gathers are the first to move); the set's median and p90 are flat from 0 to
    0.15 (benchmarks/fit_calibration.py)."""
    cp_overlap: float = 1.0
    """Ring-attention K/V exchange hides behind attention compute up to this fraction of it."""
    # --- memory --------------------------------------------------------------------------
    cuda_context_bytes: float = 1.0 * GIB
    """CUDA context, cuBLAS/cuDNN workspaces."""
    nccl_buffer_bytes_per_group: float = 0.25 * GIB
    """NCCL channel buffers per communicator a rank joins."""
    fragmentation: float = 0.08
    """Caching-allocator fragmentation, as a fraction of activation and gradient-buffer bytes."""
    memory_headroom_bytes: float = 1.0 * GIB
    """Kept free when judging ``fits_memory``."""


DEFAULT = Calibration()
