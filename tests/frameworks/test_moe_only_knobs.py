"""Stack knobs that act only on MoE layers (``frameworks.MOE_KNOBS``: the expert all-to-all
overlap and host-side expert GEMM splits) do not decide which framework runs a dense job."""

from __future__ import annotations

from pathlib import Path

import yaml

from optimizer.framework_targets import candidate_frameworks
from optimizer.frameworks import MOE_KNOBS, profile, stack_defaults
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, ModelSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
SEQ = 8192


def _titan_training(**override: object) -> TrainingSpec:
    """torchtitan's stack knobs, named one by one (no framework named), then ``override``."""
    knobs = {**stack_defaults("torchtitan"), **override}
    return TrainingSpec(seq_len=SEQ, global_batch_size=16, **knobs)


def test_the_knobs_are_the_moe_ones() -> None:
    assert set(MOE_KNOBS) == {"ep_comm_overlap", "expert_gemm_host_splits"}
    assert stack_defaults("torchtitan")["expert_gemm_host_splits"] is False


def test_a_dense_job_runs_on_torchtitan_whatever_the_moe_knobs_say() -> None:
    training = _titan_training(expert_gemm_host_splits=True)  # torchtitan splits on the device
    titan = profile("torchtitan")
    dense, moe = ModelSpec(preset="llama3-8b"), ModelSpec(preset="llama4-scout")
    assert titan.stack_problem(training, dense) is None
    assert "expert_gemm_host_splits" in (titan.stack_problem(training, moe) or "")
    assert [p.id for p in candidate_frameworks(training, dense)] == ["torchtitan"]
    assert candidate_frameworks(training, moe) == ()


def test_the_torchtitan_example_runs_on_torchtitan() -> None:
    """examples/evaluate-llama3.1-8b-torchtitan.yaml sets torchtitan's dense knobs and leaves the
    MoE ones at their defaults: the answer lists torchtitan and its launch arguments only."""
    raw = yaml.safe_load((ROOT / "examples" / "evaluate-llama3.1-8b-torchtitan.yaml").read_text())
    result = evaluate(EvaluateRequest.model_validate(raw))
    assert result.frameworks == ["torchtitan"]
    assert result.launch.torchtitan and not result.launch.megatron and not result.launch.deepspeed
    assert 5_400 < result.tokens_per_s_per_gpu < 5_900  # 5,762 measured (torchtitan, Dec 2024, Table 1)
