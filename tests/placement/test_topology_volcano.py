"""Volcano HyperNode converter: the user guide's example tree, regexMatch and labelMatch
selectors against the node list, and the round trip through /plan."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import hostlist
import pytest
import yaml
from test_topology_convert import kubectl_nodes, kubectl_pods

from api.cli import main
from api.topology_convert import ConvertError
from api.topology_volcano import from_volcano
from optimizer import service
from optimizer.specs import PlanRequest

DATA = Path(__file__).parent / "topology_data"
EXAMPLE = (DATA / "volcano-hypernodes.yaml").read_text()
HOST = "kubernetes.io/hostname"
T1, T2, T3 = "volcano/tier-1", "volcano/tier-2", "volcano/tier-3"
JOB = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 64, "precision": "bf16"}}


def plan(topology: dict, num_gpus: int) -> PlanRequest:
    return PlanRequest.model_validate(
        {**JOB, "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus, "topology": topology}}
    )


def test_user_guide_example_tree() -> None:
    topo = from_volcano(EXAMPLE)
    assert topo["levels"] == [T3, T2, T1, HOST] and topo["nvlink_level"] == HOST
    by = {n["name"]: n for n in topo["nodes"]}
    assert sorted(by) == [f"node-{i}" for i in range(8)]
    assert by["node-5"]["labels"] == {T3: "s6", T2: "s5", T1: "s2"}
    assert by["node-1"]["labels"] == {T3: "s6", T2: "s4", T1: "s0"}
    assert all(n["free_gpus"] == 8 for n in topo["nodes"])


def test_busy_nodes_and_plan_takes_the_free_tier_2_domain() -> None:
    """node-1 and node-2 busy: s4 keeps 2 free nodes in different leaves; s5 is wholly free."""
    topo = from_volcano(EXAMPLE, busy="node-[1-2]")
    free = {n["name"]: n["free_gpus"] for n in topo["nodes"]}
    assert free["node-1"] == free["node-2"] == 0 and sum(free.values()) == 48
    a = service.plan(plan(topo, 32)).plans[0].assignment
    assert a.nodes == ["node-4", "node-5", "node-6", "node-7"]
    assert a.domains_used[T2] == 1 and a.domains_used[T1] == 2
    assert hostlist.expand_hostlist(a.slurm.nodelist) == a.nodes


def _regex_and_label_example() -> str:
    """The user guide's leaf selectors (exactMatch plus regexMatch ``node-[01]``), a labelMatch
    leaf, and a HyperNodeList as ``kubectl get hypernodes -o yaml`` prints it."""
    items = [
        {"kind": "HyperNode", "metadata": {"name": "s0"}, "spec": {"tier": 1, "members": [
            {"type": "Node", "selector": {"exactMatch": {"name": "node-0"}}},
            {"type": "Node", "selector": {"regexMatch": {"pattern": "node-[01]"}}},
        ]}},
        {"kind": "HyperNode", "metadata": {"name": "s1"}, "spec": {"tier": 1, "tierName": "rack", "members": [
            {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"cloud.provider.com/topology-block": "block-1"},
                                                         "matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["node-7"]}]}}},
        ]}},
        {"kind": "HyperNode", "metadata": {"name": "s2"}, "spec": {"tier": "2", "members": [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "s0"}}},
            {"type": "HyperNode", "selector": {"exactMatch": {"name": "s1"}}},
        ]}},
    ]  # fmt: skip
    return yaml.safe_dump({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList", "items": items})


def test_regex_and_label_selectors_with_the_node_list() -> None:
    topo = from_volcano(_regex_and_label_example(), kubectl_nodes(), kubectl_pods())
    assert topo["levels"] == [T2, T1, HOST]
    by = {n["name"]: n for n in topo["nodes"]}
    # node-0 by name and by regex; node-4..6 by label (block-1, not node-7); node-2/3/7 in no HyperNode
    assert sorted(by) == ["node-0", "node-1", "node-4", "node-5", "node-6"]
    assert by["node-1"]["labels"] == {T2: "s2", T1: "s0"} and by["node-6"]["labels"][T1] == "s1"
    # free GPUs as for Kueue: node-1 cordoned
    assert by["node-1"]["free_gpus"] == 0 and by["node-0"]["free_gpus"] == 8


def test_regex_is_a_search_as_in_go() -> None:
    """Go's MatchString finds the pattern anywhere: ``node-[01]`` also picks node-10."""
    nodes = {
        "items": [
            {"metadata": {"name": n, "labels": {}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
            for n in ("node-1", "node-10", "node-2")
        ]
    }
    text = yaml.safe_dump(
        {
            "kind": "HyperNode",
            "metadata": {"name": "s0"},
            "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": "node-[01]"}}}]},
        }
    )
    assert [n["name"] for n in from_volcano(text, nodes)["nodes"]] == ["node-1", "node-10"]


def _regex_pick(pattern: str, names: list[str]) -> list[str]:
    nodes = {"items": [{"metadata": {"name": n, "labels": {}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
                       for n in names]}  # fmt: skip
    member = {"type": "Node", "selector": {"regexMatch": {"pattern": pattern}}}
    text = yaml.safe_dump({"kind": "HyperNode", "metadata": {"name": "s0"}, "spec": {"tier": 1, "members": [member]}})
    return [n["name"] for n in from_volcano(text, nodes)["nodes"]]


def test_regex_is_re2_as_in_go() -> None:
    """Volcano matches with Go's regexp (RE2): linear time, so a nested quantifier against a long
    name answers at once (Python's backtracking engine ran for minutes), and syntax RE2 has no
    form for (lookahead, backreferences) is refused as Volcano refuses it."""
    long_name = "a" * 5000 + "x"
    signal.alarm(10)  # a backtracking engine would run for hours: fail, do not hang
    try:
        assert _regex_pick("(a+)+$", [long_name, "aaa"]) == ["aaa"]
    finally:
        signal.alarm(0)
    for unsupported in ("node-(?=1)", r"(a)\1"):
        with pytest.raises(ConvertError, match="bad regexMatch pattern"):
            _regex_pick(unsupported, ["node-1"])


def test_cli_writes_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "topo.json"
    assert (
        main(["topology", "from-volcano", str(DATA / "volcano-hypernodes.yaml"), "--busy", "node-3", "-o", str(out)])
        == 0
    )
    topo = json.loads(out.read_text())
    assert len(topo["nodes"]) == 8 and sum(n["free_gpus"] for n in topo["nodes"]) == 56
    bad = tmp_path / "bad.yaml"
    bad.write_text(_regex_and_label_example())
    assert main(["topology", "from-volcano", str(bad)]) == 2
    assert "need the node list (--nodes)" in capsys.readouterr().err


def test_bad_inputs_name_the_place() -> None:
    with pytest.raises(ConvertError, match="no object of kind HyperNode"):
        from_volcano("kind: Pod\nmetadata: {name: x}\n")
    with pytest.raises(ConvertError, match="spec.tier must be an integer"):
        from_volcano("kind: HyperNode\nmetadata: {name: s0}\nspec: {members: []}\n")
    two_parents = (
        EXAMPLE
        + "\n---\nkind: HyperNode\nmetadata: {name: s7}\nspec:\n  tier: 2\n  members:\n  - type: HyperNode\n    selector: {exactMatch: {name: s0}}\n"
    )
    with pytest.raises(ConvertError, match="HyperNode 's0' is a member of both 's4' and 's7'"):
        from_volcano(two_parents)
    missing = "kind: HyperNode\nmetadata: {name: s9}\nspec:\n  tier: 2\n  members:\n  - type: HyperNode\n    selector: {exactMatch: {name: nope}}\n"
    with pytest.raises(ConvertError, match="'nope' is not defined"):
        from_volcano(EXAMPLE + "\n---\n" + missing)


def test_a_busy_name_the_hypernodes_lack_is_an_error() -> None:
    with pytest.raises(ConvertError, match="--busy names nodes the topology does not have: node-9"):
        from_volcano(EXAMPLE, busy="node-[1,9]")
