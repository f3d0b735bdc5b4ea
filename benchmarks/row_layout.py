"""The layout space of a calibration row (``benchmarks/calibration_rows.py``): the fields its
source stated, pinned, and a small grid of candidate values for the knobs it did not state.

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
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.mbridge_recipes import UNCOSTED_TECHNIQUES, recipe_moe
from benchmarks.row_errors import Unmappable
from benchmarks.row_stack import is_torchtitan, map_recompute, map_zero_stage
from optimizer.specs import JobSpec

MBS_GRID: tuple[int, ...] = (1, 2, 4)
RECOMPUTE_GRID: tuple[str, ...] = ("none", "selective", "full")
MAX_VPP = 8
DEFAULT_ZERO_STAGE = 1
SP_INTRODUCED = "2022-05"
"""Sequence parallelism appeared with Korthikanti et al. (arXiv 2205.05198); earlier runs had none."""
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
        if row["id"] in UNCOSTED_TECHNIQUES:
            notes.append(UNCOSTED_TECHNIQUES[row["id"]])
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
