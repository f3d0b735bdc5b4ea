"""Slurm topology.yaml and Kueue Topology converters, and their round trip through /plan."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import hostlist
import pytest

from api.cli import main
from api.topology_convert import ConvertError, from_kueue
from api.topology_slurm import from_slurm
from optimizer import service
from optimizer.specs import PlanRequest

DATA = Path(__file__).parent / "topology_data"
HOST = "kubernetes.io/hostname"
JOB = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64, "precision": "bf16"}}


def plan(topology: dict, num_gpus: int) -> PlanRequest:
    return PlanRequest.model_validate(
        {**JOB, "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus, "topology": topology}}
    )


def test_slurm_man_page_example_tree_is_the_default() -> None:
    topo = from_slurm((DATA / "slurm-topology.yaml").read_text(), 8)
    assert topo["levels"] == ["slurm/switch-1", HOST]
    assert [n["name"] for n in topo["nodes"]] == ["node01", "node02", "node03", "node04"]
    assert {n["labels"]["slurm/switch-1"] for n in topo["nodes"]} == {"sw_root"}


def test_slurm_man_page_example_blocks() -> None:
    topo = from_slurm((DATA / "slurm-topology.yaml").read_text(), 8, busy="node[02,07]", name="topo2")
    assert topo["levels"] == ["slurm/block-16", "slurm/block", HOST]
    by = {n["name"]: n for n in topo["nodes"]}
    assert len(by) == 16 and by["node05"]["labels"]["slurm/block"] == "b2"
    assert {n["labels"]["slurm/block-16"] for n in topo["nodes"]} == {"16n-0"}
    assert by["node02"]["free_gpus"] == 0 and by["node03"]["free_gpus"] == 8
    # planned onto: 2 busy nodes leave blocks b1 and b2 with 3 free; a 4-node job takes a whole block
    a = service.plan(plan(topo, 32)).plans[0].assignment
    assert a.nodes == ["node09", "node10", "node11", "node12"]
    assert a.slurm.nodelist == "node[09-12]"
    assert hostlist.expand_hostlist(a.slurm.nodelist) == a.nodes


def test_slurm_tree_levels_and_round_trip() -> None:
    topo = from_slurm((DATA / "slurm-tree.yaml").read_text(), 8, busy="gpu[001,006]")
    assert topo["levels"] == ["slurm/switch-1", "slurm/switch-2", HOST]
    assert next(n for n in topo["nodes"] if n["name"] == "gpu007")["labels"] == {
        "slurm/switch-1": "spine",
        "slurm/switch-2": "leaf2",
    }
    a = service.plan(plan(topo, 64)).plans[0].assignment
    assert len(a.nodes) == 8 and not {"gpu001", "gpu006"} & set(a.nodes)
    assert hostlist.expand_hostlist(a.slurm.nodelist) == sorted(a.nodes)
    assert a.slurm.switches == a.domains_used["slurm/switch-2"]


def kubectl_nodes() -> dict:
    items = []
    for i in range(8):
        labels = {
            "cloud.provider.com/node-group": "tas-group",  # the sample ResourceFlavor's nodeLabels
            "cloud.provider.com/topology-block": f"block-{i // 4}",
            "cloud.provider.com/topology-rack": f"rack-{i // 2}",
            HOST: f"node-{i}",
        }
        status = {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}
        item = {"metadata": {"name": f"node-{i}", "labels": labels}, "spec": {}, "status": status}
        items.append(item)
    items[1]["spec"]["unschedulable"] = True
    items.append({"metadata": {"name": "cpu-0", "labels": {HOST: "cpu-0"}}, "status": {}})
    return {"kind": "List", "items": items}


def kubectl_pods() -> dict:
    pod = {
        "spec": {"nodeName": "node-2", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running"},
    }
    done = {
        "spec": {"nodeName": "node-3", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
        "status": {"phase": "Succeeded"},
    }
    return {"items": [pod, done]}


def test_kueue_v1beta2_objects_read_as_v1beta1() -> None:
    """Kueue serves Topology and ResourceFlavor as v1beta2 (its storage version since 0.16) with
    the fields from-kueue reads unchanged: the example (v1beta2) reads as the v1beta1 sample."""
    example = Path(__file__).parents[2] / "examples" / "scheduler" / "kueue-topology.yaml"
    text = example.read_text()
    assert text.count("apiVersion: kueue.x-k8s.io/v1beta2") == 2
    old = text.replace("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1")
    assert from_kueue(text, kubectl_nodes(), kubectl_pods()) == from_kueue(old, kubectl_nodes(), kubectl_pods())


def test_kueue_sample_topology_and_nodes() -> None:
    topo = from_kueue((DATA / "kueue-topology.yaml").read_text(), kubectl_nodes(), kubectl_pods())
    assert topo["levels"] == ["cloud.provider.com/topology-block", "cloud.provider.com/topology-rack", HOST]
    assert topo["nvlink_level"] == HOST
    free = {n["name"]: n["free_gpus"] for n in topo["nodes"]}
    assert free == {
        "node-0": 8,
        "node-1": 0,
        "node-2": 4,
        "node-3": 8,
        "node-4": 8,
        "node-5": 8,
        "node-6": 8,
        "node-7": 8,
    }
    a = service.plan(plan(topo, 32)).plans[0].assignment
    assert a.nodes == ["node-4", "node-5", "node-6", "node-7"]  # the only block with 4 whole nodes free
    assert a.kueue.annotations["kueue.x-k8s.io/podset-required-topology"] == "cloud.provider.com/topology-block"
    domains = a.kueue.topology_assignment.domains
    assert [d.values[-1] for d in domains] == a.nodes and all(d.count == 1 for d in domains)
    # the same placement in v1beta2's shape: one slice, block-1 for all, racks and nodes per domain
    v2 = a.kueue.model_dump(mode="json")["topology_assignment_v1beta2"]
    assert v2 == {
        "levels": ["cloud.provider.com/topology-block", "cloud.provider.com/topology-rack", HOST],
        "slices": [{
            "domainCount": 4,
            "valuesPerLevel": [{"universal": "block-1"},
                               {"individual": {"roots": [d.values[1] for d in domains]}},
                               {"individual": {"roots": a.nodes}}],
            "podCounts": {"universal": 1},
        }],
    }  # fmt: skip


def test_cli_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "topo.json"
    assert main(["topology", "from-slurm", str(DATA / "slurm-topology.yaml"), "--name", "topo2", "-o", str(out)]) == 0
    assert len(json.loads(out.read_text())["nodes"]) == 16
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(kubectl_nodes()))
    out2 = tmp_path / "k.json"
    assert main(["topology", "from-kueue", str(DATA / "kueue-topology.yaml"), str(nodes), "-o", str(out2)]) == 0
    assert json.loads(out2.read_text())["nodes"][0]["name"] == "node-0"
    assert main(["topology", "from-slurm", str(DATA / "kueue-topology.yaml")]) == 2


def test_bad_inputs_name_the_place() -> None:
    with pytest.raises(ConvertError, match="no topology named"):
        from_slurm((DATA / "slurm-topology.yaml").read_text(), 8, name="nope")
    with pytest.raises(ConvertError, match="kind Topology"):
        from_kueue("kind: Pod\n", {"items": []})


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)
"""Nine levels of ten aliases each: 10^9 nodes once expanded."""


def test_converters_parse_within_the_document_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Topology files go through the same bounded parser as request documents: an alias bomb, a
    document nested past the depth limit or two Slurm documents in one file are a one-line exit 2,
    not a long parse or a traceback."""
    with pytest.raises(ConvertError, match="expands to more than"):
        from_kueue(BILLION_LAUGHS, {"items": []})
    with pytest.raises(ConvertError, match="nested deeper than"):
        from_slurm("[" * 40 + "]" * 40, 8)
    with pytest.raises(ConvertError, match="expected one YAML document, found 2"):
        from_slurm("a: 1\n---\nb: 2\n", 8)
    deep = tmp_path / "nodes.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["topology", "from-kueue", str(DATA / "kueue-topology.yaml"), str(deep)]) == 2
    err = capsys.readouterr().err
    assert "nested deeper than" in err and len(err.strip().splitlines()) == 1


def test_a_busy_name_the_topology_lacks_is_an_error() -> None:
    """A typo or a long host name in --busy would leave the busy node free: it is an error."""
    text = (DATA / "slurm-tree.yaml").read_text()
    with pytest.raises(ConvertError, match="--busy names nodes the topology does not have: gpu01"):
        from_slurm(text, 8, busy="gpu01")
    with pytest.raises(ConvertError, match="gpu001.cluster.local, gpu9"):
        from_slurm(text, 8, busy="gpu001.cluster.local,gpu9,gpu001")
    assert from_slurm(text, 8, busy="gpu001")["nodes"]


@pytest.mark.parametrize(
    ("nodes", "pods", "message"),
    [
        ([{"metadata": {"name": "a"}}], None, "nodes: expected kubectl JSON"),
        ({"items": [{"metadata": {"name": "a", "labels": None}}, 5]}, None, "nodes: expected kubectl JSON"),
        ("8k", None, "nodes: 'node-0': nvidia.com/gpu '8k' is not a whole number of GPUs"),
        (
            None,
            {"items": [{"spec": {"nodeName": "node-0", "containers": [
                {"resources": {"requests": {"nvidia.com/gpu": "1.5"}}}]}}]},
            "pods: pod on 'node-0': nvidia.com/gpu '1.5' is not a whole number of GPUs",
        ),
        (None, {"items": "x"}, "pods: expected kubectl JSON"),
    ],
)  # fmt: skip
def test_malformed_kubectl_inventories_are_errors_not_tracebacks(nodes, pods, message) -> None:
    """They raised AttributeError / ValueError / TypeError out of the CLI (exit 1, a traceback)."""
    topology = (DATA / "kueue-topology.yaml").read_text()
    if nodes == "8k":  # a real inventory with one unparsable quantity
        nodes = kubectl_nodes()
        nodes["items"][0]["status"]["allocatable"]["nvidia.com/gpu"] = "8k"
    with pytest.raises(ConvertError, match=message):
        from_kueue(topology, nodes if nodes is not None else kubectl_nodes(), pods)


def test_converter_arguments_that_cannot_be_meant(tmp_path: Path) -> None:
    # a negative or zero GPU count is a usage error (exit 2), not free_gpus -4 in the output
    with pytest.raises(SystemExit) as usage:
        main(["topology", "from-slurm", str(DATA / "slurm-topology.yaml"), "--gpus-per-node", "-4"])
    assert usage.value.code == 2
    # Volcano's --busy applies without --nodes: together it was ignored, busy nodes came out free
    from api.topology_volcano import from_volcano

    with pytest.raises(ConvertError, match="--busy applies without --nodes"):
        from_volcano("", {"items": []}, None, 8, "vn-[0-7]")


def test_odd_digits_and_pods_without_nodes_are_errors() -> None:
    from api.topology_convert import gpu_quantity
    from api.topology_volcano import from_volcano

    with pytest.raises(ConvertError, match="is not a whole number of GPUs"):
        gpu_quantity("\u00b2", "nodes: 'n'")  # str.isdigit accepts it, int() does not
    with pytest.raises(ConvertError, match="--pods needs --nodes"):
        from_volcano("", None, {"items": []}, 8, "")


def test_inputs_of_another_shape_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fields of another shape than the schedulers write (levels as plain strings, a number for
    the HyperNode list) were tracebacks (exit 1); they are one line naming the input, exit 2."""
    kueue = tmp_path / "t.yaml"
    kueue.write_text("kind: Topology\nmetadata: {name: t}\nspec: {levels: [rack]}\n")
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(kubectl_nodes()))
    volcano = tmp_path / "v.yaml"
    volcano.write_text("items: 5\n")
    for argv in (["from-kueue", str(kueue), str(nodes)], ["from-volcano", str(volcano), "--gpus-per-node", "8"]):
        assert main(["topology", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pplan: topology {argv[0]}: malformed input (") and err.count("\n") == 1


def test_a_node_in_two_places_is_an_error() -> None:
    """A node listed in two Slurm blocks was written twice; one under two tree switches kept the
    last one silently."""
    blocks = "- topology: b\n  block:\n    blocks:\n      - {block: b1, nodes: 'n[1-2]'}\n      - {block: b2, nodes: 'n[2-3]'}\n"
    with pytest.raises(ConvertError, match="node 'n2' is in blocks 'b1' and 'b2'"):
        from_slurm(blocks, 8)
    tree = "- topology: t\n  tree:\n    switches:\n      - {switch: s1, nodes: 'a[1-2]'}\n      - {switch: s2, nodes: 'a2'}\n"
    with pytest.raises(ConvertError, match="node 'a2' is under switches 's1' and 's2'"):
        from_slurm(tree, 8)
    twice = "- topology: t\n  tree:\n    switches:\n      - {switch: s1, children: 'l1'}\n      - {switch: s2, children: 'l1'}\n      - {switch: l1, nodes: 'a1'}\n"
    with pytest.raises(ConvertError, match="switch 'l1' is a child of 's1' and 's2'"):
        from_slurm(twice, 8)


def test_a_converted_topology_plan_refuses_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kubectl's numbers and labels went through as they were: 10^20 free GPUs, an integer label;
    /plan then refused the file. The converter now says which field, exit 2."""
    doc = kubectl_nodes()
    doc["items"][0]["metadata"]["labels"]["cloud.provider.com/topology-rack"] = 5
    doc["items"][2]["status"]["allocatable"]["nvidia.com/gpu"] = "99999999999999999999"
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(doc))
    assert main(["topology", "from-kueue", str(DATA / "kueue-topology.yaml"), str(nodes)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pplan: topology from-kueue: the topology it makes is not one /plan takes: nodes.")


def test_a_large_inventory_is_bounded_by_its_bytes_only(tmp_path: Path) -> None:
    """`kubectl get nodes -o json` of a real cluster carries hundreds of labels and annotations a
    node: more values than a request may hold (262,144), well under the 64 MiB inventory limit."""
    inventory = kubectl_nodes()
    extra = {f"example.com/annotation-{k}": "x" for k in range(400)}
    for item in inventory["items"][:8]:
        item["metadata"]["annotations"] = dict(extra)
    inventory["items"] += [copy.deepcopy(inventory["items"][0]) for _ in range(700)]
    for i, item in enumerate(inventory["items"][9:]):
        item["metadata"]["name"] = item["metadata"]["labels"][HOST] = f"extra-{i}"
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(inventory))
    assert nodes.read_text().count(",") > 262_144
    out = tmp_path / "topo.json"
    assert main(["topology", "from-kueue", str(DATA / "kueue-topology.yaml"), str(nodes), "-o", str(out)]) == 0
    assert sum(n["name"].startswith("extra-") for n in json.loads(out.read_text())["nodes"]) == 700
