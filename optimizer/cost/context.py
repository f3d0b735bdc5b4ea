"""Per-job facts the cost model needs, computed once per request (model, hardware, tiers)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from hardware_catalog.loader import Catalog
from hardware_catalog.schema import GpuEntry, NetworkEntry
from optimizer.calibration import DEFAULT, Calibration
from optimizer.cost.caches import Caches
from optimizer.cost.flops import ModelFlops, attention_dims, layer_flops, model_flops
from optimizer.cost.gpu_rates import gemm_efficiency_of, gemm_peak_and_efficiency, power_clock
from optimizer.cost.node_tiers import node_topology
from optimizer.cost.topology import Topology, build_topology
from optimizer.framework_runs import (
    costed_fsdp_buffers,
    costed_fsdp_unit_scales,
    costed_kv_expanded,
    costed_p2p_blocks_without_vpp,
    costed_pp_inside_dp,
)
from optimizer.modes import FLASH3_GENERATIONS
from optimizer.params import (
    LayerParams,
    embedding_params,
    layer_params,
    lm_head_params,
    mla_up_projection_params,
)
from optimizer.rank_orders import framework_orders
from optimizer.reference import ReferenceData, current
from optimizer.specs import JobSpec
from optimizer.units import gib_to_bytes

HALF_GRAD_BYTES = 2.0
"""A gradient kept and reduced in the 16-bit training dtype (bf16 / fp16)."""
FP32_GRAD_BYTES = 4.0
"""A gradient kept and reduced in fp32 (``training.grad_reduce_in_fp32``)."""
LOGIT_BYTES = {"fused": 6.0, "unfused": 12.0}
"""Bytes per logit (vocabulary entry of a token) the loss holds at its peak
(``training.cross_entropy``). fused: the bf16 logits and one fp32 softmax buffer that the
gradient reuses (Megatron-Core's vocab-parallel cross-entropy). unfused: PyTorch's cross_entropy
on logits cast to fp32 keeps the fp32 log-probabilities for backward, where the fp32 gradients of
those and of the logits are made next to them (torchtitan frees the bf16 logits first)."""
LOSS_PARALLEL_LOGIT_BYTES = 16.0
"""Bytes per logit PyTorch's cross-entropy holds on vocabulary-sharded logits (tensor parallel,
``loss_parallel``, torchtitan's default with TP): its backward
(``torch/distributed/tensor/parallel/loss.py`` ``_nll_loss_and_log_softmax_backward``) keeps the
fp32 log-probabilities saved by forward next to ``grad_input = zeros_like(x)``, ``exp(x)`` and
their sum (then their product with the output gradient), four fp32 values a logit; its forward
peaks at 14 (the bf16 logits, their fp32 copy, the shifted values and the result)."""


@dataclass(frozen=True)
class LayerKind:
    """One distinct layer type of the model (dense, MoE, leading dense with its own FFN)."""

    params: LayerParams
    attn_proj_flops: float
    attn_core_flops: float
    mlp_flops: float
    is_moe: bool


@dataclass(frozen=True)
class JobContext:
    job: JobSpec
    gpu: GpuEntry
    network: NetworkEntry
    topology: Topology
    cal: Calibration
    kinds: tuple[LayerKind, ...]
    layer_kind: tuple[int, ...]
    """Index into ``kinds`` of each layer, in model order."""
    kind_prefix: tuple[tuple[int, ...], ...]
    """``kind_prefix[k][i]``: layers of kind ``k`` among the first ``i`` layers."""
    flops: ModelFlops
    embedding_params: int
    lm_head_params: int
    d_qk: int
    d_v: int
    mla_up_params: tuple[int, int]
    """MLA up-projection parameters per layer (query, key/value; ``params.mla_up_projection_params``)."""
    gemm_peak_flops: float
    gemm_efficiency: float
    """Fraction of ``gemm_peak_flops`` large training GEMMs reach: ``gemm_efficiency_of`` x the
    calibration's ``gemm_training_fraction``."""
    bf16_gemm_efficiency: float
    """The same at bf16 (the unfused attention's batched GEMMs run in bf16 whatever the precision)."""
    bf16_peak_flops: float
    mfu_peak_flops: float
    """Dense peak at the training precision (the MFU denominator)."""
    attention_kernel: str
    """The attention kernel class costed (``attention_kernel_class``)."""
    attention_efficiency: float
    """Fraction of the bf16 peak the fused attention-core kernels reach at long sequences (kernel
    class from ``training.attention_kernel`` and the GPU generation; unused for 'unfused')."""
    capacity_bytes: float
    """Usable device memory (catalog, or the cluster's ``gpu_memory_gib`` override)."""
    hbm_bytes_per_s: float
    """HBM bandwidth memory-bound kernels reach (catalog bandwidth x ``hbm_efficiency``)."""
    fsdp_buffers: str = "megatron-fsdp"
    """The ZeRO-2/3 buffers charged (``frameworks.costed_fsdp_buffers``)."""
    kv_expanded: bool = False
    """Whether attention keeps key/value heads expanded to the query heads (``costed_kv_expanded``)."""
    pp_inside_dp: str = "never"
    """Which layouts may be costed with pipeline stages inside data parallelism
    (``costed_pp_inside_dp``: the rule of ``optimizer/rank_orders.py`` of the frameworks targeted)."""
    p2p_blocks_without_vpp: bool = False
    """Whether pipeline sends block in non-interleaved schedules whatever ``pp_comm_overlap`` says
    (``costed_p2p_blocks_without_vpp``)."""
    fsdp_unit_scales: bool = True
    """Whether Megatron-FSDP's communication unit grows with the layers (``costed_fsdp_unit_scales``)."""
    caches: Caches = field(default_factory=Caches, compare=False, hash=False, repr=False)
    """This request's cache tables of the cost model and the search (``cost.caches``): new and
    empty for every ``build_context`` call."""

    def rank_orders(self, sizes: dict[str, int]) -> list[tuple[str, ...]]:
        """The rank orders a layout of ``sizes`` is costed in (``rank_orders.framework_orders``)."""
        return framework_orders(sizes, self.pp_inside_dp, self.job.model.moe is not None)

    @property
    def num_gpus(self) -> int:
        return self.job.cluster.resolved_num_gpus

    @property
    def dp_overlap(self) -> float:
        """Fraction of the compute window data-parallel collectives can hide behind: the
        calibration's ``dp_overlap`` when the stack overlaps them (``training.dp_comm_overlap``),
        else none (every collective blocks)."""
        return self.cal.dp_overlap if self.job.training.dp_comm_overlap else 0.0

    @property
    def grad_bytes(self) -> float:
        """Bytes of one gradient element, kept and reduced: fp32 when the stack does so
        (``training.grad_reduce_in_fp32``), else the 16-bit training dtype."""
        return FP32_GRAD_BYTES if self.job.training.grad_reduce_in_fp32 else HALF_GRAD_BYTES

    @property
    def logit_bytes(self) -> float:
        """Bytes the loss holds per logit at its peak (``training.cross_entropy``)."""
        return LOGIT_BYTES[self.job.training.cross_entropy]

    def loss_bytes_per_logit(self, tp: int) -> float:
        """Bytes the loss holds per logit at its peak on a ``tp``-way split vocabulary: PyTorch's
        unfused cross-entropy runs as ``loss_parallel`` on sharded logits, else ``logit_bytes``."""
        unfused = self.job.training.cross_entropy == "unfused"
        return LOSS_PARALLEL_LOGIT_BYTES if unfused and tp > 1 else self.logit_bytes

    def expert_overlap(self, ep: int) -> bool:
        """Whether the expert all-to-all overlap (``training.ep_comm_overlap``: Megatron's combined
        1F1B with deferred weight gradients) runs on a layout with ``ep``: an MoE job with ep > 1."""
        return self.job.training.ep_comm_overlap and self.job.model.moe is not None and ep > 1

    def headroom_bytes(self, requested: float | None) -> float:
        """Memory kept free per GPU: the request's ``search.memory_headroom_gib`` when given (in
        bytes), else the calibration's default."""
        return self.cal.memory_headroom_bytes if requested is None else requested

    def usable_bytes(self, requested_headroom: float | None) -> float:
        """Memory a layout may use per GPU: the capacity less ``headroom_bytes``."""
        return self.capacity_bytes - self.headroom_bytes(requested_headroom)


def attention_kernel_class(job: JobSpec, gpu: GpuEntry) -> str:
    """The attention kernel class a job runs: what it asks for, capped by what the GPU has."""
    kernel = job.training.attention_kernel
    if kernel == "flash3" and gpu.generation not in FLASH3_GENERATIONS:
        return "flash2"
    return kernel


FLASH2_CALIBRATION_GPU = "h100-sxm-80gb"
"""The GPU of the published runs that set ``Calibration.attention_efficiency`` (torchtitan and NeMo
runs with FlashAttention-2-class kernels, all on H100)."""


def attention_efficiency(cal: Calibration, gpu: GpuEntry, kernel: str, catalog: Catalog) -> float:
    """Fraction of the bf16 peak the fused attention-core kernels of class ``kernel`` reach on
    ``gpu`` at long sequences. FlashAttention-2-class kernels reach a different fraction of each
    GPU's peak (they use no Hopper instructions: 73% of peak forward on A100, 34% forward and
    backward on H100): ``attention_efficiency`` scaled by the GPU's catalog fraction over that of
    ``FLASH2_CALIBRATION_GPU``; a GPU with no published fraction keeps it."""
    if kernel == "flash3":
        return cal.attention_efficiency_flash3
    own, ref = gpu.flash2_attention_fraction, catalog.gpus[FLASH2_CALIBRATION_GPU].flash2_attention_fraction
    if own is None or ref is None:
        return cal.attention_efficiency
    return cal.attention_efficiency * own.value / ref.value


def build_context(job: JobSpec, cal: Calibration = DEFAULT) -> JobContext:
    """The context of ``job`` under ``cal``, with new, empty caches (``JobContext.caches``): build
    it once per request (one search, one evaluation) and pass it down. The job's facts are
    computed once per (job, calibration) and shared between calls (``_build_context_cached``);
    they are immutable, so only the caches need to be new. The GPU and network numbers come from
    the current reference data (``optimizer.reference.current``)."""
    key = job.model_dump_json(exclude={"costs", "reliability"})  # prices and failures: capacity's, not costs'
    return replace(_build_context_cached(key, cal, current()), caches=Caches())


def clear_context_cache() -> None:
    """Forget every cached context, so the next ``build_context`` computes from scratch."""
    _build_context_cached.cache_clear()


@lru_cache(maxsize=256)
def _build_context_cached(job_json: str, cal: Calibration, reference: ReferenceData) -> JobContext:
    """The facts of the job ``job_json`` under ``cal``: model, hardware, tiers, layer kinds, peaks.

    Reads: ``model`` (every architecture field: layers, sizes, heads, MoE, MLA, vocabulary),
    ``training.seq_len``, ``precision`` and ``attention_kernel``, and ``cluster`` (GPU, network,
    GPU count or nodes, node / NVLink / NIC sizes, leaf span, oversubscription, power limit,
    memory override); the catalog of ``reference`` (the current reference data); ``cal``.
    And it keeps the job itself (``JobContext.job``), from which the cost model reads the rest
    of ``training`` per layout.

    Cache key: the ``JobSpec`` as JSON (``model``, ``training`` and ``cluster``, every field
    with its default filled in; not ``costs`` and ``reliability``, which only the capacity model
    reads, from the request: ``JobContext.job`` has their defaults; a request's ``search`` section
    is not part of it either) and the
    calibration (a frozen dataclass, hashed by value) and the reference data (by identity). That is everything above, so it is safe:
    two calls share a context only when every field of their jobs is equal, and jobs that differ
    in a field nothing reads only miss the cache. Kept whole rather than narrowed to the fields
    above because the context hands on the job, so a narrower key would go stale as soon as a
    cost reads a new field of it. The caches of the context kept here are never handed out:
    ``build_context`` gives each call its own."""
    job = JobSpec.model_validate_json(job_json)
    cat = reference.catalog
    c = job.cluster
    assert c.gpu and c.network
    gpu = cat.gpus[c.gpu]
    network = cat.networks[c.network]
    topology = _topology(job, gpu, network, cal)
    model = job.model
    seq = job.training.seq_len
    kinds, layer_kind = _layer_kinds(job)
    d_qk, d_v = attention_dims(model)
    gemm_peak, eff = gemm_peak_and_efficiency(job, gpu)
    bf16 = gpu.bf16_dense_flops.value
    clock = power_clock(job, gpu, cal)
    kernel = attention_kernel_class(job, gpu)
    return JobContext(
        job=job,
        gpu=gpu,
        network=network,
        topology=topology,
        cal=cal,
        kinds=kinds,
        layer_kind=layer_kind,
        kind_prefix=tuple(
            tuple(sum(1 for x in layer_kind[:i] if x == k) for i in range(len(layer_kind) + 1))
            for k in range(len(kinds))
        ),
        flops=model_flops(model, seq),
        embedding_params=embedding_params(model),
        lm_head_params=lm_head_params(model),
        d_qk=d_qk,
        d_v=d_v,
        mla_up_params=mla_up_projection_params(model),
        gemm_peak_flops=gemm_peak * clock,
        gemm_efficiency=eff * cal.gemm_training_fraction,
        bf16_gemm_efficiency=gemm_efficiency_of(job, gpu, low_bit=False) * cal.gemm_training_fraction,
        bf16_peak_flops=bf16 * clock,
        mfu_peak_flops=gemm_peak,  # MFU is always against the datasheet dense peak
        attention_kernel=kernel,
        attention_efficiency=attention_efficiency(cal, gpu, kernel, cat),
        capacity_bytes=gib_to_bytes(c.gpu_memory_gib) if c.gpu_memory_gib else gpu.memory_usable_bytes.value,
        hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s.value * cal.hbm_efficiency,
        fsdp_buffers=costed_fsdp_buffers(job.training, model),
        kv_expanded=costed_kv_expanded(job.training, model),
        pp_inside_dp=costed_pp_inside_dp(job.training, model),
        p2p_blocks_without_vpp=costed_p2p_blocks_without_vpp(job.training, model),
        fsdp_unit_scales=costed_fsdp_unit_scales(job.training, model),
    )


def _topology(job: JobSpec, gpu: GpuEntry, network: NetworkEntry, cal: Calibration) -> Topology:
    """The job's network tiers: from its nodes (``cluster.topology``), else from the cluster's sizes."""
    c = job.cluster
    assert c.gpus_per_node and c.nvlink_domain_size and c.nics_per_node
    assert c.leaf_span_gpus and c.spine_oversubscription
    if c.topology is not None:
        return node_topology(c, gpu, network, cal)
    return build_topology(
        num_gpus=c.resolved_num_gpus,
        gpu=gpu,
        network=network,
        gpus_per_node=c.gpus_per_node,
        nvlink_domain_size=c.nvlink_domain_size,
        nics_per_node=c.nics_per_node,
        leaf_span_gpus=c.leaf_span_gpus,
        spine_oversubscription=c.spine_oversubscription,
        cal=cal,
    )


def _layer_kinds(job: JobSpec) -> tuple[tuple[LayerKind, ...], tuple[int, ...]]:
    """The model's distinct layer kinds, in order of first appearance, and each layer's index into them."""
    model = job.model
    kinds: list[LayerKind] = []
    index: dict[LayerParams, int] = {}
    layer_kind = []
    for i in range(model.num_layers or 0):
        p = layer_params(model, i)
        if p not in index:
            lf = layer_flops(model, i, job.training.seq_len)
            index[p] = len(kinds)
            kinds.append(LayerKind(p, lf.attn_proj, lf.attn_core, lf.mlp, p.num_routed_experts > 0))
        layer_kind.append(index[p])
    return tuple(kinds), tuple(layer_kind)
