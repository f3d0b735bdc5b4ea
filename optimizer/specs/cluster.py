"""The cluster spec: GPUs, network and topology, from a preset or explicit fields."""

from __future__ import annotations

from pydantic import Field, PrivateAttr, model_validator

from optimizer.errors import UnknownCatalogId
from optimizer.reference import current
from optimizer.specs.common import MAX_NUM_GPUS
from optimizer.strict_model import Strict
from optimizer.topology_spec import ClusterTopology


class ClusterSpec(Strict):
    """A cluster: a preset id plus ``num_gpus``, or explicit fields (which override the preset)."""

    preset: str | None = Field(default=None, max_length=200, description="Cluster preset id (GET /clusters).")
    num_gpus: int | None = Field(
        default=None, ge=1, le=MAX_NUM_GPUS, description="GPUs the job takes; with topology, omit to let /plan choose"
    )
    gpu: str | None = Field(default=None, max_length=200, description="GPU id (GET /gpus).")
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=1024, description="GPUs per server; default: the preset's, else 8."
    )
    nvlink_domain_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="GPUs joined by NVLink (scale-up domain); default: the preset's or the GPU's.",
    )
    network: str | None = Field(default=None, max_length=200, description="Scale-out fabric id (GET /networks).")
    nics_per_node: int | None = Field(
        default=None, ge=1, le=1024, description="Scale-out NICs per server; default: one per GPU."
    )
    leaf_span_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NUM_GPUS,
        description="GPUs under one leaf/rail group; default: the preset's, else 32 nodes.",
    )
    spine_oversubscription: float | None = Field(
        default=None,
        ge=1.0,
        le=64.0,
        description="Spine tier oversubscription (ratio, 1 = non-blocking); default: the preset's, else 1.",
    )
    gpu_power_limit_w: float | None = Field(
        default=None, ge=50, le=5000, description="Power cap per GPU (W); below the TDP it lowers sustained clocks"
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        ge=4,
        le=4096,
        description=(
            "Override the GPU's usable memory (e.g. a 94/96 GB part), at least 4 GiB (the search keeps 1 GiB "
            "of headroom by default); default: catalog"
        ),
    )
    gemm_efficiency: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Override the catalog's best large-GEMM fraction of the dense peak at the training precision "
            "(a MAMF-style sweep on your GPUs: best TFLOP/s / datasheet dense peak); every GEMM of the "
            "costing, and the board-power estimate, use it in place of the catalog's; default: catalog"
        ),
    )
    topology: ClusterTopology | None = Field(
        default=None, description="Free nodes and their labels: plan onto them (docs/scheduler.md)"
    )

    _given: frozenset[str] = PrivateAttr(default_factory=frozenset)

    @property
    def given_fields(self) -> frozenset[str]:
        """The fields the request gave (before the preset and defaults filled in the others)."""
        return self._given

    def _check_power_limit(self) -> None:
        """A power cap the GPU can run at: above its idle draw (capacity catalog), at most its TDP."""
        limit = self.gpu_power_limit_w
        if limit is None:
            return
        ref = current()
        tdp = ref.catalog.gpus[self.gpu or ""].tdp_w.value
        idle = ref.capacity.gpus[self.gpu or ""].idle_power_w.value
        if limit > tdp:
            raise ValueError(f"cluster.gpu_power_limit_w: {limit:g} W is above {self.gpu}'s TDP ({tdp:g} W), its most")
        if limit <= idle:
            raise ValueError(
                f"cluster.gpu_power_limit_w: {limit:g} W is not above {self.gpu}'s idle draw ({idle:g} W): it could not run"
            )

    @property
    def resolved_num_gpus(self) -> int:
        """``num_gpus`` of a job being costed: given, or chosen from ``topology`` before costing."""
        assert self.num_gpus is not None, "cluster.num_gpus is set before a job is costed"
        return self.num_gpus

    @model_validator(mode="after")
    def _resolve(self) -> ClusterSpec:
        if not self._given:  # the first pass: the request's own fields (a job built from it runs this again)
            self._given = frozenset(self.model_fields_set)
        cat = current().catalog
        leaf_given = "leaf_span_gpus" in self.model_fields_set  # before the defaults below set it
        if self.preset is not None:
            if self.preset not in cat.clusters:
                raise ValueError(str(UnknownCatalogId("cluster preset", self.preset, list(cat.clusters))))
            c = cat.clusters[self.preset]
            self.gpu = self.gpu or c.gpu
            self.gpus_per_node = self.gpus_per_node or c.gpus_per_node
            self.nvlink_domain_size = self.nvlink_domain_size or c.nvlink_domain_size
            self.network = self.network or c.network
            self.nics_per_node = self.nics_per_node or c.nics_per_node
            leaf = next((t for t in c.tiers if t.name == "leaf"), None)
            spine = c.tiers[-1]
            if self.leaf_span_gpus is None and leaf is not None:
                self.leaf_span_gpus = leaf.span_gpus
            if self.spine_oversubscription is None:
                self.spine_oversubscription = spine.oversubscription
        if self.gpu is None:
            raise ValueError("give a cluster preset or a gpu id")
        if self.gpu not in cat.gpus:
            raise ValueError(str(UnknownCatalogId("gpu", self.gpu, list(cat.gpus))))
        gpu = cat.gpus[self.gpu]
        self._check_power_limit()
        if self.network is None:
            self.network = "ib-ndr-400"
        if self.network not in cat.networks:
            raise ValueError(str(UnknownCatalogId("network", self.network, list(cat.networks))))
        self.gpus_per_node = self.gpus_per_node or min(8, gpu.default_nvlink_domain_size)
        self.nvlink_domain_size = self.nvlink_domain_size or gpu.default_nvlink_domain_size
        self.nics_per_node = self.nics_per_node or self.gpus_per_node
        if self.nvlink_domain_size % self.gpus_per_node and self.gpus_per_node % self.nvlink_domain_size:
            raise ValueError(
                f"nvlink_domain_size ({self.nvlink_domain_size}) and gpus_per_node ({self.gpus_per_node}) "
                "must divide one another"
            )
        if self.spine_oversubscription is None:
            self.spine_oversubscription = 1.0
        if self.leaf_span_gpus is None:
            self.leaf_span_gpus = 32 * max(self.gpus_per_node, 8)
        if leaf_given and self.leaf_span_gpus < self.nvlink_domain_size:
            raise ValueError(
                f"cluster.leaf_span_gpus: {self.leaf_span_gpus} is below nvlink_domain_size ({self.nvlink_domain_size}): "
                "a leaf switch group spans whole NVLink domains"
            )
        self.leaf_span_gpus = max(self.leaf_span_gpus, self.nvlink_domain_size)  # a default below a large domain
        if self.num_gpus is None and self.topology is None:
            raise ValueError("cluster.num_gpus: required unless cluster.topology is given")
        if self.topology is not None:
            over = next((n for n in self.topology.nodes if n.free_gpus > self.gpus_per_node), None)
            if over is not None:
                raise ValueError(
                    f"topology.nodes: node {over.name!r} has {over.free_gpus} free GPUs, more than gpus_per_node "
                    f"({self.gpus_per_node})"
                )
            self._check_nvlink_domains()
            assigned = self.topology.assignment
            if assigned is not None and self.num_gpus is not None:
                g = assigned.gpus_per_node or self.gpus_per_node
                if len(assigned.nodes) * g != self.num_gpus:
                    raise ValueError(
                        f"cluster.num_gpus: {self.num_gpus} disagrees with topology.assignment ({len(assigned.nodes)} nodes "
                        f"x {g} GPUs = {len(assigned.nodes) * g}); omit num_gpus or make them agree"
                    )
        return self

    def _check_nvlink_domains(self) -> None:
        """No NVLink domain of the topology (its nodes' ``nvlink_level`` label, the hostname's value
        by default) holds more GPUs than the hardware's ``nvlink_domain_size``: a clique label on
        too many nodes, or two nodes with one hostname label, would cost their traffic at NVLink
        rates."""
        assert self.topology is not None and self.gpus_per_node and self.nvlink_domain_size
        topo = self.topology
        path, count = topo.largest_nvlink_domain()
        if count > max(1, self.nvlink_domain_size // self.gpus_per_node):  # a node may hold several domains
            raise ValueError(
                f"topology.nodes: {count} nodes ({count * self.gpus_per_node} GPUs) share the NVLink domain "
                f"{topo.nvlink_level} = {path[-1]!r}, more than nvlink_domain_size ({self.nvlink_domain_size})"
            )
