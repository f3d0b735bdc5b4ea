"""Expert tensor parallelism (``etp``): the rules, the expert group geometry, the ETP collectives,
the expert GEMM shapes and memory (hand-computed examples and invariants)."""

from __future__ import annotations

import dataclasses

import pytest

import optimizer.cost.layer as layer_module
from optimizer.cost import build_context, distinct_orders
from optimizer.cost.comm import Level
from optimizer.cost.expert_tp import etp_collectives_fwd_s
from optimizer.cost.layer import Dims, ep_comm_s, layer_cost
from optimizer.cost.rules import ResolvedLayout
from optimizer.cost.topology import Tier, Topology, axis_groups
from optimizer.errors import InvalidLayout
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest, JobSpec, Layout

NVLINK = Level(2, 400e9, 5e-6, own_links=True)


def _mixtral(num_gpus: int = 256, **training: object) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"preset": "mixtral-8x22b"},
        "training": {"seq_len": 4096, "global_batch_size": 1024, **training},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
    })  # fmt: skip


def _lay(job: JobSpec, etp: int, **sizes: int) -> ResolvedLayout:
    fields = {"tp": 4, "pp": 4, "ep": 8, "micro_batch_size": 1, "recompute": "selective", **sizes}
    return ResolvedLayout.from_spec(Layout(etp=etp, **fields), job)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ rules


def test_rules_name_config_etp_and_the_reason() -> None:
    job = _mixtral()
    with pytest.raises(InvalidLayout, match=r"ep\*etp \(8\*3\) must divide tp\*dp\*cp \(64\)") as err:
        _lay(job, 3)
    assert err.value.field == "config.etp"
    dense = JobSpec.model_validate({
        "model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64},
        "cluster": {"preset": "dgx-h100", "num_gpus": 64},
    })  # fmt: skip
    with pytest.raises(InvalidLayout, match="needs an MoE model") as err:
        ResolvedLayout.from_spec(Layout(tp=2, etp=2), dense)
    assert err.value.field == "config.etp"
    # the expert FFN (16,384) split 2^15 ways is fine; 3 ways is not (and 3 does not tile 64 either)
    odd = job.model_copy(update={"model": job.model.model_copy(update={"moe": job.model.moe.model_copy(  # type: ignore[union-attr]
        update={"expert_ffn_hidden_size": 16386})})})  # fmt: skip
    with pytest.raises(InvalidLayout, match=r"moe.expert_ffn_hidden_size \(16386\) is not divisible by etp \(4\)"):
        _lay(odd, 4)
    # etp > tp is allowed (Megatron-Core tests tp2 x etp4), etp need not divide tp
    assert _lay(job, 8, tp=2, ep=4).etp == 8
    assert _lay(job, 2).to_spec().etp == 2


# --------------------------------------------------------------------------------------- geometry


def _topology() -> Topology:
    """16 GPUs: 2-GPU NVLink domains, 8-GPU leaves, a 16-GPU spine (so a group's outermost tier
    tells how far its ranks spread)."""
    tiers = (Tier("nvlink", 2, 400e9, 5e-6), Tier("leaf", 8, 50e9, 10e-6), Tier("spine", 16, 25e9, 20e-6))
    return Topology(tiers, 16, False)


@pytest.mark.parametrize(
    ("etp", "ep", "expected"),
    [
        # Megatron-Core's RankGenerator at tp = cp = dp = pp = 2 (order tp-cp-dp-pp):
        # etp 2, ep 2: ETP [0, 1], EP [0, 2], EDP [0, 4]
        (2, 2, {"etp": (2, "nvlink"), "ep": (2, "leaf"), "edp": (2, "leaf"), "tp_ep": (4, "leaf")}),
        # etp 4, ep 2: ETP [0..3], EP [0, 4], EDP [0]
        (4, 2, {"etp": (4, "leaf"), "ep": (2, "leaf"), "edp": (1, "none"), "tp_ep": (8, "leaf")}),
        # etp 1, ep 4: EP [0..3], EDP [0, 4] (today's re-tiling)
        (1, 4, {"etp": (1, "none"), "ep": (4, "leaf"), "edp": (2, "leaf"), "tp_ep": (4, "leaf")}),
        # etp 1, ep 2: EP [0, 1] inside the NVLink pair, EDP [0, 2, 4, 6]
        (1, 2, {"etp": (1, "none"), "ep": (2, "nvlink"), "edp": (4, "leaf"), "tp_ep": (2, "nvlink")}),
    ],
)
def test_expert_groups_follow_megatron_rank_order(etp: int, ep: int, expected: dict) -> None:
    sizes = {"tp": 2, "cp": 2, "dp": 2, "pp": 2, "ep": ep, "etp": etp}
    groups = axis_groups(_topology(), ("tp", "cp", "dp", "pp"), sizes)
    got = {name: (getattr(groups, name).size, getattr(groups, name).outermost_tier) for name in expected}
    assert got == expected
    assert groups.pp.outermost_tier == "spine"  # the pipeline groups are the dense ones


def test_etp_group_size_one_keeps_todays_groups() -> None:
    """At etp 1 the expert-TP group is empty and the etp x ep block is the EP group itself."""
    sizes = {"tp": 2, "cp": 2, "dp": 2, "pp": 2, "ep": 4}
    topo = _topology()  # geometries are cached per topology object: compared by identity
    old = axis_groups(topo, ("tp", "cp", "dp", "pp"), sizes)
    new = axis_groups(topo, ("tp", "cp", "dp", "pp"), {**sizes, "etp": 1})
    assert (new.ep, new.edp, new.tp_ep) == (old.ep, old.edp, old.ep)
    assert new.etp.size == 1 and new.etp.levels == ()


# ------------------------------------------------------------------------------ ETP collectives


def test_etp_collectives_hand_computed() -> None:
    """2,048 routed copies, h = 6,144, etp 2 on one 400 GB/s level (5 us): the all-gather
    outputs 2 x 2,048 x (6,144 x 2 B + 2 B) = 50,339,840 B, a ring moves half of it:
    62.9248 us + 5 us; the reduce-scatter of 2 x 2,048 x 6,144 bf16 partial outputs
    (50,331,648 B): 62.91456 us + 5 us. Together 135.83936 us."""
    t = etp_collectives_fwd_s(2048, 6144, 2, (NVLINK,))
    assert t == pytest.approx(135.83936e-6, rel=1e-12)
    assert etp_collectives_fwd_s(2048, 6144, 1, (NVLINK,)) == 0.0


def test_alltoall_layer_adds_two_etp_pairs_per_micro_batch() -> None:
    """The layer's EP time at etp 2 is the EP all-to-all (over its own group) plus the forward
    ETP pair and its backward mirror (selective recompute does not re-run the MoE block)."""
    job = _mixtral()
    ctx = build_context(job)
    lay = _lay(job, 2)
    _, groups = distinct_orders(ctx, lay)[0]
    kind = next(k for k in ctx.kinds if k.is_moe)
    d = lay.dims
    whole = ep_comm_s(ctx, kind, dataclasses.replace(d, etp=1), groups.ep)
    tokens = 1 * 4096 / 4 * 2 * ctx.cal.ep_load_imbalance  # T k rho
    pair = etp_collectives_fwd_s(tokens, 6144, 2, groups.etp.levels)
    assert pair > 0
    assert ep_comm_s(ctx, kind, d, groups.ep, groups.etp, groups.tp_ep) == pytest.approx(whole + 2 * pair, rel=1e-12)


# -------------------------------------------------------------------------- GEMMs and memory


def test_expert_gemm_flops_unchanged_rows_and_width_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    job = _mixtral()
    ctx = build_context(job)
    kind = next(k for k in ctx.kinds if k.is_moe)
    calls: list[tuple[float, float, float, float]] = []

    def spy(_ctx: object, flops: float, m: float, n: float, k: float) -> float:
        calls.append((flops, m, n, k))
        return 1.0

    monkeypatch.setattr(layer_module, "grouped_gemm_gpu_s", spy)
    for etp in (1, 2, 4):
        layer_module.expert_gemm_times_s(ctx, kind, _lay(job, etp).dims)
    (f1, m1, n1, k1), (f2, m2, n2, k2), (f4, m4, n4, k4) = calls
    assert f1 == f2 == f4  # FLOPs per GPU do not depend on etp
    assert (m2, m4) == (2 * m1, 4 * m1) and n1 == n2 == n4 and (k2, k4) == (k1 / 2, k1 / 4)


def test_expert_memory_hand_computed_and_falls_with_etp() -> None:
    """Mixtral 8x22B, ep 8: one local expert of 3 x 6,144 x 16,384 = 301,989,888 parameters,
    split etp ways: 150,994,944 at etp 2."""
    job = _mixtral()
    ctx = build_context(job)
    kind = next(k for k in ctx.kinds if k.is_moe)
    per_etp = {}
    for etp in (1, 2, 4):
        lay = _lay(job, etp)
        _, groups = distinct_orders(ctx, lay)[0]
        per_etp[etp] = layer_cost(ctx, kind, lay.dims, groups)
    assert per_etp[1].expert_params == 301_989_888
    assert per_etp[2].expert_params == 150_994_944
    assert per_etp[4].expert_params == 301_989_888 / 4
    assert per_etp[1].dense_params == per_etp[2].dense_params == per_etp[4].dense_params
    # the expert input grows etp x, the fc1 output does not: stored activations grow
    assert per_etp[1].stored_act_bytes < per_etp[2].stored_act_bytes < per_etp[4].stored_act_bytes


def _plan(etp: int | None, **config: object) -> dict:
    layout: dict[str, object] = {"tp": 4, "pp": 4, "ep": 8, "micro_batch_size": 1, "recompute": "full", **config}
    if etp is not None:
        layout["etp"] = etp
    req = {"model": {"preset": "mixtral-8x22b"},
           "training": {"seq_len": 4096, "global_batch_size": 1024, "framework": "megatron-lm"},
           "cluster": {"preset": "dgx-h100", "num_gpus": 256}, "config": layout}  # fmt: skip
    return evaluate(EvaluateRequest.model_validate(req)).model_dump()


def test_evaluate_etp_one_is_the_default_and_weights_fall_with_etp() -> None:
    assert _plan(None) == _plan(1)
    plans = {etp: _plan(etp) for etp in (1, 2, 4)}
    weights = [plans[e]["memory_gib"]["weights"] for e in (1, 2, 4)]
    assert weights[0] > weights[1] > weights[2]
    assert [plans[e]["config"]["etp"] for e in (1, 2, 4)] == [1, 2, 4]
    # the expert-TP collectives and the EP group spread over two nodes at etp 2: more EP time
    assert plans[2]["time_breakdown_s"]["ep_comm"] > plans[1]["time_breakdown_s"]["ep_comm"]
    # the dense parts do not change
    assert plans[1]["time_breakdown_s"]["tp_comm"] == plans[4]["time_breakdown_s"]["tp_comm"]


def test_dims_default_etp_is_one() -> None:
    d = Dims(2, 1, 8, 1, True, "selective")
    assert d.etp == 1
