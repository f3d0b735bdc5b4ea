"""What a scheduler and a launcher need from a plan on named nodes: ``Plan.assignment``."""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter

import hostlist

from optimizer.assignment_results import (
    Assignment,
    KueueDomain,
    KueueIndividualValues,
    KueueLevelValues,
    KueuePodCounts,
    KueueRequest,
    KueueSlice,
    KueueTopologyAssignment,
    KueueTopologyAssignmentV1Beta2,
    LauncherFiles,
    SlurmRequest,
    VolcanoNetworkTopology,
    VolcanoPartitionPolicy,
    VolcanoRequest,
)
from optimizer.cost.node_tiers import ROOT_TIER
from optimizer.topology_spec import (
    HOSTNAME_LABEL,
    SLURM_BLOCK_LEVEL,
    SLURM_SWITCH_PREFIX,
    VOLCANO_TIER_PREFIX,
    ClusterTopology,
    TopologyNode,
)

KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
MASTER_PORT = 29500


def axis_levels(topo: ClusterTopology, placement: dict[str, str]) -> dict[str, str]:
    """The plan's tier names as topology levels (the NVLink tier is ``nvlink_level``)."""
    return {axis: topo.nvlink_level if tier == "nvlink" else tier for axis, tier in placement.items()}


def domain_counts(topo: ClusterTopology, nodes: list[TopologyNode]) -> list[Counter]:
    """Nodes per domain at each switch level (coarsest first)."""
    paths = [topo.path(n) for n in nodes]
    return [Counter(p[: d + 1] for p in paths) for d in range(len(topo.switch_levels()))]


def equal_share(per_domain: Counter) -> int | None:
    """The nodes each domain gives when the job spans several domains of a level and each gives
    the same number (Slurm's ``--segment``, Kueue's slice size, Volcano's partition size), else None."""
    shares = set(per_domain.values())
    return shares.pop() if len(per_domain) > 1 and len(shares) == 1 else None


def slurm_request(topo: ClusterTopology, nodes: list[TopologyNode], g: int) -> SlurmRequest:
    """sbatch options that ask Slurm for exactly ``nodes``: ``--segment`` only where the block
    plugin needs it to allocate them (``block_segment``), ``--switches`` only where the tree plugin
    reads it (a ``topology/block`` topology ignores it, a ``topology/tree`` one ignores ``--segment``)."""
    names = [n.name for n in nodes]
    nodelist = hostlist.collect_hostlist(names)
    if re.search(r"\][^,]", nodelist):  # text after a range: Slurm before 23.02.5 refuses it (hostlist.c)
        nodelist = ",".join(names)
    counts = domain_counts(topo, nodes)
    leaf = counts[-2] if len(counts) >= 2 else Counter({(): len(nodes)})
    block = SLURM_BLOCK_LEVEL in topo.levels
    tree = any(lv.startswith(SLURM_SWITCH_PREFIX) for lv in topo.levels)
    if block:
        segment = block_segment(nodes)
    else:
        segment = None if tree else equal_share(leaf)
    opts = [f"--nodes={len(nodes)}", f"--ntasks-per-node={g}", f"--gpus-per-node={g}", f"--nodelist={nodelist}"]
    if segment is not None:
        opts.append(f"--segment={segment}")
    if not block:
        opts.append(f"--switches={len(leaf)}")
    return SlurmRequest(nodelist=nodelist, nodes=len(nodes), segment=segment, switches=len(leaf), sbatch=" ".join(opts))


def block_segment(nodes: list[TopologyNode]) -> int | None:
    """``--segment`` for a Slurm ``topology/block`` request of exactly ``nodes`` (``--nodelist``):
    None when they lie in one base block; else the greatest common divisor of the nodes taken
    from each base block. Without segments Slurm looks for the whole job in one block of the level
    its size calls for and refuses a nodelist that leaves it, or that touches more base blocks than
    that size needs (``eval_nodes_block.c``: "requires nodes that do not have shared block", the
    llblock limit); with them it places each segment in one base block among the listed nodes,
    which every base block's share, a multiple of the segment, allows."""
    shares = Counter(node.labels.get(SLURM_BLOCK_LEVEL, "") for node in nodes)
    return math.gcd(*shares.values()) if len(shares) > 1 else None


def kueue_request(topo: ClusterTopology, nodes: list[TopologyNode]) -> KueueRequest:
    levels = topo.switch_levels()
    counts = domain_counts(topo, nodes)
    annotations: dict[str, str] = {}
    # not the hostname, which Kueue refuses unless the user's Topology lists it (from-kueue adds it)
    inside = [lv for lv, c in zip(levels, counts, strict=True) if len(c) == 1 and lv != HOSTNAME_LABEL]
    if inside:  # the finest level one of whose domains holds the whole job
        annotations[KUEUE_REQUIRED] = inside[-1]
    elif levels[0] != HOSTNAME_LABEL:
        annotations[KUEUE_PREFERRED] = levels[0]
    # slices at the finest level above the nodes: the leaf switch, or the NVLink domain (an NVL72
    # clique) when that is not the node itself
    leaf = len(levels) - 2 if levels[-1] == HOSTNAME_LABEL else len(levels) - 1
    if leaf >= 0 and (size := equal_share(counts[leaf])) is not None:
        annotations[KUEUE_SLICE_REQUIRED] = levels[leaf]
        annotations[KUEUE_SLICE_SIZE] = str(size)
    full = topo.levels
    per_domain: Counter = Counter()
    for n in nodes:
        per_domain[
            tuple(n.labels.get(lv, n.name) if lv == HOSTNAME_LABEL else n.labels.get(lv, "") for lv in full)
        ] += 1
    domains = [KueueDomain(values=list(k), count=v) for k, v in per_domain.items()]
    return KueueRequest(
        annotations=annotations,
        topology_assignment=KueueTopologyAssignment(levels=full, domains=domains),
        topology_assignment_v1beta2=kueue_v1beta2(full, domains),
    )


def kueue_v1beta2(levels: list[str], domains: list[KueueDomain]) -> KueueTopologyAssignmentV1Beta2:
    """``domains`` as one v1beta2 slice (``apis/kueue/v1beta2/workload_types.go``
    ``TopologyAssignmentSlice``): per level one ``universal`` value when every domain has it, else
    the domains' values in order; pod counts the same way."""
    columns = [[d.values[i] for d in domains] for i in range(len(levels))]
    values = [
        KueueLevelValues(universal=col[0]) if len(set(col)) == 1 else KueueLevelValues(
            individual=KueueIndividualValues(roots=col)
        )
        for col in columns
    ]  # fmt: skip
    counts = [d.count for d in domains]
    pods = KueuePodCounts(universal=counts[0]) if len(set(counts)) == 1 else KueuePodCounts(individual=counts)
    slices = [KueueSlice(domainCount=len(domains), valuesPerLevel=values, podCounts=pods)] if domains else []
    return KueueTopologyAssignmentV1Beta2(levels=levels, slices=slices)


def volcano_request(topo: ClusterTopology, nodes: list[TopologyNode]) -> VolcanoRequest | None:
    """A Volcano Job's network topology for ``nodes`` on a HyperNode topology (levels
    ``volcano/tier-<n>``; None on others): hard at the lowest tier one HyperNode of which holds them
    all (Volcano's ``highestTierAllowed``), soft when none does; a partition policy at the lowest
    tier when each of its HyperNodes the job touches gives the same number of nodes."""
    tiers = {lv: int(lv.removeprefix(VOLCANO_TIER_PREFIX)) for lv in topo.levels if lv.startswith(VOLCANO_TIER_PREFIX)}
    if not tiers:
        return None
    counts = dict(zip(topo.switch_levels(), domain_counts(topo, nodes), strict=True))
    holding = [tiers[lv] for lv in tiers if lv in counts and len(counts[lv]) == 1]
    whole = VolcanoNetworkTopology(mode="hard", highestTierAllowed=min(holding)) if holding else None
    lowest = min(tiers, key=lambda lv: tiers[lv])
    partition = None
    if lowest in counts and (size := equal_share(counts[lowest])) is not None:
        partition = VolcanoPartitionPolicy(
            totalPartitions=len(nodes) // size,
            partitionSize=size,
            networkTopology=VolcanoNetworkTopology(mode="hard", highestTierAllowed=tiers[lowest]),
        )
    return VolcanoRequest(network_topology=whole or VolcanoNetworkTopology(mode="soft"), partition_policy=partition)


def launcher_files(nodes: list[TopologyNode], g: int) -> LauncherFiles:
    first = nodes[0].name
    hostfile = "".join(f"{n.name} slots={g}\n" for n in nodes)
    torchrun = (
        f"--nnodes={len(nodes)} --nproc-per-node={g} --node-rank=$NODE_RANK "
        f"--master-addr={first} --master-port={MASTER_PORT}"
    )
    names = " ".join(shlex.quote(n.name) for n in nodes)
    node_rank = (
        f'NODE_RANK=; i=0; for h in {names}; do if [ "$h" = "$SLURMD_NODENAME" ]; then NODE_RANK=$i; fi; '
        'i=$((i + 1)); done; : "${NODE_RANK:?SLURMD_NODENAME is not one of the plan nodes}"'
    )
    return LauncherFiles(
        master_addr=first,
        nnodes=len(nodes),
        nproc_per_node=g,
        hostfile=hostfile,
        torchrun=torchrun,
        slurm_node_rank=node_rank,
    )


def build_assignment(
    topo: ClusterTopology, nodes: list[TopologyNode], g: int, placement: dict[str, str], compared: int
) -> Assignment:
    counts = domain_counts(topo, nodes)
    used = {lv: len(c) for lv, c in zip(topo.switch_levels(), counts, strict=True)}
    return Assignment(
        nodes=[n.name for n in nodes],
        gpus_per_node=g,
        axis_levels=axis_levels(topo, placement),
        domains_used=used,
        slurm=slurm_request(topo, nodes, g),
        kueue=kueue_request(topo, nodes),
        volcano=volcano_request(topo, nodes),
        launcher=launcher_files(nodes, g),
        candidates_compared=compared,
    )


__all__ = ["ROOT_TIER", "build_assignment"]
