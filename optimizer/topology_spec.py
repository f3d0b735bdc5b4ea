"""``cluster.topology``: the free nodes a scheduler offers, in its own vocabulary (request side).

Levels are node-label keys from the coarsest to the finest, as in Kueue's
``Topology.spec.levels`` (zone, block, rack, hostname). ``nvlink_level`` names the level whose
domains are NVLink (scale-up) domains: the hostname on 8-GPU servers, a clique label such as
``nvidia.com/gpu.clique`` on GB200 NVL72. Levels finer than it do not change any bandwidth.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from optimizer.strict_model import Strict

HOSTNAME_LABEL = "kubernetes.io/hostname"
"""A node's own domain: when no node carries this label, its value is the node's name."""

SLURM_BLOCK_LEVEL = "slurm/block"
"""The base-block level of a Slurm ``topology/block`` topology (``pplan topology from-slurm``); its
higher block levels are ``slurm/block-<nodes>``."""
SLURM_SWITCH_PREFIX = "slurm/switch-"
"""The switch levels of a Slurm ``topology/tree`` topology (``slurm/switch-1`` is the root's)."""
VOLCANO_TIER_PREFIX = "volcano/tier-"
"""The levels of a Volcano HyperNode topology (``pplan topology from-volcano``): ``volcano/tier-<n>``."""

MAX_TOPOLOGY_NODES = 16_384
MAX_LEVELS = 8
MAX_LEVEL_NAME = 317
"""Longest level name (and so placement tier name): a Kubernetes label key at most (a
253-character prefix, '/', a 63-character name)."""
LevelName = Annotated[str, Field(min_length=1, max_length=MAX_LEVEL_NAME)]


NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
"""A host name (Kubernetes' DNS-1123 names, Slurm NodeNames; ``_`` for Slurm): node names go into
Slurm host lists, hostfiles and shell commands (``assignment``), where other characters would
split, expand or run."""
MAX_NODE_LABELS = 64


class TopologyNode(Strict):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Node name (Slurm NodeName, Kubernetes node): letters, digits, '.', '_' and '-', "
        "starting with a letter or digit and not ending with '.' or '-'",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_NODE_LABELS,
        description="Level label key -> domain value (e.g. rack -> r12).",
    )
    free_gpus: int = Field(ge=0, le=1024, description="GPUs free on this node now.")

    @field_validator("name")
    @classmethod
    def _host_name(cls, name: str) -> str:
        if NODE_NAME.fullmatch(name) is None:
            raise ValueError(
                "a node name takes letters, digits, '.', '_' and '-' only, starting with a letter or digit and "
                "not ending with '.' or '-' (it goes into Slurm host lists, hostfiles and shell commands)"
            )
        return name


class LevelLink(Strict):
    """The network between different domains of one level (e.g. between racks)."""

    level: LevelName = Field(description="The level (one of topology.levels) whose domains this link joins.")
    bandwidth_per_gpu_gbps: float | None = Field(
        default=None,
        gt=0,
        le=1e5,
        description="Line rate per GPU (Gbit/s per direction); default: the network's port rate x NICs / GPUs per node",
    )
    oversubscription: float | None = Field(
        default=None,
        ge=1.0,
        le=64.0,
        description="Oversubscription (ratio); default: 1 between NVLink domains, the cluster's spine_oversubscription above",
    )
    latency_us: float | None = Field(
        default=None,
        gt=0,
        le=1e4,
        description="One-way latency (us); default: the network's (twice it above the NVLink level's switches)",
    )


class NodeAssignment(Strict):
    """The nodes a job runs on, in rank order (a plan's ``assignment`` gives them)."""

    nodes: list[str] = Field(min_length=1, max_length=MAX_TOPOLOGY_NODES, description="Node names in rank order.")
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=1024, description="GPUs used on each; default: the cluster's"
    )


class ClusterTopology(Strict):
    levels: list[LevelName] = Field(
        min_length=1,
        max_length=MAX_LEVELS + 1,  # MAX_LEVELS, and kubernetes.io/hostname (``_check``)
        description=f"node-label keys, coarsest first, at most {MAX_LEVELS} besides kubernetes.io/hostname "
        "(which is added last when nvlink_level is it)",
    )
    nvlink_level: LevelName = Field(default=HOSTNAME_LABEL, description="The level whose domains are NVLink domains.")
    nodes: list[TopologyNode] = Field(
        min_length=1, max_length=MAX_TOPOLOGY_NODES, description="The free nodes, with their labels and free GPUs."
    )
    links: list[LevelLink] = Field(
        default_factory=list,
        max_length=MAX_LEVELS,
        description="Network between domains per level; default: from the cluster.",
    )
    assignment: NodeAssignment | None = Field(
        default=None, description="/evaluate: score the layout on these nodes (rank order); /plan: plan on them only"
    )

    @model_validator(mode="after")
    def _check(self) -> ClusterTopology:
        if len([lv for lv in self.levels if lv != HOSTNAME_LABEL]) > MAX_LEVELS:
            raise ValueError(f"topology.levels: at most {MAX_LEVELS} levels besides {HOSTNAME_LABEL}")
        if self.nvlink_level == HOSTNAME_LABEL and HOSTNAME_LABEL not in self.levels:
            self.levels = [*self.levels, HOSTNAME_LABEL]  # every node is its own finest domain
        if len(set(self.levels)) != len(self.levels):
            raise ValueError("topology.levels: a level is listed twice")
        if HOSTNAME_LABEL in self.levels[:-1]:
            raise ValueError(
                f"topology.levels: {HOSTNAME_LABEL} is the finest level, so the last (levels go coarsest first)"
            )
        if self.nvlink_level not in self.levels:
            raise ValueError(
                f"topology.nvlink_level: {self.nvlink_level!r} is not one of topology.levels {self.levels}"
            )
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted(name for name, count in Counter(names).items() if count > 1)[:3]
            raise ValueError(f"topology.nodes: node names must be unique ({dup} repeat)")
        for node in self.nodes:
            missing = [lv for lv in self.switch_levels() if lv != HOSTNAME_LABEL and lv not in node.labels]
            if missing:
                raise ValueError(f"topology.nodes: node {node.name!r} has no label {missing[0]!r}")
        repeated = [lv for lv, n in Counter(link.level for link in self.links).items() if n > 1]
        if repeated:
            raise ValueError(f"topology.links: level {repeated[0]!r} is given twice")
        for link in self.links:
            if link.level not in self.switch_levels():
                raise ValueError(
                    f"topology.links: level {link.level!r} is not one of {self.switch_levels()} "
                    "(levels from the coarsest down to nvlink_level)"
                )
        if self.assignment is not None:
            known = set(names)
            bad = [x for x in self.assignment.nodes if x not in known]
            if bad:
                raise ValueError(f"topology.assignment.nodes: {bad[0]!r} is not in topology.nodes")
            if len(set(self.assignment.nodes)) != len(self.assignment.nodes):
                raise ValueError("topology.assignment.nodes: a node is listed twice")
        return self

    def largest_nvlink_domain(self) -> tuple[tuple[str, ...], int]:
        """(path, node count) of the NVLink domain (``nvlink_level`` value) with the most nodes."""
        return max(Counter(self.path(n) for n in self.nodes).items(), key=lambda kv: kv[1])

    def switch_levels(self) -> list[str]:
        """Levels from the coarsest down to (and including) ``nvlink_level``."""
        return self.levels[: self.levels.index(self.nvlink_level) + 1]

    def path(self, node: TopologyNode) -> tuple[str, ...]:
        """The node's domain at each switch level (coarsest first)."""
        return tuple(
            node.labels.get(lv, node.name) if lv == HOSTNAME_LABEL else node.labels[lv] for lv in self.switch_levels()
        )
