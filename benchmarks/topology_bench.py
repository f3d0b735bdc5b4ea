"""Planning on a fragmented cluster against the same job on an empty one.

A 4,096-GPU DGX H100 cluster (512 nodes: 4 blocks x 16 racks x 8 nodes) and a 2,048-GPU job
(Llama 3 70B, 8K sequences, 1,024 sequences per step): once with every node free, once with a
third of the nodes busy, picked at random (seed 0). Prints wall times and the plans, then the
time the node-set choice alone takes on larger clusters (blocks of 64 racks of 8 nodes).
"""

from __future__ import annotations

import random
import statistics
import time

from optimizer import service
from optimizer.placement.select import candidate_sets
from optimizer.specs import PlanRequest
from optimizer.topology_spec import ClusterTopology

BLOCKS, RACKS, NODES = 4, 16, 8
RUNS = 3


def topology(busy_fraction: float, seed: int = 0, blocks: int = BLOCKS, racks: int = RACKS) -> dict:
    names = [f"dgx{i:05d}" for i in range(blocks * racks * NODES)]
    busy = set(random.Random(seed).sample(names, int(len(names) * busy_fraction)))
    nodes = []
    for i, name in enumerate(names):
        rack = i // NODES
        labels = {
            "topology.kubernetes.io/block": f"block{rack // racks}",
            "topology.kubernetes.io/rack": f"rack{rack:03d}",
        }
        nodes.append({"name": name, "labels": labels, "free_gpus": 0 if name in busy else 8})
    levels = ["topology.kubernetes.io/block", "topology.kubernetes.io/rack", "kubernetes.io/hostname"]
    return {"levels": levels, "nodes": nodes}


def request(busy_fraction: float) -> PlanRequest:
    return PlanRequest.model_validate(
        {
            "model": {"preset": "llama3-70b"},
            "training": {"seq_len": 8192, "global_batch_size": 1024, "precision": "bf16"},
            "cluster": {"preset": "dgx-h100", "num_gpus": 2048, "topology": topology(busy_fraction)},
            "search": {"top_k": 5, "time_limit_s": 60},
        }
    )


def measure(busy_fraction: float) -> tuple[float, object]:
    times, resp = [], None
    for _ in range(RUNS):
        req = request(busy_fraction)
        t0 = time.perf_counter()
        resp = service.plan(req)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), resp


def main() -> None:
    rows = []
    for label, frac in (("empty", 0.0), ("1/3 busy, scattered", 1 / 3)):
        wall, resp = measure(frac)
        p = resp.plans[0]
        a = p.assignment
        rows.append((label, wall, resp.status, p.step_time_s, p.config, a))
    print(
        f"{'cluster':<22} {'plan s':>7} {'status':>8} {'step s':>8} {'layout':<22} {'racks':>5} {'blocks':>6} {'sets':>4}"
    )
    for label, wall, status, step, cfg, a in rows:
        layout = f"TP{cfg.tp} CP{cfg.cp} PP{cfg.pp} DP{cfg.dp} VPP{cfg.vpp}"
        racks = a.domains_used["topology.kubernetes.io/rack"]
        blocks = a.domains_used["topology.kubernetes.io/block"]
        print(
            f"{label:<22} {wall:>7.2f} {status:>8} {step:>8.3f} {layout:<22} {racks:>5} {blocks:>6} {a.candidates_compared:>4}"
        )
    ratio = rows[1][1] / rows[0][1]
    print(f"fragmented / empty planning time: {ratio:.2f}x (target: at most 2x)")
    print()
    print(f"{'cluster nodes':>13} {'job nodes':>9} {'choose s':>8} {'sets':>4}")
    for blocks, job_nodes in ((4, 1024), (16, 2048), (16, 4096)):
        topo = ClusterTopology.model_validate(topology(1 / 3, blocks=blocks, racks=64))
        t0 = time.perf_counter()
        sets = candidate_sets(topo, NODES, job_nodes)
        print(f"{blocks * 64 * NODES:>13,} {job_nodes:>9,} {time.perf_counter() - t0:>8.2f} {len(sets):>4}")


if __name__ == "__main__":
    main()
