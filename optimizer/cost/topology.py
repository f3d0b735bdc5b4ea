"""Network tiers of a cluster and where each parallel axis's process groups fall on them.

Tiers are nested domains, innermost first: ``nvlink`` (the scale-up domain), ``leaf`` (a
rail-optimised leaf group), ``spine`` (the whole job). A placement is the rank order of the axes
(innermost first, like Megatron's ``tp-cp-ep-dp-pp``): an axis of size ``k`` whose inner axes
multiply to ``s`` forms groups of ranks ``r, r+s, ..., r+(k-1)s``, and a group crosses a tier when
``s*k`` exceeds that tier's span. Collectives then run hierarchically, one level per tier crossed,
each rank driving its own rail NIC on the levels outside the scale-up domain.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from hardware_catalog.schema import GpuEntry, NetworkEntry
from optimizer.calibration import DEFAULT, Calibration
from optimizer.cost.comm import Level
from optimizer.modes import Axis
from optimizer.rank_orders import is_pp_inside_dp
from optimizer.units import bits_to_bytes_per_s

ETP = "etp"
"""The expert tensor-parallel size's key in a layout's sizes (``rules.ResolvedLayout.sizes``)."""

GRID_AXES: tuple[str, ...] = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
"""Axes that tile the rank grid. EP groups re-tile the ``tp x cp x dp`` ranks."""


@dataclass(frozen=True)
class Tier:
    name: str
    span_gpus: int
    beta_bytes_per_s: float
    """Achievable per-GPU, per-direction bandwidth for collectives at this tier."""
    alpha_s: float


@dataclass(frozen=True, eq=False)
class Topology:
    """Compared and hashed by identity: one instance per job context (cheap cache keys)."""

    tiers: tuple[Tier, ...]
    num_gpus: int
    scale_up_mesh: bool
    """True for switchless scale-up (AMD xGMI): a group of n < domain gets (n-1)/(D-1) of the ring rate."""
    notes: tuple[str, ...] = ()

    @property
    def domain_size(self) -> int:
        return self.tiers[0].span_gpus


def effective_domain_size(num_gpus: int, domain: int) -> tuple[int, str | None]:
    """Scale-up domain size a job really gets.

    A job that is not a multiple of the domain spreads evenly over the fewest domains that
    divide it (256 GPUs on 72-GPU racks: 4 domains of 64).
    """
    if num_gpus <= domain:
        note = None if num_gpus == domain else f"job uses {num_gpus} GPUs of one {domain}-GPU NVLink domain"
        return num_gpus, note
    if num_gpus % domain == 0:
        return domain, None
    k = math.ceil(num_gpus / domain)
    while num_gpus % k:
        k += 1
    eff = num_gpus // k
    return eff, (
        f"{num_gpus} GPUs are not a multiple of the {domain}-GPU NVLink domain: assumed spread evenly "
        f"over {k} domains of {eff} GPUs"
    )


def scale_up_beta(gpu: GpuEntry) -> float:
    """Achievable per-GPU, per-direction collective bandwidth inside an NVLink domain."""
    return gpu.scale_up_bandwidth_per_dir_bytes_per_s.value * gpu.scale_up_busbw_fraction.value


def scale_out_beta(
    network: NetworkEntry, nics_per_node: int, gpus_per_node: int, port_rate_bits_per_s: float | None = None
) -> float:
    """Achievable per-GPU, per-direction collective bandwidth over the scale-out network (each
    NIC at ``port_rate_bits_per_s``, default the network's)."""
    rate = network.port_rate_bits_per_s.value if port_rate_bits_per_s is None else port_rate_bits_per_s
    return bits_to_bytes_per_s(rate) * network.busbw_fraction.value * nics_per_node / gpus_per_node


def build_topology(
    *,
    num_gpus: int,
    gpu: GpuEntry,
    network: NetworkEntry,
    gpus_per_node: int,
    nvlink_domain_size: int,
    nics_per_node: int,
    leaf_span_gpus: int,
    spine_oversubscription: float,
    cal: Calibration = DEFAULT,
) -> Topology:
    """Tiers of the cluster slice a job runs on."""
    domain, note = effective_domain_size(num_gpus, nvlink_domain_size)
    notes = [note] if note else []
    nvlink_beta = scale_up_beta(gpu)
    nic_beta = scale_out_beta(network, nics_per_node, gpus_per_node)
    leaf_span = max(domain, min(leaf_span_gpus, num_gpus) // domain * domain)
    tiers = [Tier("nvlink", domain, nvlink_beta, cal.scale_up_alpha_s)]
    if leaf_span > domain:
        tiers.append(Tier("leaf", leaf_span, nic_beta, network.latency_s.value))
    if num_gpus > leaf_span:
        tiers.append(Tier("spine", num_gpus, nic_beta / spine_oversubscription, 2 * network.latency_s.value))
    return Topology(tuple(tiers), num_gpus, gpu.scale_up_topology == "mesh", tuple(notes))


@dataclass(frozen=True, eq=False)
class GroupGeometry:
    """How one process group of an axis spreads over the tiers.

    Instances come from a cache keyed by (topology, stride, size), so identity is equality.
    """

    size: int
    levels: tuple[Level, ...]
    outermost_tier: str


def group_geometry(topo: Topology, stride: int, size: int) -> GroupGeometry:
    """Levels of a group of ``size`` ranks at ``stride`` (innermost level first)."""
    return _group_geometry(topo, stride, size)


def clear_geometry_cache() -> None:
    """Forget every cached group geometry, so the next ``group_geometry`` computes from scratch."""
    _group_geometry.cache_clear()


@lru_cache(maxsize=65536)
def _group_geometry(topo: Topology, stride: int, size: int) -> GroupGeometry:
    if size <= 1:
        return GroupGeometry(1, (), "none")
    levels: list[Level] = []
    inside = 1
    outermost = topo.tiers[0].name
    for tier in topo.tiers:
        reach = math.gcd(size, max(1, tier.span_gpus // stride)) if tier is not topo.tiers[-1] else size
        reach = max(reach, inside)
        if reach % inside:
            reach = math.lcm(reach, inside)
        ranks = reach // inside
        beta = tier.beta_bytes_per_s
        if tier is topo.tiers[0] and topo.scale_up_mesh and ranks < tier.span_gpus and tier.span_gpus > 1:
            beta = beta * (ranks - 1) / (tier.span_gpus - 1)
        if ranks > 1:
            levels.append(Level(ranks, beta, tier.alpha_s, own_links=tier.name == "nvlink"))
            outermost = tier.name
        inside = reach
        if inside >= size:
            break
    return GroupGeometry(size, tuple(levels), outermost)


@dataclass(frozen=True)
class AxisGroups:
    """The group geometry of every axis for one rank order."""

    order: tuple[str, ...]
    tp: GroupGeometry
    cp: GroupGeometry
    dp: GroupGeometry
    pp: GroupGeometry
    ep: GroupGeometry
    """Expert-parallel group (``ep`` ranks at stride ``etp`` inside the tp x cp x dp grid)."""
    dp_cp: GroupGeometry
    """The combined data-parallel x context-parallel group (distributed-optimizer sharding)."""
    edp: GroupGeometry
    """Expert-data-parallel group: ranks holding the same expert shards (tp*cp*dp / (etp*ep))."""
    etp: GroupGeometry
    """Expert tensor-parallel group: the innermost ``etp`` ranks of the tp x cp x dp grid."""
    tp_ep: GroupGeometry
    """The ``etp x ep`` expert block (contiguous): the flex and all-gather dispatchers' group."""

    def placement(self) -> dict[str, str]:
        return {
            Axis.TP: self.tp.outermost_tier,
            Axis.CP: self.cp.outermost_tier,
            Axis.EP: self.ep.outermost_tier,
            Axis.DP: self.dp.outermost_tier,
            Axis.PP: self.pp.outermost_tier,
        }


def axis_groups(topo: Topology, order: tuple[str, ...], sizes: dict[str, int]) -> AxisGroups:
    """Geometry of every axis when the grid axes are laid out in ``order`` (innermost first)."""
    stride: dict[str, int] = {}
    s = 1
    for axis in order:
        stride[axis] = s
        s *= sizes[axis]
    geo = {a: group_geometry(topo, stride[a], sizes[a]) for a in GRID_AXES}
    # As in Megatron-Core (expert order etp-ep-edp-pp), the expert grid re-tiles the tp x cp x dp
    # ranks: expert-TP groups take the innermost ``etp`` of those ranks, EP groups stride ``etp``,
    # and the expert-data-parallel group the rest (stride ``etp * ep``).
    inner = min(stride[a] for a in (Axis.TP, Axis.CP, Axis.DP))
    ep = sizes[Axis.EP]
    etp = sizes.get(ETP, 1)
    ep_geo = group_geometry(topo, inner * etp, ep)
    edp = sizes[Axis.TP] * sizes[Axis.CP] * sizes[Axis.DP] // (etp * ep)
    if is_pp_inside_dp(order, sizes):  # Megatron's tp-cp-ep-pp-dp: etp-ep-pp-edp, edp = dp
        edp_geo = group_geometry(topo, stride[Axis.DP], edp)
    else:
        edp_geo = group_geometry(topo, inner * etp * ep, edp)
    etp_geo = group_geometry(topo, inner, etp)
    tp_ep_geo = group_geometry(topo, inner, etp * ep)
    # Dense data-parallel sharding group: cp x dp (contiguous when the two axes are adjacent).
    adjacent = abs(order.index(Axis.CP) - order.index(Axis.DP)) == 1
    data_stride = min(stride[Axis.CP], stride[Axis.DP]) if adjacent else stride[Axis.DP]
    dp_cp_geo = group_geometry(topo, data_stride, sizes[Axis.CP] * sizes[Axis.DP]) if adjacent else geo[Axis.DP]
    return AxisGroups(
        order, geo[Axis.TP], geo[Axis.CP], geo[Axis.DP], geo[Axis.PP], ep_geo, dp_cp_geo, edp_geo, etp_geo, tp_ep_geo
    )


def every_order(sizes: dict[str, int]) -> list[tuple[str, ...]]:
    """Every distinct rank order of the grid axes (axes of size 1 do not matter): the tests hold
    the search's lower bounds below all of them (a stronger check than the orders plans are costed
    in, ``JobContext.rank_orders``)."""
    active = [a for a in GRID_AXES if sizes[a] > 1]
    idle = [a for a in GRID_AXES if sizes[a] == 1]
    return [tuple(idle) + perm for perm in itertools.permutations(active)] or [tuple(GRID_AXES)]
