"""Expert dispatch traffic leaving the node runs at ``scale_out_all_to_all_efficiency`` of the
scale-out link's bandwidth (``cost.dispatch``)."""

from __future__ import annotations

import pytest

from optimizer.cost.comm import Level
from optimizer.cost.dispatch import dispatch_time_s, scale_out_derated

NVLINK = Level(ranks=8, beta_bytes_per_s=360e9, alpha_s=0.0, own_links=True)
NIC = Level(ranks=4, beta_bytes_per_s=47e9, alpha_s=0.0, own_links=False)


def test_only_scale_out_levels_are_derated() -> None:
    inner, outer = scale_out_derated((NVLINK, NIC), 0.7)
    assert inner == NVLINK
    assert outer.beta_bytes_per_s == pytest.approx(0.7 * 47e9) and outer.ranks == 4
    assert scale_out_derated((NVLINK, NIC), 1.0) == (NVLINK, NIC)


def test_alltoall_over_four_nodes_hand_computed() -> None:
    """Qwen3-235B's EP32 over 4 nodes, 2,048 tokens of 4,096 a rank, top-8, bf16: each rank sends
    2048 x 8 x 4096 x 2 B x 31/32 = 130 MB spread over 31 peers; 24 of them are on other nodes,
    so 101 MB leave through the NIC: at 47 GB/s 2.15 ms, at 0.7 of it 3.07 ms (NVLink's share,
    29 MB at 360 GB/s, is shorter)."""
    sent = 2048 * 8 * 4096 * 2.0 * 31 / 32
    over_nic = sent * 24 / 31
    full, _ = dispatch_time_s("alltoall", 2048, 4096, 8, (NVLINK, NIC))
    derated, _ = dispatch_time_s("alltoall", 2048, 4096, 8, (NVLINK, NIC), scale_out_efficiency=0.7)
    assert full == pytest.approx(over_nic / 47e9)
    assert derated == pytest.approx(over_nic / (0.7 * 47e9))
    assert derated == pytest.approx(3.07e-3, rel=0.01)


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_inside_one_node_nothing_changes(dispatcher: str) -> None:
    one = dispatch_time_s(dispatcher, 2048, 4096, 8, (NVLINK,))
    assert dispatch_time_s(dispatcher, 2048, 4096, 8, (NVLINK,), scale_out_efficiency=0.7) == one


def test_allgather_dispatcher_runs_collectives_at_full_rate() -> None:
    one = dispatch_time_s("allgather", 2048, 4096, 8, (NVLINK, NIC))
    assert dispatch_time_s("allgather", 2048, 4096, 8, (NVLINK, NIC), scale_out_efficiency=0.7) == one


@pytest.mark.parametrize("efficiency", [0.5, 0.7, 0.9])
def test_deepep_rdma_stage_slows_no_more_than_the_rate(efficiency: float) -> None:
    full = dispatch_time_s("deepep", 2048, 4096, 8, (NVLINK, NIC))
    slow = dispatch_time_s("deepep", 2048, 4096, 8, (NVLINK, NIC), scale_out_efficiency=efficiency)
    for f, s in zip(full, slow, strict=True):
        assert f <= s <= f / efficiency * (1 + 1e-12)
