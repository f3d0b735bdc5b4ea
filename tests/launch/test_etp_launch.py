"""Launch settings of plans with expert tensor parallelism (``etp``): each framework's own
argument names (the verified Megatron-LM flag list, Megatron-Bridge's config fields), and which
frameworks run which ``etp`` (``optimizer/data/frameworks.toml``)."""

from __future__ import annotations

import json
import math
import shlex

import pytest

from optimizer.cost.rules import ResolvedLayout
from optimizer.frameworks import layout_problem, profile
from optimizer.launch import MEGATRON_FLAGS, build_launch
from optimizer.params import layer_params
from optimizer.service import evaluate
from optimizer.specs import ClusterSpec, EvaluateRequest, JobSpec, Layout, ModelSpec, MoEConfig, TrainingSpec

MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
    vocab_size=32000, ffn_hidden_size=14336, moe=MoEConfig(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
)  # fmt: skip
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=256, precision="bf16")


def _lay(tp: int, ep: int, etp: int, zero_stage: int = 1) -> ResolvedLayout:
    job = JobSpec(model=MIXTRAL_8X7B, training=TRAINING, cluster=ClusterSpec(preset="dgx-h100", num_gpus=64))
    layout = Layout(tp=tp, pp=4, ep=ep, etp=etp, micro_batch_size=1, zero_stage=zero_stage, recompute="full")  # type: ignore[arg-type]
    return ResolvedLayout.from_spec(layout, job)


def _megatron_value(args: str, flag: str) -> str:
    toks = shlex.split(args)
    assert toks.count(flag) == 1, flag
    return toks[toks.index(flag) + 1]


def _nemo(args: str) -> dict[str, str]:
    return dict(tok.partition("=")[::2] for tok in shlex.split(args))


@pytest.mark.parametrize(("tp", "ep", "etp"), [(2, 8, 1), (2, 4, 2), (2, 2, 4), (4, 4, 4)])
def test_megatron_and_bridge_name_the_plans_etp(tp: int, ep: int, etp: int) -> None:
    args = build_launch(MIXTRAL_8X7B, TRAINING, _lay(tp, ep, etp), ("megatron", "nemo"))
    assert args.megatron is not None and args.nemo is not None
    # always explicit: unset, Megatron-LM splits experts over tp and Megatron-Bridge (ep > 1) not at all
    assert _megatron_value(args.megatron, "--expert-tensor-parallel-size") == str(etp)
    assert _megatron_value(args.megatron, "--expert-model-parallel-size") == str(ep)
    assert {t for t in shlex.split(args.megatron) if t.startswith("--")} <= MEGATRON_FLAGS
    over = _nemo(args.nemo)
    assert over["model.expert_tensor_parallel_size"] == str(etp)
    assert over["model.expert_model_parallel_size"] == str(ep)


@pytest.mark.parametrize(
    ("tp", "ep", "etp", "runs"),
    [
        (2, 8, 1, {"megatron-lm", "megatron-bridge", "deepspeed"}),  # torchtitan splits experts over tp
        (2, 4, 2, {"megatron-lm", "megatron-bridge", "torchtitan", "deepspeed"}),  # etp = tp: DeepSpeed's switch
        (2, 2, 4, {"megatron-lm", "megatron-bridge"}),  # etp > tp: Megatron-Core only
        (4, 2, 2, {"megatron-lm", "megatron-bridge"}),  # 1 < etp < tp
    ],
)
def test_which_frameworks_run_which_etp(tp: int, ep: int, etp: int, runs: set[str]) -> None:
    lay = _lay(tp, ep, etp)
    got = {fid for fid in ("megatron-lm", "megatron-bridge", "torchtitan", "deepspeed")
           if layout_problem(profile(fid), lay, True) is None}  # fmt: skip
    assert got == runs
    if etp != tp:
        reason = profile("torchtitan").etp_problem(lay.tp, lay.cp, lay.dp, lay.ep, lay.etp) or ""
        assert f"etp = tp ({tp}) only" in reason


def test_deepspeed_etp_is_the_tp_group_and_needs_ep_to_divide_dp() -> None:
    ds = profile("deepspeed")
    assert ds.etp_problem(tp=2, cp=1, dp=8, ep=4, etp=2) is None
    assert "ep (3) to divide dp (8)" in (ds.etp_problem(tp=2, cp=1, dp=8, ep=3, etp=2) or "")
    assert "etp 1 or tp (2)" in (ds.etp_problem(tp=2, cp=1, dp=8, ep=2, etp=4) or "")


def test_deepspeed_prefetch_holds_one_layer_of_this_ranks_expert_shard() -> None:
    """ZeRO-3 prefetch = the largest layer's parameters on one rank: with etp = tp = 2 each rank
    holds half of each of its two experts (ep 4): 2 x 3 x 4,096 x 14,336 / 2 = 176,160,768,
    plus the layer's dense share split over tp (attention, router, norms)."""

    def prefetch(etp: int) -> int:
        config = json.loads(build_launch(MIXTRAL_8X7B, TRAINING, _lay(2, 4, etp, 3), ("deepspeed",)).deepspeed or "{}")
        return int(config["zero_optimization"]["stage3_prefetch_bucket_size"])

    dense, experts = layer_params(MIXTRAL_8X7B, 0).on_rank(2, 4)
    assert experts == 2 * 3 * 4096 * 14336
    assert prefetch(1) == math.ceil(dense + experts)
    assert prefetch(2) == math.ceil(dense + 176_160_768)


def test_deepspeed_runs_no_moe_model() -> None:
    """DeepSpeed's MoE layer (top-1 / top-2 gating, capacity, einsum dispatch) is not what the cost
    model costs: a Mixtral layout names no framework with DeepSpeed named, and says why."""
    req = {"model": {"preset": "mixtral-8x7b"}, "training": {"seq_len": 4096, "global_batch_size": 256,
           "framework": "deepspeed"}, "cluster": {"preset": "dgx-h100", "num_gpus": 64},
           "config": {"tp": 2, "pp": 1, "ep": 4, "etp": 2, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}}  # fmt: skip
    plan = evaluate(EvaluateRequest.model_validate(req))
    assert plan.frameworks == []
    assert any("gates top-1 or top-2 only" in n for n in plan.notes), plan.notes
