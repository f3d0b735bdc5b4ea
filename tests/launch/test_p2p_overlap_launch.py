"""Pipeline sends launched as costed. Megatron-Bridge turns the interleaved overlap on only from a
recipe's ``comm_overlap`` section (the Qwen and Llama 4 recipes have none), so an overlapped
interleaved plan sets it on the model; a blocking one goes through the section, except with two
stages, where Megatron refuses interleaving without the overlap and the plan says so."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.service import plan
from optimizer.specs import PlanRequest
from tests.launch.test_launch import comm_overlap_fields, nemo_overrides


def _plan(framework: str, overlap: bool, pp: int, vpp: int) -> Any:
    request = {
        "model": {"preset": "qwen3-235b-a22b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024, "framework": framework, "pp_comm_overlap": overlap},
        "cluster": {"preset": "dgx-h100", "num_gpus": 256},
        "search": {"top_k": 1, "fix": {"pp": pp, "vpp": vpp}},
    }
    answer = plan(PlanRequest.model_validate(request))
    assert answer.plans, answer.explanation
    best = answer.plans[0]
    assert (best.config.pp, best.config.vpp) == (pp, vpp)
    return best


def test_bridge_overlapped_interleaved_sends_are_set_on_the_model() -> None:
    over = nemo_overrides(_plan("megatron-bridge", True, 16, 2).launch.nemo)
    assert over["model.overlap_p2p_comm"] == "true" and over["model.batch_p2p_comm"] == "false"
    assert not any(k.startswith("comm_overlap.") and "p2p" in k for k in over)


@pytest.mark.parametrize("overlap", [True, False])
def test_bridge_sends_without_interleaving_take_no_key(overlap: bool) -> None:
    over = nemo_overrides(_plan("megatron-bridge", overlap, 8, 1).launch.nemo)
    assert not any("p2p" in k for k in over)  # Megatron-Core's non-interleaved schedule blocks anyway


def test_bridge_blocking_interleaved_sends_go_through_the_section() -> None:
    over = nemo_overrides(_plan("megatron-bridge", False, 8, 2).launch.nemo)
    # Qwen3's recipe has no section: the overrides give it whole
    assert comm_overlap_fields(over)["overlap_p2p_comm"] == "false" and "model.overlap_p2p_comm" not in over


@pytest.mark.parametrize("framework", ["megatron-lm", "megatron-bridge"])
def test_two_stage_interleaving_keeps_the_overlap_and_says_so(framework: str) -> None:
    """Megatron-Core's interleaved schedule at pp 2 without the overlap would batch two sends and
    receives between the same two ranks: Megatron-LM refuses it, Bridge does not check."""
    best = _plan(framework, False, 2, 2)
    assert "--no-overlap-p2p-communication" not in best.launch.megatron
    if framework == "megatron-bridge":
        assert "overlap_p2p_comm" not in comm_overlap_fields(nemo_overrides(best.launch.nemo))
    [note] = [n for n in best.notes if n.startswith("training.pp_comm_overlap false is not applied")]
    assert f"({best.time_breakdown_s.pp_comm:.3f} s a step costed blocking)" in note
