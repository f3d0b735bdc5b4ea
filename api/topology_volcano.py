"""Volcano ``HyperNode`` objects (``topology.volcano.sh/v1alpha1``) to ``cluster.topology`` JSON
(``pplan topology from-volcano``).

A HyperNode is a network domain at ``spec.tier`` (lower tiers communicate faster); its
``spec.members`` are nodes (``type: Node``, a leaf HyperNode) or HyperNodes one level up the tree
(``type: HyperNode``), each picked by ``selector.exactMatch.name``, ``selector.regexMatch.pattern``
(a search in the node name, as Go's ``regexp.MatchString``) or ``selector.labelMatch`` (a
Kubernetes label selector on the node's labels). Every tier becomes one level, coarsest first
(``volcano/tier-<n>``), then the hostname. A node whose chain of HyperNodes skips a tier is its
nearest finer domain's own domain there (and the top of its chain above it).

Free GPUs: with ``kubectl get nodes -o json`` (needed for regexMatch and labelMatch), as for Kueue
(allocatable ``nvidia.com/gpu`` less the requests of running pods, 0 on cordoned or not Ready
nodes); without it, ``gpus_per_node`` on every node not in ``busy``.
"""

from __future__ import annotations

from typing import Any

import re2

from api.documents import DocumentError, parse_yaml_all
from api.topology_convert import (
    ConvertError,
    busy_names,
    check_busy_known,
    expect_mapping,
    free_gpus,
    kubectl_items,
    requested_gpus,
)
from optimizer.topology_spec import HOSTNAME_LABEL, VOLCANO_TIER_PREFIX

TIER_LEVEL = VOLCANO_TIER_PREFIX + "{tier}"
KINDS = ("HyperNode",)


def _hypernodes(text: str) -> dict[str, dict]:
    """name -> {"tier": int, "members": [...]} of every HyperNode in the YAML (separate
    documents, or a ``kubectl get hypernodes -o yaml`` list)."""
    try:
        docs = [d for d in parse_yaml_all(text) if isinstance(d, dict)]
    except DocumentError as e:
        raise ConvertError(f"HyperNode: {e}") from e
    items = [i for d in docs for i in (d.get("items") or [d]) if isinstance(i, dict)]
    out: dict[str, dict] = {}
    for item in items:
        if item.get("kind", "HyperNode") not in KINDS:
            continue
        name = expect_mapping(item.get("metadata") or {}, "HyperNode metadata").get("name")
        spec = expect_mapping(item.get("spec") or {}, f"HyperNode {name} spec")
        raw_tier: Any = spec.get("tier")  # int() turns None or text that is no integer down
        try:
            tier = int(raw_tier)
        except (TypeError, ValueError):
            raise ConvertError(f"HyperNode {name}: spec.tier must be an integer, got {spec.get('tier')!r}") from None
        if not name:
            raise ConvertError("HyperNode: an object has no metadata.name")
        members = spec.get("members") or []
        if not isinstance(members, list):
            raise ConvertError(f"HyperNode {name}: spec.members must be a list, not {members!r}")
        if name in out:
            raise ConvertError(f"HyperNode {name}: defined twice")
        out[name] = {"tier": tier, "members": [expect_mapping(m, f"HyperNode {name}: a member") for m in members]}
    if not out:
        raise ConvertError("HyperNode: no object of kind HyperNode")
    return out


def _label_match(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes ``LabelSelector``: every matchLabels pair and every matchExpressions term."""
    if any(labels.get(k) != str(v) for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for term in selector.get("matchExpressions") or []:
        key, op, values = term.get("key"), term.get("operator"), [str(v) for v in term.get("values") or []]
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(op)
        if ok is None:
            raise ConvertError(f"labelMatch: unknown operator {op!r}")
        if not ok:
            return False
    return True


def _members(hn: str, member: dict, nodes: dict[str, dict] | None) -> list[str]:
    """Names a member's selector picks (nodes: name -> labels, None when no node list is given)."""
    sel = member.get("selector") or {}
    if "exactMatch" in sel:
        name = str(expect_mapping(sel["exactMatch"] or {}, f"HyperNode {hn}: exactMatch").get("name") or "")
        return [name] if name else []  # Volcano: an empty name selects no node
    if member.get("type") == "HyperNode":
        raise ConvertError(f"HyperNode {hn}: a HyperNode member needs selector.exactMatch")
    if nodes is None:
        raise ConvertError(f"HyperNode {hn}: regexMatch and labelMatch need the node list (--nodes)")
    if "regexMatch" in sel:
        try:  # RE2, as Volcano's Go regexp: linear time, and the syntax Volcano takes
            pattern = re2.compile(str((sel["regexMatch"] or {}).get("pattern", "")))
        except re2.error as e:
            raise ConvertError(f"HyperNode {hn}: bad regexMatch pattern ({e})") from e
        return [n for n in nodes if pattern.search(n)]
    if "labelMatch" in sel:
        match = sel["labelMatch"] or {}
        if not match.get("matchLabels") and not match.get("matchExpressions"):
            return []  # Volcano: an empty labelMatch selects no node (hypernode/member_selector.go)
        return [n for n, labels in nodes.items() if _label_match(match, labels)]
    raise ConvertError(f"HyperNode {hn}: a member has no exactMatch, regexMatch or labelMatch selector")


def _tree(hns: dict[str, dict], nodes: dict[str, dict] | None) -> tuple[dict[str, str], dict[str, str]]:
    """(node -> leaf HyperNode, HyperNode -> parent HyperNode)."""
    leaf_of: dict[str, str] = {}
    parent: dict[str, str] = {}
    for name, hn in hns.items():
        for member in hn["members"]:
            kind = member.get("type", "Node")
            target = parent if kind == "HyperNode" else leaf_of
            for child in _members(name, member, nodes):
                if kind == "HyperNode" and child not in hns:
                    raise ConvertError(f"HyperNode {name}: member HyperNode {child!r} is not defined")
                if target.get(child, name) != name:
                    raise ConvertError(f"{kind} {child!r} is a member of both {target[child]!r} and {name!r}")
                target[child] = name
    return leaf_of, parent


def _chain(leaf: str, parent: dict[str, str], limit: int) -> list[str]:
    chain = [leaf]
    while chain[-1] in parent:
        chain.append(parent[chain[-1]])
        if len(chain) > limit:
            raise ConvertError(f"HyperNode {leaf!r}: its parents form a cycle")
    return chain


def from_volcano(
    text: str, nodes_json: dict | None = None, pods_json: dict | None = None, gpus_per_node: int = 8, busy: str = ""
) -> dict:
    """``cluster.topology`` from Volcano HyperNodes (``busy``: hostlist of nodes in use, without
    ``nodes_json``)."""
    if nodes_json is not None and busy:
        raise ConvertError("--busy applies without --nodes (with it, free GPUs come from the nodes and pods)")
    if nodes_json is None and pods_json is not None:
        raise ConvertError("--pods needs --nodes (without them every node has --gpus-per-node free, less --busy)")
    hns = _hypernodes(text)
    listed = kubectl_items(nodes_json, "nodes") if nodes_json is not None else []
    items = {i["metadata"].get("name"): i for i in listed if isinstance(i.get("metadata"), dict)}
    labels = None if nodes_json is None else {n: i["metadata"].get("labels") or {} for n, i in items.items() if n}
    leaf_of, parent = _tree(hns, labels)
    if not leaf_of:
        raise ConvertError("HyperNode: no leaf HyperNode has a node member")
    tiers = sorted({hn["tier"] for hn in hns.values()}, reverse=True)
    levels = [TIER_LEVEL.format(tier=t) for t in tiers] + [HOSTNAME_LABEL]
    used = requested_gpus(pods_json)
    taken = busy_names(busy)
    out = []
    for node, leaf in leaf_of.items():
        chain = _chain(leaf, parent, len(hns))
        path: dict[str, Any] = {}
        for t, level in zip(tiers, levels, strict=False):
            at_or_above = [h for h in chain if hns[h]["tier"] >= t]
            path[level] = min(at_or_above, key=lambda h: hns[h]["tier"]) if at_or_above else chain[-1]
        if nodes_json is None:
            free = 0 if node in taken else gpus_per_node
        else:
            free = free_gpus(items[node], used) if node in items else 0
        out.append({"name": node, "labels": path, "free_gpus": free})
    check_busy_known(taken, set(leaf_of))
    return {"levels": levels, "nvlink_level": HOSTNAME_LABEL, "nodes": out}
