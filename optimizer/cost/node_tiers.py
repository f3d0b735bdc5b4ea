"""Network tiers of a job placed on named nodes (``cluster.topology`` with an ``assignment``).

The nodes are taken in rank order: rank = index x GPUs per node + local GPU. At each switch level
(coarsest first, down to the NVLink level) the job's GPUs fall into domains; a tier's span is the
greatest common divisor of the job's GPU counts in that level's domains. Ranks sorted by domain
then form aligned blocks of that span that each lie inside one domain, so a group the cost model
keeps inside a tier really is inside one domain of it. With equal counts per domain (a balanced
set) that is the exact topology; otherwise the model is pessimistic about the larger domains.

A tier one level above another is reached by crossing that finer level's domains, at that level's
link: the ``links`` entry for the finer level, by default the network's rate between NVLink
domains and that divided by the cluster's ``spine_oversubscription`` between coarser domains.
Traffic between coarser domains crosses the finer levels' switches too, so a coarser level's link
is taken as no faster (bandwidth no higher, latency no lower) than a finer level's.
Levels whose span equals the next finer one's are never crossed inside and drop out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from hardware_catalog.schema import GpuEntry, NetworkEntry
from optimizer.calibration import DEFAULT, Calibration
from optimizer.cost.topology import Tier, Topology, scale_out_beta, scale_up_beta
from optimizer.errors import InvalidLayout
from optimizer.specs import ClusterSpec
from optimizer.topology_spec import ClusterTopology, TopologyNode

ROOT_TIER = "cluster"
"""Name of the tier that joins domains of the coarsest level."""


@dataclass(frozen=True)
class LinkRate:
    beta_bytes_per_s: float
    alpha_s: float


def job_nodes(topo: ClusterTopology) -> list[TopologyNode]:
    """The assignment's nodes in rank order."""
    assert topo.assignment is not None
    by_name = {n.name: n for n in topo.nodes}
    return [by_name[x] for x in topo.assignment.nodes]


def level_spans(topo: ClusterTopology, nodes: list[TopologyNode], gpus_per_node: int) -> list[int]:
    """Tier span (GPUs) of each switch level, coarsest first: the largest block of consecutive
    ranks, aligned and dividing the job, every one of which lies inside one domain of the level
    (a multiple of the finer level's). For nodes sorted by domain that is the gcd of the job's
    GPU counts in the level's domains."""
    paths = [topo.path(n) for n in nodes]
    n = len(nodes)
    spans: list[int] = []
    finer = 1
    for depth in range(len(topo.switch_levels()) - 1, -1, -1):
        ids: dict[tuple[str, ...], int] = {}
        keys = np.array([ids.setdefault(p[: depth + 1], len(ids)) for p in paths])
        best = finer
        for b in range(finer, n + 1, finer):
            if n % b == 0:
                rows = keys.reshape(-1, b)
                if (rows == rows[:, :1]).all():
                    best = b
        spans.append(best * gpus_per_node)
        finer = best
    return spans[::-1]


def link_rates(c: ClusterSpec, network: NetworkEntry) -> dict[str, LinkRate]:
    """Bandwidth and latency between domains of each switch level."""
    topo = c.topology
    assert topo is not None and c.nics_per_node and c.gpus_per_node and c.spine_oversubscription
    given = {link.level: link for link in topo.links}
    rates = {}
    for level in topo.switch_levels():
        link = given.get(level)
        inner = level == topo.nvlink_level
        if link is not None and link.bandwidth_per_gpu_gbps is not None:
            beta = scale_out_beta(network, 1, 1, link.bandwidth_per_gpu_gbps * 1e9)
        else:
            beta = scale_out_beta(network, c.nics_per_node, c.gpus_per_node)
        over = link.oversubscription if link is not None and link.oversubscription is not None else None
        over = over if over is not None else (1.0 if inner else c.spine_oversubscription)
        alpha = link.latency_us * 1e-6 if link is not None and link.latency_us is not None else None
        alpha = alpha if alpha is not None else network.latency_s.value * (1 if inner else 2)
        rates[level] = LinkRate(beta / over, alpha)
    # Traffic between coarser domains also crosses the finer levels' switches: never faster.
    levels = topo.switch_levels()
    for j in range(len(levels) - 2, -1, -1):
        finer, this = rates[levels[j + 1]], rates[levels[j]]
        rates[levels[j]] = LinkRate(
            min(this.beta_bytes_per_s, finer.beta_bytes_per_s), max(this.alpha_s, finer.alpha_s)
        )
    return rates


def check_assignment(c: ClusterSpec) -> int:
    """GPUs per node of the assignment; a 4xx-style error when a node has fewer free."""
    topo = c.topology
    assert topo is not None and topo.assignment is not None and c.gpus_per_node
    g = topo.assignment.gpus_per_node or c.gpus_per_node
    if g > c.gpus_per_node:
        raise InvalidLayout(
            "cluster.topology.assignment.gpus_per_node", f"{g} is above gpus_per_node {c.gpus_per_node}"
        )
    for node in job_nodes(topo):
        if node.free_gpus < g:
            raise InvalidLayout(
                "cluster.topology.assignment.nodes",
                f"node {node.name!r} has {node.free_gpus} free GPUs, the job needs {g}",
            )
    n = len(topo.assignment.nodes) * g
    if c.num_gpus is not None and c.num_gpus != n:
        raise InvalidLayout(
            "cluster.num_gpus", f"{c.num_gpus} != {n}: {len(topo.assignment.nodes)} assigned nodes x {g} GPUs each"
        )
    return g


def node_topology(c: ClusterSpec, gpu: GpuEntry, network: NetworkEntry, cal: Calibration = DEFAULT) -> Topology:
    """Tiers of the job on its assigned nodes (innermost first)."""
    topo = c.topology
    assert topo is not None and topo.assignment is not None
    g = check_assignment(c)
    nodes = job_nodes(topo)
    num_gpus = len(nodes) * g
    levels = topo.switch_levels()
    spans = level_spans(topo, nodes, g)
    rates = link_rates(c, network)
    tiers = [Tier("nvlink", spans[-1], scale_up_beta(gpu), cal.scale_up_alpha_s)]
    # the tier of level j is reached by crossing level j+1's domains; the root by crossing level 0's
    reached = [(levels[j], spans[j], levels[j + 1]) for j in range(len(levels) - 2, -1, -1)]
    reached.append((ROOT_TIER, num_gpus, levels[0]))
    for name, span, crossed in reached:
        if span == tiers[-1].span_gpus:
            continue
        rate = rates[crossed]
        tiers.append(Tier(name, span, rate.beta_bytes_per_s, rate.alpha_s))
    notes = uneven_notes(topo, nodes, g, spans)
    return Topology(tuple(tiers), num_gpus, gpu.scale_up_topology == "mesh", tuple(notes))


def uneven_notes(topo: ClusterTopology, nodes: list[TopologyNode], g: int, spans: list[int]) -> list[str]:
    """Levels whose domains hold unequal shares of the job (costed at the gcd span)."""
    notes = []
    paths = [topo.path(n) for n in nodes]
    for depth, level in enumerate(topo.switch_levels()):
        counts = Counter(p[: depth + 1] for p in paths)
        if len(set(counts.values())) > 1:
            notes.append(
                f"the job's nodes are spread unevenly over {level} domains ({min(counts.values()) * g} to "
                f"{max(counts.values()) * g} GPUs): costed as domains of {spans[depth]} GPUs"
            )
    return notes
