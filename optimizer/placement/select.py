"""Candidate node sets on a fragmented cluster.

The cost model sees a node set only through its tier spans (``node_tiers.level_spans``: the gcd
of the job's GPU counts in each level's domains). A *chain* asks for counts that are multiples of
``m[j]`` nodes in every level-``j`` domain the job touches (``m`` from the coarsest level down to
the NVLink level, each dividing the coarser one); every set meeting it has spans that are multiples
of ``m``. For a chain, a knapsack over the domain tree finds the most compact set (fewest NVLink
domains, then fewest domains of the level above, and so on up), or proves there is none.

Candidates are the sets of the chains no other feasible chain refines (the most local ones the
free set allows), plus the most compact set with no chain at all, deduplicated by spans.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from optimizer.cost.node_tiers import level_spans
from optimizer.topology_spec import ClusterTopology, TopologyNode

MAX_CHAINS = 256
"""Chains tried per count (the most local first); bounds the work on counts with many divisors."""
INF = np.iinfo(np.int64).max // 4


@lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple:
    """Sort key that orders node012 after node9 (as Slurm hostlists do)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def path_key(topo: ClusterTopology, node: TopologyNode) -> tuple:
    """Rank-order key: domains coarsest first, then the node name (natural order)."""
    return tuple(natural_key(v) for v in topo.path(node))


def rank_order(topo: ClusterTopology, nodes: list[TopologyNode]) -> list[TopologyNode]:
    return sorted(nodes, key=lambda n: (path_key(topo, n), natural_key(n.name)))


@dataclass
class Domain:
    depth: int
    path: tuple[str, ...]
    children: list[Domain] = field(default_factory=list)
    nodes: list[TopologyNode] = field(default_factory=list)
    size: int = 0
    """Eligible nodes in the subtree."""


def domain_tree(topo: ClusterTopology, gpus_per_node: int) -> Domain:
    """Domains of the nodes with at least ``gpus_per_node`` free GPUs (root at depth -1)."""
    depth_max = len(topo.switch_levels()) - 1
    root = Domain(-1, ())
    index: dict[tuple[str, ...], Domain] = {(): root}
    eligible = [n for n in topo.nodes if n.free_gpus >= gpus_per_node]
    eligible.sort(key=lambda n: (path_key(topo, n), n.free_gpus, natural_key(n.name)))
    for node in eligible:
        path = topo.path(node)
        for d in range(depth_max + 1):
            key = path[: d + 1]
            if key not in index:
                dom = Domain(d, key)
                index[key] = dom
                index[path[:d]].children.append(dom)
        index[path].nodes.append(node)
        for d in range(-1, depth_max + 1):
            index[path[: d + 1]].size += 1
    return root


@dataclass(frozen=True)
class Choice:
    nodes: tuple[TopologyNode, ...]
    """In rank order: sorted by domain path, then name."""
    compactness: tuple[int, ...]
    """Domains used per level, the NVLink level first, then coarser ones."""


def _weights(depth_max: int, count: int) -> list[int]:
    """Cost of touching one domain of each depth: the finest level most significant (a set of
    ``count`` nodes touches at most ``count`` domains of a level)."""
    base = count + 1
    return [base**d for d in range(depth_max + 1)]


def _dtype(w: list[int], count: int) -> type:
    """int64 while the largest possible cost fits, else Python integers."""
    return np.int64 if w[-1] * (count + 1) < INF else object


class Knapsack:
    """Least-cost tables of every domain for one node count, shared by the chains tried (a
    domain's table depends only on the chain from its own depth down)."""

    def __init__(self, root: Domain, depths: int, count: int) -> None:
        self.root, self.count = root, count
        self.w = _weights(depths - 1, count)
        self.dtype = _dtype(self.w, count)
        self.inf = INF if self.dtype is np.int64 else (count + 1) ** (depths + 1)
        """The "cannot" cost: above every set's cost (``count`` domains of each level at most)."""
        self.memo: dict[tuple, tuple[np.ndarray, list]] = {}

    def table(self, dom: Domain, chain: tuple[int, ...]) -> np.ndarray:
        """Least cost of taking ``c`` nodes (``c`` = 0..cap) from ``dom`` under ``chain``."""
        key = (dom.path, chain[max(dom.depth, 0) :] if dom.depth >= 0 else chain)
        hit = self.memo.get(key)
        if hit is None:
            hit = self._build(dom, chain)
            self.memo[key] = hit
        return hit[0]

    def _build(self, dom: Domain, chain: tuple[int, ...]) -> tuple[np.ndarray, list]:
        cap = min(self.count, dom.size)
        if dom.depth == len(chain) - 1:  # NVLink domains of one size share a table
            leaf = self.memo.get(("leaf", cap, chain[-1]))
            if leaf is None:
                cost: np.ndarray = np.full(cap + 1, self.inf, dtype=self.dtype)
                cost[0] = 0
                cost[chain[-1] :: chain[-1]] = self.w[dom.depth]
                leaf = (cost, [])
                self.memo[("leaf", cap, chain[-1])] = leaf
            return leaf
        acc: np.ndarray = np.full(cap + 1, self.inf, dtype=self.dtype)
        acc[0] = 0
        picks = []
        for child in dom.children:
            sub = self.table(child, chain)
            new = acc.copy()
            arg = np.zeros(cap + 1, dtype=np.int64)
            for x in np.flatnonzero(sub < self.inf)[1:]:
                if x > cap:
                    break
                cand = acc[: cap + 1 - x] + sub[x]
                better = cand < new[x:]
                new[x:][better] = cand[better]
                arg[x:][better] = x
            acc = np.minimum(new, self.inf)
            picks.append((child, arg))
        if dom.depth >= 0:
            m = chain[dom.depth]
            acc[np.arange(cap + 1) % m != 0] = self.inf
            acc[1:] = np.where(acc[1:] < self.inf, acc[1:] + self.w[dom.depth], self.inf)
        return acc, picks

    def take(self, dom: Domain, chain: tuple[int, ...], count: int, out: list[TopologyNode]) -> None:
        if count == 0:
            return
        _, picks = self.memo[(dom.path, chain[max(dom.depth, 0) :] if dom.depth >= 0 else chain)]
        if not picks:  # an NVLink domain: its first nodes
            out.extend(dom.nodes[:count])
            return
        taken = []
        left = count
        for child, arg in reversed(picks):
            x = int(arg[left]) if left < len(arg) else 0
            taken.append((child, x))
            left -= x
        for child, x in reversed(taken):
            self.take(child, chain, x, out)


def best_set(topo: ClusterTopology, knap: Knapsack, chain: tuple[int, ...]) -> Choice | None:
    """Most compact set of ``knap.count`` nodes meeting ``chain``, or None."""
    count = knap.count
    if knap.root.size < count:
        return None
    cost = knap.table(knap.root, chain)
    if len(cost) <= count or cost[count] >= knap.inf:
        return None
    nodes: list[TopologyNode] = []
    knap.take(knap.root, chain, count, nodes)
    return Choice(tuple(rank_order(topo, nodes)), _decode(int(cost[count]), knap.w))


def _decode(cost: int, w: list[int]) -> tuple[int, ...]:
    used = []
    for weight in reversed(w):
        used.append(cost // weight)
        cost %= weight
    return tuple(used)


def chains(count: int, depths: int, largest: list[int]) -> list[tuple[int, ...]]:
    """Divisor chains ``m[0] | ... `` coarsest first, each ``m[j]`` dividing ``m[j-1]`` and
    ``count``, at most ``largest[j]`` (the biggest eligible domain of depth ``j``); most local first."""
    divs = [d for d in range(1, count + 1) if count % d == 0]
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...]) -> None:
        j = len(prefix)
        if j == depths:
            out.append(prefix)
            return
        limit = prefix[-1] if prefix else count
        for d in reversed(divs):
            if d <= largest[j] and limit % d == 0:
                extend(prefix + (d,))

    extend(())
    return out[:MAX_CHAINS]


def refines(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Every ``b`` divides the matching ``a`` (and they differ): ``a`` asks more locality."""
    return a != b and all(x % y == 0 for x, y in zip(a, b, strict=False))


def largest_domains(root: Domain, depths: int) -> list[int]:
    biggest = [0] * depths
    stack = list(root.children)
    while stack:
        dom = stack.pop()
        biggest[dom.depth] = max(biggest[dom.depth], dom.size)
        stack.extend(dom.children)
    return biggest


def candidate_sets(
    topo: ClusterTopology, gpus_per_node: int, count: int, root: Domain | None = None, deadline: float | None = None
) -> list[Choice]:
    """The candidate node sets of ``count`` nodes (see the module doc), most compact first
    (``root``: the topology's ``domain_tree`` for ``gpus_per_node``, when the caller has it). Past
    ``deadline`` (a ``time.perf_counter`` value) no further locality chain is tried: the sets found
    so far and the loosest one."""
    root = root if root is not None else domain_tree(topo, gpus_per_node)
    depths = len(topo.switch_levels())
    if root.size < count:
        return []
    feasible: dict[tuple[int, ...], Choice] = {}
    knap = Knapsack(root, depths, count)
    for chain in chains(count, depths, largest_domains(root, depths)):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        if any(refines(f, chain) for f in feasible):
            continue  # a feasible chain already asks more locality at every level
        choice = best_set(topo, knap, chain)
        if choice is not None:
            feasible[chain] = choice
    loosest = best_set(topo, knap, (1,) * depths)
    picked = [c for ch, c in feasible.items() if not any(refines(o, ch) for o in feasible)]
    if loosest is not None:
        picked.append(loosest)
    return sorted(_unique(topo, picked, gpus_per_node), key=lambda c: c.compactness)


def _unique(topo: ClusterTopology, choices: list[Choice], g: int) -> list[Choice]:
    seen: dict[tuple[int, ...], Choice] = {}
    for c in choices:
        spans = tuple(level_spans(topo, list(c.nodes), g))
        if spans not in seen or c.compactness < seen[spans].compactness:
            seen[spans] = c
    return list(seen.values())


def node_shares(gpn: int) -> list[int]:
    """The GPUs a job may take on each node of ``gpn``: the divisors of the node size, largest first."""
    return [d for d in range(gpn, 0, -1) if gpn % d == 0]


def all_subsets(topo: ClusterTopology, gpus_per_node: int, count: int):
    """Every set of ``count`` eligible nodes (the brute-force oracle's space)."""
    eligible = [n for n in topo.nodes if n.free_gpus >= gpus_per_node]
    return itertools.combinations(eligible, count)
