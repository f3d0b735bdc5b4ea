"""``cluster.topology`` from Slurm's topology plugins: ``topology.yaml`` (tree and block, Slurm
23.11+) and the classic ``topology.conf`` (``SwitchName=`` lines of topology/tree, ``BlockName=``
and ``BlockSizes=`` lines of topology/block), read as Slurm reads them."""

from __future__ import annotations

from typing import Any

from api.documents import DocumentError, parse_yaml_all
from api.topology_convert import (
    MAX_EXPANDED_NODES,
    ConvertError,
    busy_names,
    check_busy_known,
    expand_hostlists,
    expect_mapping,
)
from api.topology_slurm_conf import looks_like_conf, parse_conf
from optimizer.topology_spec import HOSTNAME_LABEL, SLURM_BLOCK_LEVEL, SLURM_SWITCH_PREFIX

SWITCH_LEVEL = SLURM_SWITCH_PREFIX + "{depth}"
BLOCK_LEVEL = SLURM_BLOCK_LEVEL


def _pick_slurm(docs: Any, name: str | None) -> dict:
    if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
        raise ConvertError(
            "topology.yaml: expected a list of topologies ('- topology: <name>'), or a topology.conf of "
            "SwitchName= / BlockName= lines"
        )
    if name is not None:
        for d in (d for d in docs if d.get("topology") == name):
            if "tree" in d or "block" in d:
                return d
            raise ConvertError(f"topology.yaml: {name!r} is flat (no tree or block to place nodes by)")
        raise ConvertError(f"topology.yaml: no topology named {name!r} (have {[d.get('topology') for d in docs]})")
    for d in docs:
        if d.get("cluster_default") is True and ("tree" in d or "block" in d):
            return d
    for d in docs:
        if "tree" in d or "block" in d:
            return d
    raise ConvertError("topology.yaml: no tree or block topology")


def _mappings(value: Any, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ConvertError(f"{where}: expected a non-empty list")
    return [expect_mapping(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _tree_paths(tree: dict) -> dict[str, list[str]]:
    """Node -> switch names from the root down to its leaf switch."""
    switches = _mappings(tree.get("switches"), "tree.switches")
    parent: dict[str, str] = {}
    nodes_of: dict[str, list[str]] = {}
    budget = [MAX_EXPANDED_NODES]
    for sw in switches:
        name = sw.get("switch")
        if not isinstance(name, (str, int)) or isinstance(name, bool) or not str(name):
            raise ConvertError(f"tree.switches: a switch needs a 'switch' name, not {name!r}")
        name = str(name)
        if name in nodes_of:
            raise ConvertError(f"tree.switches: switch {name!r} is listed twice")
        for child in expand_hostlists(sw.get("children"), f"switch {name}: children", budget):
            if parent.setdefault(child, name) != name:
                raise ConvertError(f"tree.switches: switch {child!r} is a child of {parent[child]!r} and {name!r}")
        nodes_of[name] = _once(expand_hostlists(sw.get("nodes"), f"switch {name}: nodes", budget), f"switch {name}")
    if not any(nodes_of.values()):
        raise ConvertError("tree.switches: no switch lists nodes")
    undefined = sorted(set(parent) - set(nodes_of))
    if undefined:
        raise ConvertError(
            f"tree.switches: switch {parent[undefined[0]]!r} has child {undefined[0]!r}, which is not defined"
        )
    paths: dict[str, list[str]] = {}
    for leaf, nodes in nodes_of.items():
        chain = [leaf]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]])
            if len(chain) > len(switches):
                raise ConvertError(f"tree.switches: switch {leaf!r} is in a cycle")
        for node in nodes:
            if node in paths:
                raise ConvertError(f"tree.switches: node {node!r} is under switches {paths[node][-1]!r} and {leaf!r}")
            paths[node] = chain[::-1]
    return paths


def _tree_topology(tree: Any, gpus: int, busy: set[str]) -> dict:
    paths = _tree_paths(expect_mapping(tree, "tree"))
    depth = max(len(p) for p in paths.values())
    levels = [SWITCH_LEVEL.format(depth=d + 1) for d in range(depth)] + [HOSTNAME_LABEL]
    nodes = []
    for name, path in paths.items():
        full = path + [path[-1]] * (depth - len(path))  # a shallow leaf is its own domain below
        labels = {levels[d]: full[d] for d in range(depth)}
        nodes.append({"name": name, "labels": labels, "free_gpus": 0 if name in busy else gpus})
    return {"levels": levels, "nodes": nodes}


DEFAULT_BLOCK_LEVELS = (1, 2, 3, 4)
"""Higher block levels Slurm enables without ``block_sizes``: 2, 4, 8 and 16 base blocks
(``block_record.c``: ``bit_nset(block_levels, 0, 4)``)."""


def _aggregation_levels(sizes: list[int], base: int, count: int) -> list[int]:
    """The enabled higher block levels ``k`` (blocks of ``2**k`` consecutive base blocks), as Slurm
    records them: up to and including the first that spans every block (``block_record.c``)."""
    if not sizes:
        wanted = list(DEFAULT_BLOCK_LEVELS)
    else:
        wanted = []
        for s in sizes[1:]:
            ratio = s // base if base else 0
            if ratio < 2 or s % base or ratio & (ratio - 1):
                raise ConvertError(f"block.block_sizes: {s} is not the base size {base} times a power of two")
            wanted.append(ratio.bit_length() - 1)
    levels: list[int] = []
    for k in sorted(set(wanted)):
        if levels and 2 ** levels[-1] >= count:
            break
        levels.append(k)
    return levels


def _block_sizes(value: Any) -> list[int]:
    sizes = value if isinstance(value, list) else [] if value is None else None
    if sizes is None or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes):
        raise ConvertError(f"block.block_sizes: expected a list of node counts (whole numbers from 1), not {value!r}")
    return sizes


def _block_topology(block: Any, gpus: int, busy: set[str]) -> dict:
    blocks = _mappings(expect_mapping(block, "block").get("blocks"), "block.blocks")
    members_of: list[tuple[str, list[str]]] = []
    names: set[str] = set()
    budget = [MAX_EXPANDED_NODES]
    for b in blocks:
        name = str(b.get("block", ""))
        if not name:
            raise ConvertError("block.blocks: a block has no 'block' name")
        if name in names:
            raise ConvertError(f"block.blocks: block {name!r} is listed twice")
        names.add(name)
        members = _once(expand_hostlists(b.get("nodes"), f"block {name}: nodes", budget), f"block {name}")
        if not members:
            raise ConvertError(f"block.blocks: block {name!r} lists no nodes (Slurm refuses an empty block)")
        members_of.append((name, members))
    if not any(members for _, members in members_of):
        raise ConvertError("block.blocks: no block lists nodes")
    sizes = _block_sizes(block.get("block_sizes"))
    base = sizes[0] if sizes else max(len(m) for _, m in members_of)
    higher = _aggregation_levels(sizes, base, len(blocks))
    levels = [f"{BLOCK_LEVEL}-{base * 2**k}" for k in reversed(higher)] + [BLOCK_LEVEL, HOSTNAME_LABEL]
    nodes: list[dict[str, Any]] = []
    block_of: dict[str, str] = {}
    for index, (name, members) in enumerate(members_of):
        for node in members:
            if block_of.setdefault(node, name) != name:
                raise ConvertError(f"block.blocks: node {node!r} is in blocks {block_of[node]!r} and {name!r}")
        labels = {BLOCK_LEVEL: name}
        for k in higher:  # Slurm's aggregated block: 2**k consecutive base blocks, by block index
            labels[f"{BLOCK_LEVEL}-{base * 2**k}"] = f"{base * 2**k}n-{index // 2**k}"
        nodes.extend(
            {"name": node, "labels": dict(labels), "free_gpus": 0 if node in busy else gpus} for node in members
        )
    return {"levels": levels, "nodes": nodes}


def from_slurm(text: str, gpus_per_node: int, busy: str = "", name: str | None = None) -> dict:
    """``cluster.topology`` from a Slurm ``topology.yaml`` or ``topology.conf`` (``busy``: hostlist of
    nodes in use)."""
    if looks_like_conf(text):
        docs: Any = parse_conf(text)
    else:
        try:
            found = parse_yaml_all(text)
        except DocumentError as e:
            raise ConvertError(f"topology.yaml: {e}") from e
        if len(found) > 1:
            raise ConvertError(f"topology.yaml: expected one YAML document, found {len(found)}")
        docs = found[0] if found else None
    topo = _pick_slurm(docs, name)
    if "tree" in topo and "block" in topo:
        raise ConvertError(f"topology.yaml: topology {topo.get('topology')!r} has both a tree and a block")
    taken = busy_names(busy)
    if "tree" in topo:
        out = _tree_topology(topo["tree"], gpus_per_node, taken)
    else:
        out = _block_topology(topo["block"], gpus_per_node, taken)
    check_busy_known(taken, {n["name"] for n in out["nodes"]})
    return out


def _once(names: list[str], where: str) -> list[str]:
    """``names`` when none repeats (Slurm refuses a node listed twice), else a ``ConvertError``."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ConvertError(f"{where}: node {n!r} is listed twice")
        seen.add(n)
    return names
