"""Scheduler outputs as Slurm, Kueue and Volcano read them: the block plugin's --segment rule, block
levels as Slurm aggregates them, --busy as squeue prints it, the nodes Kueue's topology-aware
scheduling sees, Volcano's empty labelMatch, and the node rank under Slurm."""

from __future__ import annotations

import subprocess

import pytest

from api.topology_convert import ConvertError, busy_names, from_kueue
from api.topology_slurm import from_slurm
from api.topology_volcano import from_volcano
from optimizer import service
from optimizer.errors import InvalidLayout
from optimizer.placement.outputs import block_segment, slurm_request
from optimizer.specs import PlanRequest
from optimizer.topology_spec import ClusterTopology

JOB = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 256, "precision": "bf16"}}

BLOCKS = """
- topology: blk
  cluster_default: true
  block:
    block_sizes: [4, 16]
    blocks:
    - {block: b1, nodes: "n[01-04]"}
    - {block: b2, nodes: "n[05-08]"}
    - {block: b3, nodes: "n[09-12]"}
    - {block: b4, nodes: "n[13-16]"}
"""


def plan_on(topology: dict, num_gpus: int):
    req = {**JOB, "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus, "topology": topology}}
    return service.plan(PlanRequest.model_validate(req)).plans[0].assignment


def test_nodes_across_base_blocks_ask_for_segments() -> None:
    """3 nodes fit one base block (4 nodes), so Slurm looks in one base block only: with b1 giving 2
    free nodes and b2 one, the --nodelist alone would never be allocated. --segment=1 (the gcd of
    2 and 1) lets Slurm place them segment by segment; --switches is left out (the block plugin
    ignores it)."""
    busy = "n01,n02,n05,n06,n08,n[09-16]"
    a = plan_on(from_slurm(BLOCKS, 8, busy=busy), 24)
    assert a.nodes == ["n03", "n04", "n07"]
    assert a.slurm.segment == 1
    assert a.slurm.sbatch == "--nodes=3 --ntasks-per-node=8 --gpus-per-node=8 --nodelist=n[03-04,07] --segment=1"


def test_segments_whenever_the_nodes_span_base_blocks() -> None:
    """6 nodes over two base blocks (3 + 3) inside the one 16-node block: Slurm allows a 6-node
    job 2 base blocks, so this nodelist alone would pass, but 2 + 2 + 2 over three base blocks
    would not ("requires nodes exceed maximum llblock limit"): every nodelist that spans base
    blocks gets --segment (the gcd of the shares), which Slurm places block by block. Nodes in one
    base block need none; --switches is never given (the block plugin ignores it)."""
    topo = ClusterTopology.model_validate(from_slurm(BLOCKS, 8))
    by = {n.name: n for n in topo.nodes}
    assert block_segment([by[x] for x in ("n02", "n03", "n04", "n06", "n07", "n08")]) == 3
    three = [by[x] for x in ("n03", "n04", "n07", "n08", "n11", "n12")]
    assert block_segment(three) == 2
    req = slurm_request(topo, three, 8)
    assert req.sbatch.endswith("--nodelist=n[03-04,07-08,11-12] --segment=2") and "--switches" not in req.sbatch
    one = [by[x] for x in ("n01", "n02", "n03")]
    assert block_segment(one) is None and "--segment" not in slurm_request(topo, one, 8).sbatch


def two_switch_tree(s1_nodes: str, s2_nodes: str) -> ClusterTopology:
    """A Slurm ``topology/tree`` of two leaf switches under one top switch, 8 GPUs a node."""
    tree = f"""
- topology: t
  tree:
    switches:
    - {{switch: s1, nodes: "{s1_nodes}"}}
    - {{switch: s2, nodes: "{s2_nodes}"}}
    - {{switch: top, children: "s[1-2]"}}
"""
    return ClusterTopology.model_validate(from_slurm(tree, 8))


def test_tree_topology_gets_switches_never_segment() -> None:
    topo = two_switch_tree("g[1-4]", "g[5-8]")
    req = slurm_request(topo, [n for n in topo.nodes if n.name in {"g1", "g2", "g5", "g6"}], 8)
    assert req.segment is None and req.sbatch.endswith("--switches=2") and "--segment" not in req.sbatch


def test_block_levels_follow_slurms_aggregation() -> None:
    """Block i joins group i // (size / base size) (Slurm's block_record.c), not a count of nodes
    seen; without block_sizes Slurm enables 2, 4, 8 and 16 base blocks up to the first that spans
    every block."""
    # blocks of 3 nodes over a base size of 2 (as topology.conf(5)'s example sizes 30 and 120 do to
    # blocks of 32): counting nodes would put b3 (nodes 9-11) in the third 4-node group
    uneven = "\n".join(
        ["- topology: u", "  block:", "    block_sizes: [2, 4]", "    blocks:"]
        + [f"    - {{block: b{i}, nodes: 'n{i}[1-3]'}}" for i in range(4)]
    )
    groups = {n["name"]: n["labels"]["slurm/block-4"] for n in from_slurm(uneven, 8)["nodes"]}
    assert groups["n01"] == groups["n13"] == "4n-0" and groups["n21"] == groups["n33"] == "4n-1"
    default = "\n".join(
        ["- topology: d", "  block:", "    blocks:"] + [f"    - {{block: b{i}, nodes: 'm{i}[1-2]'}}" for i in range(5)]
    )
    topo = from_slurm(default, 8)
    assert topo["levels"] == [
        "slurm/block-16",
        "slurm/block-8",
        "slurm/block-4",
        "slurm/block",
        "kubernetes.io/hostname",
    ]
    with pytest.raises(ConvertError, match="6 is not the base size 4 times a power of two"):
        from_slurm(BLOCKS.replace("[4, 16]", "[4, 6]"), 8)


def test_busy_takes_squeue_lines() -> None:
    """squeue -h -o %N prints a hostlist per job and line: every node of every line is busy."""
    assert busy_names("n[01-02]\nn05\n") == {"n01", "n02", "n05"}
    free = {n["name"]: n["free_gpus"] for n in from_slurm(BLOCKS, 8, busy="n[01-02]\nn05")["nodes"]}
    assert free["n05"] == 0 and free["n01"] == 0 and free["n03"] == 8


KUEUE = """
kind: Topology
metadata: {name: default}
spec:
  levels: [{nodeLabel: rack}, {nodeLabel: kubernetes.io/hostname}]
---
kind: ResourceFlavor
metadata: {name: tas}
spec:
  topologyName: default
  nodeLabels: {pool: gpu}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
"""


def kube_node(name: str, pool: str = "gpu", taints: list | None = None, ready: str | None = "True") -> dict:
    status: dict = {"allocatable": {"nvidia.com/gpu": "8"}}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready}]
    labels = {"rack": "r0", "kubernetes.io/hostname": name, "pool": pool}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints or []}, "status": status}


def test_kueue_sees_the_flavors_nodes_untainted_and_ready() -> None:
    nodes = {
        "items": [
            kube_node("a"),
            kube_node("cpu", pool="cpu"),  # not of the flavor: Kueue does not see it
            kube_node("tolerated", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
            kube_node("tainted", taints=[{"key": "maintenance", "value": "x", "effect": "NoExecute"}]),
            kube_node("soft", taints=[{"key": "maintenance", "effect": "PreferNoSchedule"}]),
            kube_node("unknown", ready=None),  # no Ready condition: not ready
        ]
    }
    free = {n["name"]: n["free_gpus"] for n in from_kueue(KUEUE, nodes)["nodes"]}
    assert free == {"a": 8, "tolerated": 8, "tainted": 0, "soft": 8, "unknown": 0}
    with pytest.raises(ConvertError, match="nodeLabels"):
        from_kueue(KUEUE, {"items": [kube_node("cpu", pool="cpu")]})
    with pytest.raises(ConvertError, match="nodeLabels: expected an object"):
        from_kueue(KUEUE.replace("nodeLabels: {pool: gpu}", "nodeLabels: [pool]"), nodes)


def test_empty_label_match_selects_no_node() -> None:
    hypernodes = """
kind: HyperNode
metadata: {name: leaf}
spec:
  tier: 1
  members:
  - {type: Node, selector: {exactMatch: {name: g1}}}
  - {type: Node, selector: {labelMatch: {}}}
"""
    nodes = {"items": [kube_node("g1"), kube_node("g2")]}
    assert [n["name"] for n in from_volcano(hypernodes, nodes)["nodes"]] == ["g1"]
    empty_name = hypernodes.replace("labelMatch: {}", "exactMatch: {name: ''}")
    assert [n["name"] for n in from_volcano(empty_name, nodes)["nodes"]] == ["g1"]


def test_slurm_node_rank_line_gives_each_node_its_plan_rank() -> None:
    a = plan_on(from_slurm(BLOCKS, 8, busy="n01,n02,n05,n06,n08,n[09-16]"), 24)
    for rank, name in enumerate(a.nodes):
        line = a.launcher.slurm_node_rank + '; echo "$NODE_RANK"'
        out = subprocess.run(["bash", "-c", line], env={"SLURMD_NODENAME": name}, capture_output=True, text=True)
        assert out.stdout.strip() == str(rank)
    stray = subprocess.run(["bash", "-c", line], env={"SLURMD_NODENAME": "n16"}, capture_output=True, text=True)
    assert stray.returncode != 0 and stray.stdout == "" and "not one of the plan nodes" in stray.stderr


def test_an_nvlink_domain_larger_than_the_hardware_is_refused() -> None:
    """64 GB200 trays of 4 GPUs all labelled one clique would cost 256 GPUs' traffic at NVLink rates
    (an NVL72 domain holds 72); two DGX nodes with one hostname label likewise. A repeated
    topology.links level made the answer depend on the order."""
    clique = "nvidia.com/gpu.clique"
    trays = [{"name": f"t{i}", "labels": {clique: "c0"}, "free_gpus": 4} for i in range(64)]
    topo = {"levels": [clique, "kubernetes.io/hostname"], "nvlink_level": clique, "nodes": trays}
    with pytest.raises(
        ValueError, match=r"64 nodes \(256 GPUs\) share the NVLink domain .* more than nvlink_domain_size \(72\)"
    ):
        PlanRequest.model_validate({**JOB, "cluster": {"preset": "gb200-nvl72", "topology": topo}})
    topo["nodes"] = trays[:18]
    PlanRequest.model_validate({**JOB, "cluster": {"preset": "gb200-nvl72", "topology": topo}})
    twins = [
        {"name": f"n{i}", "labels": {"rack": "r0", "kubernetes.io/hostname": "n1"}, "free_gpus": 8} for i in range(2)
    ]
    with pytest.raises(ValueError, match="2 nodes \\(16 GPUs\\) share the NVLink domain kubernetes.io/hostname = 'n1'"):
        PlanRequest.model_validate(
            {
                **JOB,
                "cluster": {
                    "preset": "dgx-h100",
                    "topology": {"levels": ["rack", "kubernetes.io/hostname"], "nodes": twins},
                },
            }
        )
    # NVLink domains smaller than a node (docs/catalog.md): one node per hostname is fine
    single = [{"name": f"n{i}", "labels": {"rack": "r0"}, "free_gpus": 8} for i in range(2)]
    small = {"preset": "dgx-h100", "nvlink_domain_size": 4, "topology": {"levels": ["rack"], "nodes": single}}
    PlanRequest.model_validate({**JOB, "cluster": small})
    links = [{"level": "rack", "oversubscription": 2.0}, {"level": "rack", "oversubscription": 1.0}]
    with pytest.raises(ValueError, match="topology.links: level 'rack' is given twice"):
        ClusterTopology.model_validate(
            {"levels": ["rack"], "nodes": [{"name": "a", "labels": {"rack": "r"}, "free_gpus": 8}], "links": links}
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- topology: t\n  tree:\n    switches: [x]\n", r"tree.switches\[0\]: expected a mapping"),
        ("- topology: t\n  tree:\n    switches:\n    - switch: s\n", "no switch lists nodes"),
        ("- topology: t\n  tree: [1]\n", "tree: expected a mapping"),
        ("- topology: t\n  block:\n    block_sizes: [-4, -8]\n    blocks:\n    - {block: b, nodes: 'n[1-4]'}\n", "block_sizes"),
        ("- topology: t\n  block:\n    block_sizes: 5\n    blocks:\n    - {block: b, nodes: 'n[1-4]'}\n", "block_sizes"),
        ("- topology: t\n  block:\n    blocks:\n    - {block: b}\n", "block 'b' lists no nodes"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: l1, nodes: 'g[1-4]'}\n    - {switch: l1, nodes: 'g[5-8]'}\n",
         "switch 'l1' is listed twice"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: s, nodes: 'g[1-4],g3'}\n", "node 'g3' is listed twice"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: top, children: 'leaf[1-3]'}\n    - {switch: leaf1, nodes: g1}\n",
         "has child 'leaf2', which is not defined"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: [a, b], nodes: g1}\n", "needs a 'switch' name"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: s, nodes: g1}\n  block:\n    blocks:\n    - {block: b, nodes: g1}\n",
         "has both a tree and a block"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: s, nodes: {a: 1}}\n", "expected a hostlist, not dict"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: s, nodes: 'n[0-2000000]'}\n", "more than 16,384 nodes"),
        ("- topology: t\n  tree:\n    switches:\n    - {switch: s, nodes: 'n[2000000-0]'}\n", "more than 16,384 nodes"),
        ("- topology: t\n  block:\n    blocks:\n    - {block: b, nodes: a}\n    - {block: b, nodes: c}\n", "listed twice"),
    ],
)  # fmt: skip
def test_malformed_slurm_topologies_are_one_line_errors(text: str, message: str) -> None:
    """They were tracebacks (exit 1), a 2-million-node expansion (3.7 GB), or output the API refuses."""
    with pytest.raises(ConvertError, match=message):
        from_slurm(text, 8)


def test_converter_cli_reports_bad_files_and_outputs(tmp_path, capsys) -> None:
    from api.cli import main

    latin = tmp_path / "t.yaml"
    latin.write_bytes(b"\xff\xfe- topology: x\n")
    assert main(["topology", "from-slurm", str(latin)]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err
    good = tmp_path / "g.yaml"
    good.write_text(BLOCKS)
    assert main(["topology", "from-slurm", str(good), "-o", str(tmp_path)]) == 1  # the output, not the input
    assert "Is a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["topology", "from-slurm", str(good), "--gpus-per-node", "1000000"])
    assert "from 1 to 1024" in capsys.readouterr().err
    hn = tmp_path / "h.yaml"
    hn.write_text("kind: HyperNode\nmetadata: {name: h}\nspec: {tier: 1, members: [x]}\n")
    assert main(["topology", "from-volcano", str(hn)]) == 2
    assert "a member: expected a mapping" in capsys.readouterr().err


def test_volcano_plans_carry_the_jobs_network_topology() -> None:
    """On Volcano's user-guide tree with node-1 and node-2 busy the plan takes s5's four nodes: one
    tier-2 HyperNode holds them (highestTierAllowed 2) and its two tier-1 HyperNodes give two each
    (two partitions of two pods, each within tier 1). Other topologies get no Volcano settings."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples" / "scheduler"
    topo = from_volcano((examples / "volcano-hypernodes.yaml").read_text(), busy="node-[1-2]")
    a = plan_on(topo, 32)
    assert a.nodes == ["node-4", "node-5", "node-6", "node-7"] and a.volcano is not None
    assert a.volcano.network_topology.model_dump() == {"mode": "hard", "highestTierAllowed": 2}
    p = a.volcano.partition_policy
    assert p is not None and (p.totalPartitions, p.partitionSize, p.networkTopology.highestTierAllowed) == (2, 2, 1)
    assert plan_on(from_slurm(BLOCKS, 8), 32).volcano is None


def test_hostlist_counting_reads_numbers_as_hostlist_does() -> None:
    """A range ending in a new line expands in python-hostlist (its pattern ends in `$`) and was
    counted as one name (99,999 nodes got through the 16,384 bound); a superscript digit passed
    str.isdigit() and crashed int()."""
    from api.topology_convert import hostlist_size

    assert hostlist_size("n[1-99999\n]") == 99999
    assert hostlist_size("n[²-3]") == 1
    with pytest.raises(ConvertError, match="more than 16,384 nodes"):
        from_slurm('- topology: t\n  tree:\n    switches:\n    - {switch: s, nodes: "n[1-99999\\n]"}\n', 8)


def test_pins_a_count_cannot_take_leave_that_count_out_when_the_planner_picks_it() -> None:
    """Without num_gpus the planner tries 8, 16, 32, ... GPUs of the free nodes: tp 8 x pp 2 does
    not divide 8, which is no reason to refuse the request (it was a 422); the plan takes 16."""
    req = {**JOB, "cluster": {"preset": "dgx-h100", "topology": from_slurm(BLOCKS, 8)}}
    req["search"] = {"fix": {"tp": 8, "pp": 2}, "top_k": 1, "time_limit_s": 10}
    answer = service.plan(PlanRequest.model_validate(req))
    assert answer.status == "optimal" and (answer.plans[0].config.tp, answer.plans[0].config.pp) == (8, 2)
    assert len(answer.plans[0].assignment.nodes) * 8 % 16 == 0
    with pytest.raises(InvalidLayout, match="does not divide num_gpus"):  # the count given: still a 422
        service.plan(PlanRequest.model_validate({**req, "cluster": {**req["cluster"], "num_gpus": 8}}))


def test_names_with_text_after_their_number_go_as_a_plain_list() -> None:
    """``rack[1-2]-node[1-2].example.com`` expands only in Slurm 23.02.5 and later (hostlist.c):
    such names are listed one by one; plain ones stay compressed."""
    topo = two_switch_tree(
        "rack1-node1.example.com,rack1-node2.example.com", "rack2-node1.example.com,rack2-node2.example.com"
    )
    req = slurm_request(topo, list(topo.nodes), 8)
    assert req.nodelist == ",".join(sorted(n.name for n in topo.nodes))
    assert "]" not in req.sbatch


def test_volcano_soft_mode_leaves_the_tier_out() -> None:
    """Volcano's CRD types highestTierAllowed as a non-null integer."""
    from optimizer.assignment_results import VolcanoNetworkTopology

    assert VolcanoNetworkTopology(mode="soft").model_dump() == {"mode": "soft"}
    assert VolcanoNetworkTopology(mode="hard", highestTierAllowed=1).model_dump(mode="json") == {
        "mode": "hard",
        "highestTierAllowed": 1,
    }


def test_kueue_slices_at_the_nvlink_domain_on_nvl72() -> None:
    """On an NVL72 topology the node is not the NVLink domain: the slices go on the clique level
    (the finest level above the nodes), so Kueue keeps each planned share within one clique."""
    nodes = [
        {"name": f"t{i:02d}", "labels": {"block": "blk0", "nvidia.com/gpu.clique": f"cl{i // 18}"}, "free_gpus": 4}
        for i in range(36)
    ]
    topology = {
        "levels": ["block", "nvidia.com/gpu.clique", "kubernetes.io/hostname"],
        "nvlink_level": "nvidia.com/gpu.clique",
        "nodes": nodes,
    }
    req = {
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 4096, "global_batch_size": 256},
        "cluster": {"preset": "gb200-nvl72", "num_gpus": 128, "topology": topology},
        "search": {"top_k": 1},
    }
    a = service.plan(PlanRequest.model_validate(req)).plans[0].assignment
    per_clique = {d.values[1] for d in a.kueue.topology_assignment.domains}
    assert per_clique == {"cl0", "cl1"}
    assert a.kueue.annotations["kueue.x-k8s.io/podset-slice-required-topology"] == "nvidia.com/gpu.clique"
    assert a.kueue.annotations["kueue.x-k8s.io/podset-slice-size"] == "16"
