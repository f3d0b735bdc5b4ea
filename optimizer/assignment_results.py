"""Typed results for plans on named nodes: which nodes, in which rank order, and how to ask the
scheduler for them (``Plan.assignment``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SlurmRequest(_Out):
    nodelist: str = Field(description="Compressed hostlist of the chosen nodes (--nodelist).")
    nodes: int
    segment: int | None = Field(
        default=None,
        description="--segment (topology/block). On a Slurm block topology (levels from `pplan topology from-slurm`): "
        "set when the nodes span several base blocks (Slurm allocates such a --nodelist only in segments, each in "
        "one base block), to the largest size that divides every base block's share. "
        "On other topologies: nodes per domain of the level above the NVLink level, when every such domain gives the "
        "same number; never on a Slurm tree topology (which ignores it)",
    )
    switches: int = Field(
        description="--switches (topology/tree): leaf-level domains the job spans (not in sbatch on a Slurm block "
        "topology, which ignores it)"
    )
    sbatch: str = Field(description="sbatch/srun options that ask for this placement")


class KueueDomain(_Out):
    values: list[str]
    count: int = Field(description="pods (one per node)")


class KueueTopologyAssignment(_Out):
    levels: list[str]
    domains: list[KueueDomain]


class KueueIndividualValues(_Out):
    roots: list[str]


class KueueLevelValues(_Out):
    """One level's values in a v1beta2 slice: one value for every domain, or one per domain."""

    universal: str | None = None
    individual: KueueIndividualValues | None = None

    @model_serializer(mode="wrap")
    def _one_of(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Kueue's CRD takes exactly one of the two: the other is left out, not null."""
        return {k: v for k, v in handler(self).items() if v is not None}


class KueuePodCounts(_Out):
    universal: int | None = None
    individual: list[int] | None = None

    @model_serializer(mode="wrap")
    def _one_of(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class KueueSlice(_Out):
    domainCount: int  # noqa: N815 (Kueue's field names)
    valuesPerLevel: list[KueueLevelValues]  # noqa: N815
    podCounts: KueuePodCounts  # noqa: N815


class KueueTopologyAssignmentV1Beta2(_Out):
    levels: list[str]
    slices: list[KueueSlice]


class KueueRequest(_Out):
    annotations: dict[str, str] = Field(description="pod-set annotations of the job's pod template")
    topology_assignment: KueueTopologyAssignment = Field(
        description="the placement in the shape of Kueue's v1beta1 TopologyAssignment (levels + domains with pod "
        "counts; every level, for reading: Kueue's own assignment keeps only kubernetes.io/hostname when present)"
    )
    topology_assignment_v1beta2: KueueTopologyAssignmentV1Beta2 = Field(
        description="the same placement in the shape of Kueue's v1beta2 TopologyAssignment (its storage version "
        "since 0.16: what kubectl shows), one slice of every domain: a level's values as `universal` when all "
        "domains share it, else `individual.roots`; pod counts likewise"
    )


class VolcanoNetworkTopology(_Out):
    """A Volcano Job's ``spec.networkTopology`` (or a partition's), with Volcano's field names."""

    mode: Literal["hard", "soft"]
    highestTierAllowed: int | None = Field(  # noqa: N815 (Volcano's field name)
        default=None, description="hard mode: the highest HyperNode tier the pods may span (left out in soft mode)"
    )

    @model_serializer(mode="wrap")
    def _no_null_tier(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Volcano's CRD types ``highestTierAllowed`` as a non-null integer: soft mode leaves it out."""
        data: dict[str, Any] = handler(self)
        if data.get("highestTierAllowed") is None:
            data.pop("highestTierAllowed", None)
        return data


class VolcanoPartitionPolicy(_Out):
    """A Volcano task's ``partitionPolicy``: pods in partitions that each stay in one HyperNode."""

    totalPartitions: int  # noqa: N815 (Volcano's field names)
    partitionSize: int  # noqa: N815
    networkTopology: VolcanoNetworkTopology  # noqa: N815


class VolcanoRequest(_Out):
    network_topology: VolcanoNetworkTopology = Field(
        description="the Job's spec.networkTopology: hard, at the lowest tier one HyperNode of which holds every "
        "chosen node; soft when none does"
    )
    partition_policy: VolcanoPartitionPolicy | None = Field(
        default=None,
        description="the task's partitionPolicy when every lowest-tier HyperNode the job touches gives it the same "
        "number of nodes (one pod per node)",
    )


class LauncherFiles(_Out):
    master_addr: str = Field(description="MASTER_ADDR: the node of rank 0")
    nnodes: int
    nproc_per_node: int
    hostfile: str = Field(description="one 'name slots=N' line per node in node-rank order (DeepSpeed/MPI hostfile)")
    torchrun: str = Field(description="torchrun arguments; NODE_RANK is the node's index in nodes")
    slurm_node_rank: str = Field(
        description="shell line that sets NODE_RANK on a node of a Slurm job step from SLURMD_NODENAME (the node's "
        "index in nodes; Slurm's own SLURM_NODEID follows its node table, which need not be this order) and stops "
        "the script on a node not in nodes; put it in a script file: it lists every node"
    )


class Assignment(_Out):
    nodes: list[str] = Field(description="Chosen nodes in rank order: rank = index x gpus_per_node + local GPU.")
    gpus_per_node: int
    axis_levels: dict[str, str] = Field(
        description="axis -> outermost topology level its groups span ('none' for size 1; 'cluster' beyond the coarsest)"
    )
    domains_used: dict[str, int] = Field(description="level -> number of its domains the job touches")
    slurm: SlurmRequest
    kueue: KueueRequest
    volcano: VolcanoRequest | None = Field(
        default=None, description="Volcano Job settings, on a topology from `pplan topology from-volcano`"
    )
    launcher: LauncherFiles
    candidates_compared: int = Field(default=1, description="node sets whose plans were compared")
