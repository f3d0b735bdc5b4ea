"""Typed results: what /plan and /evaluate return (the ``Plan`` and ``PlanResponse`` of the contract)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from optimizer.assignment_results import Assignment
from optimizer.specs import Layout

Bottleneck = Literal[
    "compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "dp_comm", "optimizer", "memory_bound"
]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TimeBreakdown(_Out):
    """Exposed (not hidden by overlap) seconds per step, by cause. They sum to ``step_time_s``."""

    compute: float = Field(description="GEMMs, attention and memory-bound kernels on the critical path.")
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    pp_comm: float = 0.0
    pp_bubble: float = 0.0
    dp_comm: float = 0.0
    optimizer: float = 0.0


class StageMemoryGiB(_Out):
    """Peak per-GPU memory (GiB) of one pipeline stage, by category."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    optimizer_step: float = Field(
        default=0.0,
        description="What the optimizer step's fp32 copy of 16-bit gradients needs beyond the activations "
        "it replaces (0 with fp32 gradients or when the activations are larger).",
    )
    total: float


class MemoryBreakdown(_Out):
    """Peak per-GPU memory (GiB) on the most loaded pipeline stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float = Field(description="Communication buffers, CUDA context, allocator fragmentation.")
    optimizer_step: float = Field(
        default=0.0,
        description="What the optimizer step's fp32 copy of 16-bit gradients needs beyond the activations "
        "it replaces (0 with fp32 gradients or when the activations are larger).",
    )
    total: float
    capacity: float = Field(description="Usable device memory (GiB).")
    headroom: float = Field(default=0.0, description="Kept free when judging fits_memory (GiB).")
    stage: int = Field(default=0, description="Pipeline stage (0-based) holding the peak.")
    per_stage_total: list[float] = Field(default_factory=list, description="Peak GiB of each pipeline stage.")
    per_stage: list[StageMemoryGiB] = Field(
        default_factory=list, description="Peak GiB of each pipeline stage, by category (stage 0 first)."
    )

    @property
    def usable(self) -> float:
        """What ``fits_memory`` is judged against (GiB): the capacity less the headroom."""
        return self.capacity - self.headroom


class LaunchArgs(_Out):
    """Ready-to-use launch settings for common training frameworks."""

    megatron: str = Field(default="", description="Megatron-LM / Megatron-Core command-line arguments.")
    torchtitan: str = Field(default="", description="torchtitan TOML fragment.")
    deepspeed: str = Field(default="", description="DeepSpeed config JSON.")
    nemo: str = Field(default="", description="NeMo / Megatron-Bridge recipe overrides.")
    megatron_env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables the Megatron-LM launch must set (name -> value; empty when "
        "megatron is empty or none is needed), e.g. CUDA_DEVICE_MAX_CONNECTIONS.",
    )
    nemo_env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables the Megatron-Bridge launch must set (name -> value; empty when "
        "nemo is empty): Transformer Engine's NVTE_*_ATTN, which select the attention kernel the plan costs.",
    )


class Goodput(_Out):
    """Checkpointing and failures: what share of wall-clock time trains (Young-Daly interval)."""

    checkpoint_bytes: float = Field(description="Weights and optimizer state of the whole model (bytes).")
    checkpoint_write_s: float = Field(description="Blocking time of one checkpoint (s).")
    checkpoint_interval_s: float = Field(description="Young-Daly interval sqrt(2 x write x system MTBF) (s).")
    checkpoint_interval_steps: int = Field(description="The interval in whole steps (at least 1).")
    mtbf_system_s: float = Field(description="Mean time between job-stopping failures: GPU MTBF / GPUs (s).")
    restart_s: float = Field(description="Time lost per failure to restart (s).")
    fraction: float = Field(description="Expected productive share of wall-clock time (0-1).")
    tokens_per_s: float = Field(description="tokens_per_s x fraction: the rate a long run delivers.")


class TimeToTrain(_Out):
    """The token budget (training.total_tokens) at this plan's goodput throughput."""

    total_tokens: int
    steps: int
    days: float = Field(description="Wall-clock days, failures, checkpoints and restarts included.")
    gpu_hours: float
    cost_usd: float | None = Field(description="GPU-hours x price; null when no price is known for the GPU.")
    price_per_gpu_hour_usd: float | None
    energy_mwh: float = Field(description="(board power at the plan's utilisation + host share) x GPUs x time x PUE.")
    power_per_gpu_w: float = Field(description="Board plus host power per GPU while training (W), before PUE.")
    pue: float
    expected_failures: float = Field(
        default=0.0, description="Job-stopping failures expected over the run: wall time / goodput.mtbf_system_s."
    )


class Plan(_Out):
    config: Layout
    placement: dict[str, str] = Field(description="axis -> outermost network tier its groups span")
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_gpu_range: tuple[float, float] | None = Field(
        default=None,
        description=(
            "80% interval [low, high] of tokens_per_s_per_gpu, from how far the cost model missed comparable "
            "published runs (dense / MoE, GPU generation, precision; docs/error_bands.md). Brackets the prediction."
        ),
    )
    step_time_s_range: tuple[float, float] | None = Field(
        default=None,
        description="80% interval [low, high] of step_time_s matching tokens_per_s_per_gpu_range (step = tokens / throughput).",
    )
    mfu: float = Field(description="model FLOPs / (step time * GPUs * dense peak at the training precision)")
    hfu: float = Field(description="hardware FLOPs (recompute included) / same denominator")
    model_tflops_per_gpu: float
    time_breakdown_s: TimeBreakdown
    memory_gib: MemoryBreakdown
    fits_memory: bool
    bottleneck: Bottleneck
    launch: LaunchArgs | None = Field(
        default=None, description="Arguments for exactly the frameworks in ``frameworks`` (the other fields empty)."
    )
    frameworks: list[str] = Field(
        default_factory=list,
        description=(
            "Frameworks that run this plan unchanged, as costed (docs/frameworks.md): its layout, recompute and "
            "the job's training.* stack. Empty when none does (a note says why)."
        ),
    )
    notes: list[str] = Field(default_factory=list, description="Assumptions the estimate made for this layout.")
    assignment: Assignment | None = Field(default=None, description="With cluster.topology: the nodes and rank order.")
    goodput: Goodput | None = Field(default=None, description="Checkpoint interval and expected goodput.")
    time_to_train: TimeToTrain | None = Field(
        default=None, description="Days, GPU-hours, cost, energy: with a token budget."
    )
    data_loading_bytes_per_s: float | None = Field(
        default=None, description="Tokenised-data read rate the step needs (bytes/s, all GPUs together)."
    )


class SolverInfo(_Out):
    engine: str = "cp-sat"
    status: str = Field(
        default="",
        description=(
            "The search's solver status: OPTIMAL only when the answer is proved optimal; FEASIBLE for plans "
            "without a proof; UNKNOWN for no plan and no proof (the time limit ran out); INFEASIBLE (no valid "
            "layout, or none fits in memory)."
        ),
    )
    wall_time_s: float = 0.0
    proved_optimal: bool = False
    objective_bound: float | None = Field(default=None, description="Lower bound on the best step time (s).")
    candidates_enumerated: int = 0
    candidates_fitting_memory: int = Field(
        default=0,
        description=(
            "Layouts the search examined that fit in memory (with their uniform layer split); layouts its lower "
            "bounds ruled out before examining them are not counted."
        ),
    )
    candidates_to_solver: int = Field(
        default=0,
        description=(
            "Layer-split CP-SAT models solved: one per pipelined layout and rank-order geometry whose "
            "split floor is below the k-th best step time and some split of which fits in memory and, in whole "
            "layers, could reach that time."
        ),
    )
    left_out_depths_bound_s: float | None = Field(
        default=None,
        description=(
            "Models whose dense and MoE layers alternate, with no interleaving depth named: a lower bound (s) on the step "
            "time of every layout with a depth the default space leaves out (chunks of unequal layer counts; "
            "search.allow.vpp names them). Null when none is left out or the bound is not below the best plan "
            "(which is then optimal over those depths too)."
        ),
    )
    beyond_default_bounds_s: float | None = Field(
        default=None,
        description=(
            "A lower bound (s) on every layout beyond the default space's bounds (vpp above 8, micro_batch_size "
            "above 16; values search.fix / search.allow name are inside them), set when it is below the best plan: "
            "those layouts were then searched in bound order like the rest, and the status covers them. Null when "
            "no such layout could beat the best plan."
        ),
    )


LimitKind = Literal["memory", "batch", "pipeline_bubble", "communication", "compute", "optimizer", "memory_headroom"]


class PlanLimit(_Out):
    """One thing that limits the top plan, with its numbers."""

    kind: LimitKind
    summary: str = Field(description="What limits the plan, with the numbers.")
    values: dict[str, float] = Field(default_factory=dict, description="The numbers, units in the names.")


class RunnerUp(_Out):
    """What the second plan trades against the first."""

    step_time_delta_s: float = Field(description="Runner-up's step time minus the top plan's (s).")
    relative: float = Field(description="step_time_delta_s over the top plan's step time.")
    config_changes: dict[str, list[int | str | bool | None]] = Field(
        default_factory=dict, description="Layout fields that differ: [top plan, runner-up]."
    )
    time_deltas_s: dict[str, float] = Field(
        default_factory=dict, description="Per time category: runner-up minus top plan (s), those that differ."
    )
    memory_delta_gib: float = Field(description="Runner-up's peak memory minus the top plan's (GiB).")
    summary: str


class Explanation(_Out):
    """Why the top plan is what it is: what limits it, and what the runner-up trades."""

    summary: str
    limits: list[PlanLimit] = Field(default_factory=list, description="Most binding first.")
    runner_up: RunnerUp | None = None


class Suggestion(_Out):
    """A nearby GPU count that does clearly better than the one asked for."""

    num_gpus: int
    tokens_per_s: float = Field(description="Throughput of its best plan.")
    tokens_per_s_per_gpu: float
    step_time_s: float
    mfu: float
    reason: str = Field(description="Why: batch divisibility, pipeline bubble, per-GPU throughput.")


class PlannedJob(_Out):
    """What was planned, as the planner resolved the request (preset and overrides applied)."""

    model: str = Field(description="The model's name (or preset id).")
    total_params: int = Field(description="Parameters of the whole model.")
    active_params: int = Field(description="Parameters one token touches (MoE: its routed experts only).")
    gpu: str = Field(description="The GPU (catalog id).")
    num_gpus: int | None = Field(description="GPUs asked for (null: chosen on cluster.topology; see the plans).")
    precision: str
    framework: str | None = Field(description="training.framework (null: any).")


class PlanResponse(_Out):
    status: Literal["optimal", "feasible", "infeasible"]
    plans: list[Plan]
    solver: SolverInfo
    explanation: str | None = Field(
        default=None,
        description=(
            "Why, in one paragraph: for an answer with plans, what limits the top plan and what the runner-up "
            "trades (the same as why.summary); for one without, why there is none, with the numbers."
        ),
    )
    warnings: list[str] = Field(default_factory=list)
    planned: PlannedJob | None = Field(default=None, description="The job as planned: model, parameters, GPUs.")
    why: Explanation | None = Field(default=None, description="The explanation of an answer with plans, typed.")
    free_gpus_by_level: dict[str, dict[str, int]] | None = Field(
        default=None, description="With cluster.topology and no plan: free GPUs per domain of each level"
    )
    smallest_fitting_gpus: int | None = Field(
        default=None,
        description="With cluster.topology and no plan: GPUs (whole nodes, doubling) the smallest fitting layout needs",
    )
    suggestions: list[Suggestion] = Field(
        default_factory=list, description="Nearby GPU counts that are clearly better (search.suggest)."
    )


class CompareEntry(_Out):
    """One layout of a comparison: its score, and how it differs from the first layout's."""

    plan: Plan
    step_time_delta_s: float = Field(description="This layout's step time minus the first's (s).")
    relative: float = Field(description="step_time_delta_s over the first layout's step time.")
    time_deltas_s: dict[str, float] = Field(
        default_factory=dict, description="Per time category, this layout minus the first (s), those that differ."
    )
    memory_deltas_gib: dict[str, float] = Field(
        default_factory=dict, description="Per memory category, this layout minus the first (GiB), those that differ."
    )
    mfu_delta: float
    summary: str


class CompareResponse(_Out):
    entries: list[CompareEntry] = Field(description="One per layout, in request order; the first has no deltas.")
    warnings: list[str] = Field(default_factory=list)
