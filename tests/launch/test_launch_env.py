"""``launch.megatron_env``: the ``CUDA_DEVICE_MAX_CONNECTIONS`` value
Megatron-LM's ``validate_args`` (commit 000c4ac2) asserts for the arguments the plan prints."""

from __future__ import annotations

import shlex

import pytest

from optimizer.cost.rules import ResolvedLayout
from optimizer.launch import build_launch
from optimizer.specs import ClusterSpec, JobSpec, Layout, ModelSpec, MoEConfig, TrainingSpec

DENSE = ModelSpec(preset="llama3-8b")
MOE = ModelSpec(
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
    vocab_size=32000, ffn_hidden_size=14336, moe=MoEConfig(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
)  # fmt: skip
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=256, precision="bf16")


def _launch(model: ModelSpec, training: TrainingSpec, **layout: int):
    job = JobSpec(model=model, training=training, cluster=ClusterSpec(preset="dgx-h100", num_gpus=64))
    lay = ResolvedLayout.from_spec(Layout(micro_batch_size=1, recompute="none", **layout), job)  # type: ignore[arg-type]
    return build_launch(model, training, lay)


def _megatron_accepts(args: str, env: dict[str, str]) -> bool:
    """Megatron-LM's ``validate_args`` on a GPU before Blackwell: Megatron-FSDP asserts the
    variable is not "1"; TP or CP without FSDP or the expert all-to-all overlap assert it is."""
    flags = shlex.split(args)
    value = env.get("CUDA_DEVICE_MAX_CONNECTIONS")

    def size(flag: str) -> int:
        return int(flags[flags.index(flag) + 1])

    if "--use-megatron-fsdp" in flags:
        return value != "1"
    if size("--tensor-model-parallel-size") > 1 or size("--context-parallel-size") > 1:
        return "--overlap-moe-expert-parallel-comm" in flags or value == "1"
    return True


@pytest.mark.parametrize(
    ("model", "training", "layout", "expected"),
    [
        (DENSE, TRAINING, {"tp": 2, "zero_stage": 1}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
        (DENSE, TRAINING, {"cp": 2, "zero_stage": 1}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
        (DENSE, TRAINING, {"tp": 1, "zero_stage": 1}, {}),
        (DENSE, TRAINING, {"tp": 1, "zero_stage": 3}, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}),
        (DENSE, TRAINING, {"tp": 2, "zero_stage": 2}, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}),
        (MOE, TRAINING.model_copy(update={"ep_comm_overlap": True}), {"tp": 2, "ep": 4, "pp": 2, "vpp": 2, "zero_stage": 1},
         {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}),
        (MOE, TRAINING, {"tp": 2, "ep": 4, "zero_stage": 1}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    ],
)  # fmt: skip
def test_env_is_what_megatron_asserts(model: ModelSpec, training: TrainingSpec, layout: dict, expected: dict) -> None:
    launch = _launch(model, training, **layout)
    assert launch.megatron_env == expected
    assert _megatron_accepts(launch.megatron, launch.megatron_env)
    # the same arguments with the variable left to the environment's default would not start
    if expected.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        assert not _megatron_accepts(launch.megatron, {})


def test_env_only_for_frameworks_that_run_the_plan() -> None:
    job = JobSpec(model=DENSE, training=TRAINING, cluster=ClusterSpec(preset="dgx-h100", num_gpus=64))
    lay = ResolvedLayout.from_spec(Layout(tp=2, micro_batch_size=1, zero_stage=1, recompute="none"), job)  # type: ignore[arg-type]
    launch = build_launch(DENSE, TRAINING, lay, ("torchtitan",))
    assert launch.megatron_env == {} and launch.torchtitan


@pytest.mark.parametrize(
    ("layout", "generation", "noted"),
    [({"tp": 4, "zero_stage": 3}, "hopper", True), ({"tp": 4, "zero_stage": 3}, "blackwell", False),
     ({"tp": 1, "zero_stage": 3}, "hopper", False), ({"tp": 4, "zero_stage": 1}, "hopper", False)],
)  # fmt: skip
def test_many_connections_with_tp_before_blackwell_is_noted(layout: dict, generation: str, noted: bool) -> None:
    """Megatron-FSDP needs many connections, and Megatron-Core's async TP collectives need "1" to be
    ordered before the GEMMs they hide under (Hopper and before): the plan says what it cannot cost."""
    from optimizer.launch.environment import unordered_tp_overlap_note

    job = JobSpec(model=DENSE, training=TRAINING, cluster=ClusterSpec(preset="dgx-h100", num_gpus=64))
    lay = ResolvedLayout.from_spec(Layout(micro_batch_size=1, recompute="none", **layout), job)  # type: ignore[arg-type]
    notes = unordered_tp_overlap_note(DENSE, job.training, lay, generation)
    assert bool(notes) is noted
    if noted:
        assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in notes[0]
