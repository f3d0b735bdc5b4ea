"""Typed results: what /plan and /evaluate return (the ``Plan`` and ``PlanResponse`` of the contract)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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


class MemoryBreakdown(_Out):
    """Peak per-GPU memory (GiB) on the most loaded pipeline stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float = Field(description="Communication buffers, CUDA context, allocator fragmentation.")
    total: float
    capacity: float = Field(description="Usable device memory (GiB).")
    headroom: float = Field(default=0.0, description="Kept free when judging fits_memory (GiB).")
    stage: int = Field(default=0, description="Pipeline stage (0-based) holding the peak.")
    per_stage_total: list[float] = Field(default_factory=list, description="Peak GiB of each pipeline stage.")


class LaunchArgs(_Out):
    """Ready-to-use launch settings for common training frameworks."""

    megatron: str = Field(description="Megatron-LM / Megatron-Core command-line arguments.")
    torchtitan: str = Field(default="", description="torchtitan TOML fragment.")
    deepspeed: str = Field(default="", description="DeepSpeed config JSON.")
    nemo: str = Field(default="", description="NeMo / Megatron-Bridge recipe overrides.")


class Plan(_Out):
    config: Layout
    placement: dict[str, str] = Field(description="axis -> outermost network tier its groups span")
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float = Field(description="model FLOPs / (step time * GPUs * dense peak at the training precision)")
    hfu: float = Field(description="hardware FLOPs (recompute included) / same denominator")
    model_tflops_per_gpu: float
    time_breakdown_s: TimeBreakdown
    memory_gib: MemoryBreakdown
    fits_memory: bool
    bottleneck: Bottleneck
    launch: LaunchArgs | None = None
    notes: list[str] = Field(default_factory=list, description="Assumptions the estimate made for this layout.")


class SolverInfo(_Out):
    engine: str = "cp-sat"
    status: str = Field(
        default="",
        description=(
            "The search's solver status: OPTIMAL (every layer-split model solved to optimality), FEASIBLE or "
            "UNKNOWN (a split model stopped at its limit, or the time limit ran out before any layout was "
            "costed), INFEASIBLE (no valid layout, or none fits in memory)."
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


LimitKind = Literal["memory", "batch", "pipeline_bubble", "communication", "compute", "optimizer"]


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
    why: Explanation | None = Field(default=None, description="The explanation of an answer with plans, typed.")


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
