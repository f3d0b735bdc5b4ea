"""DeepSpeed takes no per-stage layer counts: its balanced partition gives a remainder to the
first stages, so a plan runs on it as costed only with equal stages, or with the first and last
one layer lighter (the embedding and output layers counted as a layer each in
``partition_method``). Its recompute runs only where the model code or ``PipelineModule`` asks."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.errors import InvalidLayout
from optimizer.frameworks import balanced_partitions, partitions
from optimizer.service import evaluate, plan
from optimizer.specs import EvaluateRequest, PlanRequest


@pytest.mark.parametrize(
    ("layers", "pp", "only", "ends"),
    [(126, 8, (16,) * 7 + (14,), (15,) + (16,) * 6 + (15,)), (32, 3, (11, 11, 10), (11, 12, 9)),
     (32, 4, (8, 8, 8, 8), (8, 9, 9, 6)), (70, 12, (6,) * 11 + (4,), (5,) + (6,) * 10 + (5,))],
)  # fmt: skip
def test_balanced_partitions(layers: int, pp: int, only: tuple, ends: tuple) -> None:
    assert balanced_partitions(layers, pp) == (only, ends)


@pytest.mark.parametrize(("layers", "pp", "runs"), [(126, 8, True), (126, 7, True), (126, 4, True), (32, 3, True),
                                                    (70, 12, True), (70, 16, False), (32, 5, False), (32, 6, False)])  # fmt: skip
def test_partitions(layers: int, pp: int, runs: bool) -> None:
    """Whether the even split is one DeepSpeed's partition gives (126 on 4: [31, 32, 32, 31], the
    ends counted; 32 on 3: [11, 11, 10], its own; 32 on 5: [6, 7, 7, 6, 6], neither)."""
    assert partitions(layers, pp) is runs


def _job(model: str, num_gpus: int, **training: Any) -> dict[str, Any]:
    return {
        "model": {"preset": model},
        "training": {"seq_len": 8192, "global_batch_size": 512, **training},
        "cluster": {"preset": "dgx-h200", "num_gpus": num_gpus},
    }


def test_lighter_ends_name_the_end_layers_and_full_recompute_sets_the_interval() -> None:
    job = _job("llama3.1-405b", 512, framework="deepspeed", grad_reduce_in_fp32=True)
    answer = plan(PlanRequest.model_validate({**job, "search": {"top_k": 1, "fix": {"pp": 8}}}))
    best = answer.plans[0]
    assert best.config.stage_layers == [15] + [16] * 6 + [15] and best.config.recompute == "full"
    [note] = [n for n in best.notes if "PipelineModule" in n]
    assert "partition_method='type:<layer class>|<embedding class>|<output layer class>'" in note
    assert "activation_checkpoint_interval=1" in note


def test_a_pipeline_depth_deepspeed_cannot_partition_is_a_422() -> None:
    job = _job("llama3-8b", 40, framework="deepspeed", grad_reduce_in_fp32=True)
    with pytest.raises(InvalidLayout) as err:
        plan(PlanRequest.model_validate({**job, "search": {"fix": {"pp": 5}}}))
    assert err.value.field == "search.fix.pp"
    assert "balanced partition does not split 32 layers evenly" in err.value.reason


def test_no_framework_plan_with_a_middle_heavy_split_does_not_list_deepspeed() -> None:
    # a stack DeepSpeed's pipeline engine runs (fp32 gradients, blocking sends): only the split stops it
    job = _job("llama3-8b", 40, grad_reduce_in_fp32=True, pp_comm_overlap=False, dp_comm_overlap=False)
    job["training"]["global_batch_size"] = 96
    config = {"tp": 8, "pp": 5, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}
    scored = evaluate(EvaluateRequest.model_validate({**job, "config": config}))
    assert scored.config.stage_layers == [6, 7, 7, 6, 6]
    assert "deepspeed" not in scored.frameworks and scored.frameworks
    assert scored.launch.deepspeed == ""
    on_16 = {**job, "cluster": {"preset": "dgx-h200", "num_gpus": 16}}  # tp 8 pp 2: equal stages
    even = evaluate(EvaluateRequest.model_validate({**on_16, "config": {**config, "pp": 2}}))
    assert even.config.stage_layers == [16, 16] and "deepspeed" in even.frameworks  # the same stack runs here


def test_every_plan_under_deepspeed_runs_on_it() -> None:
    """The space holds only depths DeepSpeed partitions as costed: pp 6 (32 layers: [5, 5, 6, 6, 5, 5]) is
    left out, pp 3 ([11, 11, 10], its own partition) is not."""
    job = _job("llama3-8b", 24, framework="deepspeed", grad_reduce_in_fp32=True)
    job["training"]["global_batch_size"] = 96
    answer = plan(PlanRequest.model_validate({**job, "search": {"top_k": 20, "diverse": False}}))
    assert len(answer.plans) >= 2
    assert all("deepspeed" in p.frameworks for p in answer.plans)
    assert {p.config.pp for p in answer.plans} >= {2, 3} and 6 not in {p.config.pp for p in answer.plans}
    three = next(p for p in answer.plans if p.config.pp == 3)
    assert three.config.stage_layers == [11, 11, 10]
    assert any("partition_method='type:<layer class>')" in n for n in three.notes)  # its own partition, no ends


def test_allowed_depths_deepspeed_cannot_partition_are_a_422() -> None:
    job = _job("llama3-8b", 40, framework="deepspeed", grad_reduce_in_fp32=True)
    with pytest.raises(InvalidLayout) as err:
        plan(PlanRequest.model_validate({**job, "search": {"allow": {"pp": [5, 10]}}}))
    assert err.value.field == "search.allow.pp" and "any of pp [5, 10]" in err.value.reason


def test_full_recompute_without_a_pipeline_says_the_model_code_wraps_the_layers() -> None:
    job = _job("llama3-8b", 8, framework="deepspeed")
    answer = plan(PlanRequest.model_validate({**job, "search": {"top_k": 1, "fix": {"recompute": "full", "pp": 1}}}))
    assert any("deepspeed.checkpointing.checkpoint" in n for n in answer.plans[0].notes)


def test_the_space_under_deepspeed_holds_only_depths_it_partitions() -> None:
    from optimizer.search.space import enumerate_layouts
    from optimizer.specs import JobSpec

    raw = _job("llama3-8b", 24, framework="deepspeed", grad_reduce_in_fp32=True)
    raw["training"]["global_batch_size"] = 96  # every depth dividing 24 GPUs has a layout
    request = PlanRequest.model_validate(raw)
    job = JobSpec(model=request.model, training=request.training, cluster=request.cluster)
    depths = {lay.pp for lay in enumerate_layouts(job, request.search)}
    assert {2, 3, 4} <= depths and 6 not in depths  # 32 layers on 6 stages: [5, 5, 6, 6, 5, 5]


@pytest.mark.parametrize(("tp", "pp", "mpu"), [(2, 1, True), (2, 2, False), (1, 2, False)])
def test_model_parallel_note_passes_an_mpu_only_without_a_pipeline(tp: int, pp: int, mpu: bool) -> None:
    """With a pipeline ``deepspeed.initialize`` asserts ``mpu is None`` and takes the module's,
    whose topology carries the tensor-parallel size (``deepspeed/__init__.py``)."""
    req = EvaluateRequest.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "framework": "deepspeed", "precision": "fp16"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 16},
        "config": {"tp": tp, "pp": pp, "zero_stage": 1},
    })  # fmt: skip
    (note,) = [n for n in evaluate(req).notes if n.startswith("DeepSpeed takes the parallel sizes")]
    assert ("mpu=" in note) is mpu
    assert (f"num_mp={tp}" in note) is (pp > 1)
