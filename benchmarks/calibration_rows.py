"""Map the published-runs calibration set (``benchmarks/data/published_runs.json``) to cost-model inputs.

Each usable row becomes a :class:`MappedRow`: a ``JobSpec`` (model, training, cluster), the layout
fields the source stated (pinned) and a small grid of candidate values for the knobs it did not
state, plus the measured throughput in tokens/s/GPU and which measurement it came from. Rows that
cannot be mapped raise :class:`Unmappable` with the reason; ``map_all`` collects them.

Mapping rules (all applied here and nowhere else):

Model
  - ``num_layers``, ``hidden_size``, ``num_attention_heads`` are required (a row without heads is
    skipped unless ``INFER_MISSING_HEADS``; heads do not change FLOPs when
    ``heads * head_dim = hidden``, only TP divisibility). ``num_kv_heads`` null means MHA.
  - Activation by family: gated SwiGLU for llama / qwen / mixtral / mistral / deepseek families;
    a non-gated two-matrix MLP (``gelu``) for megatron-gpt, mt-nlg, bloom (GeLU) and nemotron
    (squared ReLU, also two matrices).
  - ``ffn_hidden_size`` null: ``4 * hidden`` for non-gated families; the Llama rule
    (``8h/3`` rounded up to 256) for gated ones (``ModelSpec`` default).
  - ``head_dim``: ``hidden / heads``, except Qwen3 (128, its ``config.json``; the row's
    ``hidden / heads`` = 64 would halve the attention projections) and, when ``hidden / heads`` is
    not integral, 128.
  - ``vocab_size`` null: megatron-gpt 51,200 (the GPT-2 BPE vocabulary padded; it reproduces
    Korthikanti et al.'s MFU and the NeMo GPT-3 rows' TFLOP/s from their tokens/s); nemotron3
    256,000 (its SentencePiece vocabulary; reproduces the NeMo Nemotron rows' TFLOP/s to 0.1%).
  - ``tied_embeddings``: tied for megatron-gpt / mt-nlg / bloom, untied otherwise, unless that
    misses the row's ``total_params_b`` by more than 2% and the other choice halves the miss
    (the 2024 Megatron-LM weak-scaling models are untied). It only moves weight memory and the
    LM-head gradient; the LM-head FLOPs run either way.
  - ``attention.sliding_window`` -> ``sliding_window`` (every second layer when the row says the
    windowed layers alternate); attention sinks cost no GEMM work and are not modelled.
  - ``gated_mlp`` when stated decides the activation; ``head_dim`` and ``mla`` are taken as given.
  - ``moe``: ``num_experts``, ``top_k``, ``expert_ffn_hidden_size``, ``shared_experts`` ->
    ``num_shared_experts``, ``moe_layer_freq`` ("all layers" or an integer) -> ``layer_frequency``.

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
    ``dp_collectives`` flat for DeepSpeed ZeRO-3 rows of 2021 (``map_dp_collectives``), else
    hierarchical; ``dp_comm_overlap`` false for the same rows (``map_dp_comm_overlap``), else true;
    ``fused_kernels`` false for torchtitan runs without ``torch.compile``; torchtitan runs keep
    and reduce gradients in fp32 (``grad_reduce_in_fp32``: FSDP2's ``mixed_precision_reduce`` takes
    only float32) and compute the loss with PyTorch's fp32 cross-entropy (``cross_entropy``
    unfused), every other run 16-bit gradients and a fused loss; fp8 runs keep their GEMM inputs
    for backward in fp8 (``fp8_saved_inputs``: Transformer Engine) except torchtitan's (torchao); ``attention_kernel``
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

Layout
  - Stated fields are pinned: ``tp pp cp ep dp vpp micro_batch_size sequence_parallel``;
    ``zero_stage`` from ``zero_stage``, else ``fsdp`` (any degree, or "on") -> 3 (1 for
    torchtitan with pp > 1, whose pipeline schedule keeps FSDP2 weights gathered and gradients
    unsharded for the whole step), else ``distributed_optimizer`` true -> 1 / false -> 0; ``activation_recompute`` phrasings ->
    full / selective / moe / none ("selective (...)" maps to ``selective`` unless its module list
    names ``moe``, Megatron's whole-MoE-block recompute, which maps to ``moe``; torchtitan's
    selective checkpointing is its op-level policy, ``op``).
    ``pipeline_schedule`` "1f1b" pins ``vpp = 1``; "interleaved" excludes ``vpp = 1``.
    When ``pp x vpp`` exceeds the layers and divides ``layers + 2``, the split is Megatron's
    account-for-embedding-and-loss one (the ModelZoo Qwen3-235B PP32 x VPP3 run: 96 chunks of one
    unit, the first holding only the embedding and the last only the output layer and loss).
  - Unstated knobs are searched (the fastest layout that fits memory is kept):
    ``micro_batch_size`` in {1, 2, 4}; ``recompute`` in {none, selective, full} (a Megatron-Bridge
    MoE row takes its release recipe's, ``benchmarks/mbridge_recipes.py``); ``vpp`` (pp > 1)
    in {1} + the divisors of ``layers / pp`` up to 8 (the schedule rule that micro-batches divide
    by pp is checked by the cost model); ``zero_stage`` = 1 (Megatron's distributed optimizer, which
    most of these runs used); ``sequence_parallel`` = ``tp > 1``, except on stacks that predate
    it (sources dated before 2022-05, and Megatron-DeepSpeed), where it is off.
  - When ``micro_batch_size`` is stated but gives fewer micro-batches than pipeline stages (torchtitan
    reports a per-DP-rank "local batch" that its pipeline schedule splits into micro-batches), the
    stated value is taken as the local batch. torchtitan splits it into ``pp x vpp`` micro-batches
    (``pipeline_parallel_microbatches`` unset: one per pipeline stage in total), which fixes the
    micro-batch size; for other stacks it is searched among the local batch's divisors in {1, 2, 4}. If ``grad_accum_steps`` is stated and the micro-batch size is not, it is
    derived as ``global_batch / (dp * grad_accum_steps)``.

Measured throughput (tokens/s/GPU), first available of:
  1. ``tokens_per_sec_per_gpu``; 2. ``tokens_per_sec_total / num_gpus``;
  3. ``global_batch_tokens / step_time_s / num_gpus``;
  4. ``tflops_per_gpu`` (else ``mfu`` x the row's MFU peak) divided by the source's own FLOPs per
     token (:func:`source_flops_per_token`, see its docstring for the three definitions).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.mbridge_recipes import recipe_moe
from optimizer.params import count_params
from optimizer.specs import (
    ClusterSpec,
    EvaluateRequest,
    JobSpec,
    Layout,
    MLAConfig,
    ModelSpec,
    MoEConfig,
    TrainingSpec,
)

DATA_PATH = Path(__file__).resolve().parent / "data" / "published_runs.json"

INFER_MISSING_HEADS = True
"""If True, a row without ``num_attention_heads`` gets ``hidden / 128`` heads instead of being skipped."""

MBS_GRID: tuple[int, ...] = (1, 2, 4)
RECOMPUTE_GRID: tuple[str, ...] = ("none", "selective", "full")
MAX_VPP = 8
DEFAULT_ZERO_STAGE = 1
SP_INTRODUCED = "2022-05"
"""Sequence parallelism appeared with Korthikanti et al. (arXiv 2205.05198); earlier runs had none."""

GATED_FAMILIES = ("llama", "qwen", "mixtral", "mistral", "deepseek")
NON_GATED_FAMILIES = ("megatron-gpt", "mt-nlg", "bloom", "nemotron", "gpt")
TIED_BY_DEFAULT = ("megatron-gpt", "mt-nlg", "bloom")
FAMILY_VOCAB = {"megatron-gpt": 51200, "nemotron3": 256000}
FAMILY_HEAD_DIM = {"qwen3": 128}
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
LAYOUT_KNOBS = (
    "tp",
    "pp",
    "cp",
    "ep",
    "dp",
    "vpp",
    "micro_batch_size",
    "zero_stage",
    "recompute",
    "sequence_parallel",
)


class Unmappable(Exception):
    """A row that cannot be turned into a cost-model request; the message says why."""


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


# ---------------------------------------------------------------------------------------- model


def _family(row: dict[str, Any]) -> str:
    m = row["model"]
    return f"{m.get('family') or ''} {m.get('name') or ''}".lower()


def activation_for(row: dict[str, Any]) -> str:
    """The row's ``gated_mlp`` flag when stated, else the family rule."""
    gated = row["model"].get("gated_mlp")
    if gated is not None:
        return "swiglu" if gated else "gelu"
    fam = _family(row)
    if any(f in fam for f in GATED_FAMILIES):
        return "swiglu"
    if any(f in fam for f in NON_GATED_FAMILIES):
        return "gelu"
    fam = row["model"].get("family")
    raise Unmappable(f"activation of family {fam!r} unknown (no gated / non-gated rule)")


DENSE_THEN_MOE = re.compile(r"^\(?\s*\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\s*\)?$")
"""Megatron's ``--moe-layer-freq`` pattern ``([0]*k+[1]*n)``: ``k`` dense layers, then MoE layers."""


def _moe(block: dict[str, Any]) -> MoEConfig:
    freq = block.get("moe_layer_freq", block.get("layer_frequency", 1))
    first_dense = int(block.get("first_dense_layers") or block.get("first_k_dense") or 0)
    pattern = DENSE_THEN_MOE.match(freq.replace(" ", "")) if isinstance(freq, str) else None
    if pattern:
        first_dense, freq = int(pattern.group(1)), 1
    if freq is None or (isinstance(freq, str) and "all" in freq.lower()):
        freq = 1
    try:
        freq = int(freq)
    except (TypeError, ValueError) as exc:
        raise Unmappable(f"moe_layer_freq {freq!r} not understood") from exc
    return MoEConfig(
        num_experts=int(block["num_experts"]),
        top_k=int(block["top_k"]),
        expert_ffn_hidden_size=int(block["expert_ffn_hidden_size"]),
        num_shared_experts=int(block.get("shared_experts") or block.get("num_shared_experts") or 0),
        shared_expert_ffn_hidden_size=block.get("shared_expert_ffn_hidden_size"),
        layer_frequency=freq,
        first_dense_layers=first_dense,
    )


def _sliding_window(attn: dict[str, Any]) -> dict[str, int]:
    """``model.attention``'s window (``sliding_window``) and which layers use it ("every second
    layer" -> ``sliding_window_every`` 2, else every layer)."""
    if not attn.get("sliding_window"):
        return {}
    layers = str(attn.get("sliding_window_layers") or "").lower()
    every = 2 if "every second" in layers or "alternat" in layers else 1
    return {"sliding_window": int(attn["sliding_window"]), "sliding_window_every": every}


def map_model(row: dict[str, Any]) -> tuple[ModelSpec, list[str]]:
    m = row["model"]
    notes: list[str] = []
    layers, hidden, heads = m.get("num_layers"), m.get("hidden_size"), m.get("num_attention_heads")
    if layers is None or hidden is None:
        raise Unmappable("architecture not stated (num_layers / hidden_size null)")
    if heads is None:
        if not INFER_MISSING_HEADS:
            raise Unmappable("num_attention_heads not stated")
        heads = max(1, hidden // 128)
        notes.append(f"heads not stated: {heads} assumed (hidden/128)")
    fam = (m.get("family") or "").lower()
    activation = activation_for(row)
    ffn = m.get("ffn_hidden_size")
    if ffn is None and activation == "gelu":
        ffn = 4 * hidden
        notes.append("ffn = 4h (not stated)")
    head_dim = m.get("head_dim") or next((d for f, d in FAMILY_HEAD_DIM.items() if fam.startswith(f)), None)
    if head_dim is None and hidden % heads:
        head_dim = 128
        notes.append("hidden/heads not integral: head_dim 128 assumed")
    vocab = m.get("vocab_size")
    if vocab is None:
        vocab = next((v for f, v in FAMILY_VOCAB.items() if fam.startswith(f)), None)
        if vocab is None:
            raise Unmappable(f"vocab_size not stated and no default for family {fam!r}")
        notes.append(f"vocab {vocab} assumed (family default)")
    moe = _moe(m["moe"]) if m.get("moe") else None
    mla = MLAConfig(**{k: m["mla"][k] for k in MLA_FIELDS if k in m["mla"]}) if m.get("mla") else None
    if mla is not None:
        head_dim = None  # MLA sets its own per-head dimensions
    base = {
        "name": m.get("name") or row["id"],
        "num_layers": layers,
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_kv_heads": m.get("num_kv_heads"),
        "head_dim": head_dim,
        "vocab_size": vocab,
        "activation": activation,
        "moe": moe,
        "mla": mla,
        **_sliding_window(m.get("attention") or {}),
    }
    try:
        tied = ModelSpec(**base, tied_embeddings=True)
        untied = ModelSpec(**base, tied_embeddings=False)
    except ValueError as exc:
        raise Unmappable(f"model fields rejected: {exc}") from exc
    default_tied = any(fam.startswith(f) for f in TIED_BY_DEFAULT)
    model, other = (tied, untied) if default_tied else (untied, tied)
    stated_b = m.get("total_params_b")
    if stated_b:
        err = abs(count_params(model).total / 1e9 - stated_b) / stated_b
        err_other = abs(count_params(other).total / 1e9 - stated_b) / stated_b
        if err > 0.02 and err_other < err / 2:
            model, err = other, err_other
            tie = "tied" if model.tied_embeddings else "untied"
            notes.append(f"{tie} embeddings (matches {stated_b}B)")
        if err > 0.10:
            notes.append(f"params {count_params(model).total / 1e9:.1f}B vs stated {stated_b}B")
    return model, notes


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
    ``training.dp_comm_overlap`` false, which means exactly that for ZeRO-3. Every other stack in
    the set overlaps both (Megatron's overlapped gradient reduction and parameter gather, FSDP2)."""
    return map_dp_collectives(row) != "flat"


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


# ---------------------------------------------------------------------------------------- layout


def map_expert_tp(row: dict[str, Any], tp: int, ep: int) -> int | None:
    """The row's expert tensor parallelism: as stated; else its stack's value. Megatron-Core
    shards experts over ``tensor_model_parallel_size`` unless told otherwise (``arguments.py``:
    ``--expert-tensor-parallel-size`` defaults to ``--tensor-model-parallel-size``; before
    expert parallel folding, Nov. 2024, experts always split over the TP group), so a recipe that
    names no expert TP (the DGX Cloud NeMo 24.11 Grok-1 YAML) runs ``etp = tp``. The
    Megatron-Bridge performance configs and the Megatron-MoE model zoo set
    ``expert_tensor_parallel_size = 1`` (``qwen3_workload_base_configs.py``,
    ``deepseek_workload_base_configs.py``, ``gpt_oss_workload_base_configs.py``; the zoo's
    YAMLs): 1 there. None for dense rows (no experts)."""
    cfg = row["config"]
    if cfg.get("etp") is not None:
        return int(cfg["etp"])
    if ep <= 1 and row["model"].get("type") != "moe":
        return None
    source = row["id"].split("-")[0]
    return 1 if source in ("mbridge", "modelzoo") or is_torchtitan(row) else tp


def _divisors_up_to(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def layout_space(row: dict[str, Any], job: JobSpec) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]], list[str]]:
    """(pinned fields, grid of unstated knobs, notes)."""
    cfg = row["config"]
    notes: list[str] = []
    if cfg.get("tp") is None or cfg.get("pp") is None:
        raise Unmappable("tp / pp not stated")
    fixed: dict[str, Any] = {"tp": int(cfg["tp"]), "pp": int(cfg["pp"])}
    fixed["cp"] = int(cfg.get("cp") or 1)
    fixed["ep"] = int(cfg.get("ep") or 1)
    etp = map_expert_tp(row, fixed["tp"], fixed["ep"])
    if etp is not None:
        fixed["etp"] = etp
        if row["config"].get("etp") is None and etp > 1:
            notes.append(f"expert TP {etp} = TP (not stated; Megatron-Core's default)")
    if cfg.get("dp") is not None:
        fixed["dp"] = int(cfg["dp"])
    grid: dict[str, tuple[Any, ...]] = {}
    tp, pp = fixed["tp"], fixed["pp"]
    layers = job.model.num_layers or 0
    gbs = job.training.global_batch_size or 0
    dp = fixed.get("dp") or max(1, job.cluster.num_gpus // (tp * pp * fixed["cp"]))

    # micro-batch size
    local_batch = 0
    mbs = cfg.get("micro_batch_size")
    if mbs is not None:
        mbs = int(mbs)
        if pp > 1 and gbs // max(1, dp * mbs) < pp:
            if is_torchtitan(row):
                local_batch = mbs  # set below from the virtual stages (torchtitan's default split)
            else:
                grid["micro_batch_size"] = tuple(v for v in MBS_GRID if v <= mbs and mbs % v == 0)
                notes.append(f"stated micro-batch {mbs} is the per-DP-rank batch (m < pp): searched")
        else:
            fixed["micro_batch_size"] = mbs
    elif cfg.get("grad_accum_steps") and gbs % (dp * int(cfg["grad_accum_steps"])) == 0:
        fixed["micro_batch_size"] = gbs // (dp * int(cfg["grad_accum_steps"]))
        notes.append("micro-batch = gbs / (dp x grad-accum)")
    else:
        grid["micro_batch_size"] = MBS_GRID

    # recompute
    rc = map_recompute(cfg.get("activation_recompute"))
    recipe = recipe_moe(row)
    if rc is None and recipe is not None and recipe.recompute is not None:
        fixed["recompute"] = recipe.recompute
        notes.append(f"recompute {recipe.recompute!r}: the release's Megatron-Bridge recipe")
    elif rc is None:
        grid["recompute"] = RECOMPUTE_GRID
    elif rc == "selective" and is_torchtitan(row):
        # torchtitan's selective checkpointing is its op-level policy (llama3 train configs:
        # selective_ac_option = "op")
        fixed["recompute"] = "op"
    else:
        fixed["recompute"] = rc
        text = str(cfg.get("activation_recompute"))
        if rc == "selective" and "(" in text and "attention" not in text:
            notes.append(f"recompute '{text}' modelled as selective (attention core)")

    # virtual pipeline
    schedule = (cfg.get("pipeline_schedule") or "").lower()
    if cfg.get("vpp") is not None:
        fixed["vpp"] = int(cfg["vpp"])
    elif pp == 1 or schedule and "interleav" not in schedule:
        fixed["vpp"] = 1
    else:
        cands = _divisors_up_to(layers // pp, MAX_VPP) if layers % pp == 0 else [1]
        if "interleav" in schedule:
            cands = [v for v in cands if v > 1] or [2]
        grid["vpp"] = tuple(cands)

    vpp = fixed.get("vpp", 1)
    if pp * vpp > layers and (layers + 2) % (pp * vpp) == 0:
        fixed["stage_layers"] = account_for_embedding_and_loss_split(layers, pp * vpp)
        notes.append(
            f"pp x vpp ({pp * vpp}) exceeds the {layers} layers: the embedding and the loss count as a "
            "layer each (Megatron's --account-for-embedding/loss-in-pipeline-split)"
        )

    if local_batch:
        # torchtitan splits the per-DP-rank batch into as many micro-batches as there are pipeline
        # stages in total (``pipeline_parallel_microbatches`` unset: pp x stages per rank)
        vpps = [v for v in grid.get("vpp", (fixed.get("vpp", 1),)) if local_batch % (pp * v) == 0]
        if not vpps:
            raise Unmappable(f"local batch {local_batch} does not split into pp x vpp micro-batches")
        if len(vpps) > 1:
            # one micro-batch size per vpp: keep the largest vpp (the schedule's own choice is
            # not stated; a grid over vpp alone would pair it with the wrong micro-batch size)
            notes.append(f"vpp not stated: {max(vpps)} of {vpps} kept, micro-batch size follows it")
        if "vpp" in grid:
            grid["vpp"] = (max(vpps),)  # still marked as chosen, not stated
        fixed["micro_batch_size"] = local_batch // (pp * max(vpps))
        notes.append(
            f"stated batch {local_batch} is torchtitan's per-DP-rank batch, split into pp x vpp "
            "micro-batches (its default pipeline_parallel_microbatches)"
        )

    # optimizer sharding
    zero = map_zero_stage(cfg)
    if zero == 3 and pp > 1 and is_torchtitan(row):
        # PyTorch's pipeline schedule keeps FSDP2 weights gathered and gradients unsharded until a
        # step's last backward (torchtitan's FSDP with PP runs as ZeRO-1; docs/launch.md)
        zero = 1
        notes.append("FSDP under torchtitan's pipeline schedule runs as ZeRO-1 (weights gathered all step)")
    if zero is None:
        grid["zero_stage"] = (DEFAULT_ZERO_STAGE,)
    else:
        fixed["zero_stage"] = zero

    sp = cfg.get("sequence_parallel")
    if sp is not None:
        fixed["sequence_parallel"] = bool(sp)
    elif tp > 1 and _predates_sequence_parallel(row):
        fixed["sequence_parallel"] = False
        notes.append("no sequence parallelism (the stack predates it)")
    else:
        fixed["sequence_parallel"] = tp > 1
    return fixed, grid, notes


def account_for_embedding_and_loss_split(layers: int, chunks: int) -> list[int]:
    """Megatron's split with ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``: ``layers + 2`` units spread evenly over the chunks,
    the first unit the embedding and the last the output layer and loss."""
    units = layers + 2
    if units % chunks:
        raise Unmappable(f"{layers} layers + embedding + loss do not split evenly over {chunks} chunks")
    split = [units // chunks] * chunks
    split[0] -= 1
    split[-1] -= 1
    return split


def _predates_sequence_parallel(row: dict[str, Any]) -> bool:
    """Runs on stacks without sequence parallelism: sources dated before Korthikanti et al.
    (2022-05) and Megatron-DeepSpeed (BLOOM)."""
    src = row.get("source", {})
    date = str(src.get("date") or "9999")
    text = json.dumps(src).lower() + " " + str(row["config"].get("other") or "").lower()
    return date < SP_INTRODUCED or "megatron-deepspeed" in text or "bigscience" in text


# ---------------------------------------------------------------------------------------- FLOPs


def source_flops_per_token(model: ModelSpec, seq: int, *, causal: bool, recompute_factor: float = 1.0) -> float:
    """FLOPs per token (forward + backward) the way Megatron-family sources count them.

    The generalised Megatron-LM ``num_floating_point_operations`` (Narayanan et al. 2021, appendix;
    GQA, gated MLP and MoE terms), per token, summed over layers::

        attention projections   6 * (h * (q + 2 kv) + q * h)       q = heads*d, kv = kv_heads*d
        attention core          12 * q * s   (x 1/2 when ``causal``)
        MLP                     6 * m * h * f       m = 3 gated, 2 non-gated (MoE: top_k experts
                                                    of width expert_ffn, plus shared experts)
        logits                  6 * h * V            (once, not per layer)

    For GPT with a 4h GeLU MLP and MHA this is ``72 L h^2 (1 + s/(6h) + V/(12 L h))`` per token.
    ``recompute_factor`` multiplies the layer terms only: 4/3 gives the hardware-FLOP count of
    full activation recompute that SC'21, MT-NLG and BLOOM report,
    ``96 L h^2 (1 + s/(6h) + V/(16 L h))`` per token (the logit layer is not recomputed).

    The three definitions used (``flop_definition``): SC'21 / MT-NLG / BLOOM hardware TFLOP/s:
    non-causal, factor 4/3; Megatron-LM README 2024 and NeMo 24.x model TFLOP/s: non-causal, 1;
    Megatron-Core 2025 (Megatron-MoE-ModelZoo): causal, 1. Rows that report both TFLOP/s and
    tokens/s reproduce these to within 1-2% (``benchmarks/validation.py`` prints the check).
    """
    if model.mla is not None:
        raise Unmappable("FLOP conversion for MLA models not implemented")
    h = float(model.hidden_size or 0)
    d = float(model.head_dim or 0)
    q = (model.num_attention_heads or 0) * d
    kv = (model.num_kv_heads or 0) * d
    mult = 3.0 if model.activation == "swiglu" else 2.0
    attn = 6.0 * (h * (q + 2 * kv) + q * h) + 12.0 * q * seq * (0.5 if causal else 1.0)
    total_layers = 0.0
    for i in range(model.num_layers or 0):
        if model.moe is not None and model.is_moe_layer(i):
            moe = model.moe
            shared_f = moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size
            width = moe.top_k * moe.expert_ffn_hidden_size + moe.num_shared_experts * shared_f
            mlp = 6.0 * mult * h * width
        else:
            mlp = 6.0 * mult * h * float(model.ffn_hidden_size or 0)
        total_layers += attn + mlp
    return recompute_factor * total_layers + 6.0 * h * float(model.vocab_size or 0)


def flop_definition(row: dict[str, Any]) -> tuple[bool, float, str]:
    """(causal attention, recompute factor, label) of the row's reported TFLOP/s."""
    kind = (row["measured"].get("tflops_kind") or "").lower()
    src = json.dumps(row.get("source", {})).lower()
    if "hardware" in kind:
        rc = map_recompute(row["config"].get("activation_recompute")) or "full"
        factor = 4.0 / 3.0 if rc == "full" else 1.0
        label = "hardware FLOPs, 96-factor (full recompute counted)" if rc == "full" else "hardware FLOPs"
        return False, factor, label
    if "modelzoo" in src or "moe-modelzoo" in src:
        return True, 1.0, "Megatron-Core model FLOPs, causal attention"
    return False, 1.0, "Megatron model FLOPs, 72-factor (non-causal attention)"


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
            ep_comm_overlap=map_ep_comm_overlap(row),
            fused_kernels=map_fused_kernels(row),
            attention_kernel=map_attention_kernel(row),  # type: ignore[arg-type]
            pp_comm_overlap=map_pp_comm_overlap(row),
            dp_collectives=map_dp_collectives(row),  # type: ignore[arg-type]
            dp_comm_overlap=map_dp_comm_overlap(row),
            moe_dispatcher=map_moe_dispatcher(row),  # type: ignore[arg-type]
            # padded to capacity 1.0 (the host still issues every expert's GEMMs in turn)
            moe_capacity_factor=1.0 if token_drop else None,
            # torchtitan: FSDP2 reduces in float32 only, and PyTorch's cross_entropy on fp32 logits
            grad_reduce_in_fp32=titan,
            cross_entropy="unfused" if titan else "fused",
            # torchao's float8 linears keep their 16-bit inputs, Transformer Engine's the fp8 ones
            fp8_saved_inputs=not titan,
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
    "flop_definition",
    "load_rows",
    "map_all",
    "map_row",
    "measured_throughput",
    "source_flops_per_token",
]
