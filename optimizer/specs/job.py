"""Jobs (model, training, cluster, prices, reliability) and the /plan, /evaluate and /compare requests."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from optimizer.framework_targets import model_defaults
from optimizer.frameworks import profile
from optimizer.modes import FLASH3_GENERATIONS
from optimizer.reference import current
from optimizer.specs.cluster import ClusterSpec
from optimizer.specs.layout import Layout
from optimizer.specs.model import ModelSpec
from optimizer.specs.search import MAX_MEMORY_HEADROOM_GIB, SearchSpec
from optimizer.specs.training import TrainingSpec
from optimizer.strict_model import Strict

Price = Annotated[float, Field(ge=1e-4, le=1000)]
"""USD per GPU-hour, bounded as ``costs.price_per_gpu_hour_usd``."""


class CostsSpec(Strict):
    """Prices for time_to_train; omitted fields come from the capacity catalog
    (``hardware_catalog/data/capacity.toml``)."""

    price_per_gpu_hour_usd: float | None = Field(
        default=None,
        ge=1e-4,
        le=1000,
        description="USD per GPU-hour; default: the catalog's on-demand price for the GPU.",
    )
    price_per_gpu_hour_usd_by_gpu: dict[str, Price] | None = Field(
        default=None,
        max_length=64,
        description=(
            "USD per GPU-hour for each GPU id (GET /gpus), ahead of price_per_gpu_hour_usd: one "
            "document for a sweep over clusters of different GPUs."
        ),
    )
    pue: float | None = Field(
        default=None,
        ge=1.0,
        le=5.0,
        description="Data-centre power usage effectiveness; default 1.58 (industry average).",
    )

    @field_validator("price_per_gpu_hour_usd_by_gpu")
    @classmethod
    def _known_gpus(cls, prices: dict[str, float] | None) -> dict[str, float] | None:
        known = current().catalog.gpus
        for gpu in prices or {}:
            if gpu not in known:
                raise ValueError(f"unknown GPU id {gpu!r} (GET /gpus lists them)")
        return prices


class ReliabilitySpec(Strict):
    """Failure and checkpoint figures for goodput; omitted fields come from the capacity catalog."""

    gpu_mtbf_hours: float | None = Field(
        default=None,
        ge=1.0,
        le=1e9,
        description="Mean GPU-hours between job-stopping failures, per GPU; default 50,677 (Llama 3 405B).",
    )
    restart_s: float | None = Field(
        default=None, ge=0, le=1e6, description="Time lost per failure to restart; default 600 s."
    )
    checkpoint_write_s: float | None = Field(
        default=None,
        ge=1e-3,
        le=1e6,
        description="Blocking time of one checkpoint; default: checkpoint bytes / (nodes x the node-local write rate).",
    )
    checkpoint_write_bytes_per_s_per_node: float | None = Field(
        default=None,
        ge=1e6,
        le=1e13,
        description="Rate at which each node writes its checkpoint shard (bytes/s); default 28e9 (node-local NVMe).",
    )

    @model_validator(mode="after")
    def _one_checkpoint_time(self) -> ReliabilitySpec:
        if self.checkpoint_write_s is not None and self.checkpoint_write_bytes_per_s_per_node is not None:
            raise ValueError(
                "reliability.checkpoint_write_bytes_per_s_per_node: give it or checkpoint_write_s, not both "
                "(the write time given would override the rate)"
            )
        return self


class JobSpec(Strict):
    """Model + training + cluster: shared by /plan and /evaluate."""

    model: ModelSpec = Field(description="The model: a preset id, or a full architecture.")
    training: TrainingSpec = Field(description="What one optimizer step processes, and the training stack.")
    cluster: ClusterSpec = Field(description="The GPUs and network: a preset id plus num_gpus, or explicit fields.")
    costs: CostsSpec = Field(default_factory=CostsSpec, description="Prices for time_to_train.")
    reliability: ReliabilitySpec = Field(
        default_factory=ReliabilitySpec, description="Failure and checkpoint figures for goodput."
    )

    @model_validator(mode="after")
    def _default_kernel_the_gpu_has(self) -> JobSpec:
        """``attention_kernel`` left at its default (``flash3``) on a GPU without FlashAttention-3-
        class kernels is ``flash2``, what the job is costed with: which frameworks run it and the
        stack they bring follow (a request that names ``flash3`` keeps it and gets a note)."""
        t = self.training
        if t.attention_kernel == "flash3" and "attention_kernel" not in t.model_fields_set:
            gpu = current().catalog.gpus.get(self.cluster.gpu or "")
            if gpu is not None and gpu.generation not in FLASH3_GENERATIONS:
                own = t.model_copy()  # the request's TrainingSpec may be another job's too
                own.__dict__["attention_kernel"] = "flash2"  # still a default: not in model_fields_set
                self.__dict__["training"] = own
        return self

    def job_spec(self) -> JobSpec:
        """The job alone: a request's model, training, cluster, costs and reliability, without
        its other fields (search, layouts, ...)."""
        return JobSpec(model=self.model, training=self.training, cluster=self.cluster, costs=self.costs,
                       reliability=self.reliability)  # fmt: skip

    @property
    def gpu_generation(self) -> str | None:
        """The cluster's GPU generation (catalog), which some framework rules depend on."""
        gpu = current().catalog.gpus.get(self.cluster.gpu or "")
        return None if gpu is None else gpu.generation

    @model_validator(mode="after")
    def _framework_model_defaults(self) -> JobSpec:
        """With a framework named, the ``training.*`` defaults its rules set for this model (e.g.
        torchtitan runs DeepSeek-V3 without torch.compile) for knobs the job leaves out."""
        if self.training.framework is not None:
            for knob, value in model_defaults(self.training.framework, self.model, self.training).items():
                if knob not in self.training.model_fields_set:
                    self.training.__dict__[knob] = value
        return self


class PlanRequest(JobSpec):
    search: SearchSpec = Field(
        default_factory=SearchSpec, description="How to search: plans wanted, time limit, pinned fields."
    )

    @model_validator(mode="after")
    def _moe_recompute_needs_moe(self) -> PlanRequest:
        if self.model.moe is None and self.search.fix.recompute == "moe":
            raise ValueError("search.fix.recompute: 'moe' recomputes MoE blocks and needs an MoE model")
        if self.model.moe is None and set(self.search.allow.recompute or ()) == {"moe"}:
            raise ValueError(
                "search.allow.recompute: 'moe', the only mode allowed, recomputes MoE blocks and needs an MoE model"
            )
        framework = self.training.framework
        _check_framework_recompute(framework, [self.search.fix.recompute], "search.fix.recompute")
        _check_framework_recompute(framework, list(self.search.allow.recompute or ()), "search.allow.recompute")
        return self


MemoryHeadroomGib = Annotated[float | None, Field(
    default=None, ge=0, le=MAX_MEMORY_HEADROOM_GIB,
    description="Memory kept free per GPU (GiB), as /plan's search.memory_headroom_gib; default: the cost model's.",
)]  # fmt: skip


class EvaluateRequest(JobSpec):
    config: Layout = Field(description="The layout to score.")
    memory_headroom_gib: MemoryHeadroomGib = None

    @model_validator(mode="after")
    def _framework_recompute(self) -> EvaluateRequest:
        note = "" if "recompute" in self.config.model_fields_set else " (the default: config.recompute not given)"
        _check_framework_recompute(self.training.framework, [self.config.recompute], "config.recompute", note)
        return self


def _check_framework_recompute(framework: str | None, names: list, where: str, note: str = "") -> None:
    """With a framework named, recompute takes its own names (docs/frameworks.md)."""
    if framework is None:
        return
    own = [m.name for m in profile(framework).recompute]
    bad = [n for n in names if n is not None and n not in own]
    if bad:
        raise ValueError(f"{where}: {bad[0]!r}{note} is not a {framework} recompute mode (its modes: {', '.join(own)})")


MAX_COMPARE_LAYOUTS = 8
"""Most layouts one /compare request may score."""


class CompareRequest(JobSpec):
    """A job and two or more layouts to score side by side (the first is the reference)."""

    memory_headroom_gib: MemoryHeadroomGib = None
    layouts: list[Layout] = Field(
        min_length=2,
        max_length=MAX_COMPARE_LAYOUTS,
        description=f"Layouts to score (2 to {MAX_COMPARE_LAYOUTS}); deltas are against the first.",
    )

    @model_validator(mode="after")
    def _framework_recompute(self) -> CompareRequest:
        for i, layout in enumerate(self.layouts):
            _check_framework_recompute(self.training.framework, [layout.recompute], f"layouts.{i}.recompute")
        return self
