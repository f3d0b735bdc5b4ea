"""Scheduler topology descriptions to ``cluster.topology`` JSON (``pplan topology from-slurm`` /
``from-kueue``).

Slurm (``topology.yaml``, topology.yaml(5)): a ``tree`` topology gives one level per switch depth
(``slurm/switch-1`` is the root's), a ``block`` topology one level for the base blocks
(``slurm/block``) and one per higher block size (``slurm/block-<size>``: consecutive base blocks
holding that many nodes). Kueue: the ``Topology`` object's ``spec.levels[].nodeLabel`` and the
nodes of ``kubectl get nodes -o json`` that its ``ResourceFlavor`` selects (free GPUs:
allocatable ``nvidia.com/gpu`` less the requests of the pods of ``kubectl get pods -A -o json``
that hold them, 0 on cordoned or not Ready nodes and on nodes with a taint the flavor does not
tolerate).
"""

from __future__ import annotations

from typing import Any

import hostlist

from api.documents import DocumentError, parse_yaml_all
from optimizer.topology_spec import HOSTNAME_LABEL, MAX_TOPOLOGY_NODES

CLIQUE_LABEL = "nvidia.com/gpu.clique"
GPU_RESOURCE = "nvidia.com/gpu"


class ConvertError(ValueError):
    """The input is not a topology the converter understands (the message says where)."""


MAX_EXPANDED_NODES = MAX_TOPOLOGY_NODES
"""Most node names one converter run expands (a request takes at most that many nodes)."""


def hostlist_size(text: str) -> int:
    """Names ``text`` expands to, counted from its bracket ranges in one pass without expanding it
    (an upper bound for malformed text, which ``expand_hostlist`` then refuses)."""
    total, item, group, depth, parts = 0, 1, 0, 0, ""
    for ch in text + ",":
        if ch == "[" and depth == 0:
            depth, parts = 1, ""
        elif ch == "]" and depth == 1:
            depth, group = 0, sum(_range_size(p) for p in parts.split(","))
            item *= max(group, 1)
        elif depth == 1:
            parts += ch
        elif ch == ",":
            total, item = total + item, 1
    return total


def _range_size(part: str) -> int:
    """Names one bracket part ``lo-hi`` (or one number) stands for, read as hostlist reads the
    numbers (``int``: surrounding white space and any Unicode digits)."""
    lo, sep, hi = part.partition("-")
    if not sep:
        return 1
    try:
        return abs(int(hi) - int(lo)) + 1
    except ValueError:  # not a range hostlist can expand either
        return 1


def expand_hostlists(value: Any, where: str, budget: list[int] | None = None) -> list[str]:
    """Node names of a hostlist or a list of them (``budget``: names left to expand in this run,
    one shared count, decremented; past it a ``ConvertError``)."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    left = budget if budget is not None else [MAX_EXPANDED_NODES]
    for item in items:
        if not isinstance(item, (str, int)) or isinstance(item, bool):
            raise ConvertError(f"{where}: expected a hostlist, not {type(item).__name__} {item!r}")
        left[0] -= hostlist_size(str(item))
        if left[0] < 0:
            raise ConvertError(f"{where}: more than {MAX_EXPANDED_NODES:,} nodes (a request takes at most that many)")
        try:
            out.extend(hostlist.expand_hostlist(str(item), allow_duplicates=True))
        except hostlist.BadHostlist as e:
            raise ConvertError(f"{where}: bad hostlist {item!r} ({e})") from e
    return out


def expect_mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ConvertError(f"{where}: expected a mapping, not {type(value).__name__} {value!r}")
    return value


def busy_names(busy: str) -> set[str]:
    """The nodes of ``--busy``: hostlists separated by commas, spaces or new lines (``squeue -h -o
    %N`` prints one job's hostlist per line)."""
    return set(expand_hostlists(busy.split(), "--busy")) if busy.strip() else set()


def check_busy_known(busy: set[str], names: set[str]) -> None:
    """A ``--busy`` name the topology does not have is an error, not a node silently left free
    (a typo, or a long host name where the topology has short ones)."""
    unknown = sorted(busy - names)
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise ConvertError(f"--busy names nodes the topology does not have: {shown}")


def _kueue_docs(text: str) -> tuple[list[str], dict]:
    """(levels, the ResourceFlavor's spec) of a Kueue ``Topology`` and the ``ResourceFlavor`` whose
    ``spec.topologyName`` names it ({} when the file has none)."""
    try:
        docs = [d for d in parse_yaml_all(text) if isinstance(d, dict)]
    except DocumentError as e:
        raise ConvertError(f"Topology: {e}") from e
    topo = next((d for d in docs if d.get("kind") == "Topology"), None)
    if topo is None:
        raise ConvertError("Topology: no object of kind Topology")
    levels = [lv.get("nodeLabel") for lv in (topo.get("spec") or {}).get("levels") or []]
    if not levels or not all(isinstance(x, str) for x in levels):
        raise ConvertError("Topology.spec.levels: expected a list of {nodeLabel: <label>}")
    name = (topo.get("metadata") or {}).get("name")
    flavors = [d for d in docs if d.get("kind") == "ResourceFlavor" and _field(d, "spec").get("topologyName") == name]
    if len(flavors) > 1:
        raise ConvertError(f"ResourceFlavor: {len(flavors)} flavors name topology {name!r}; give the one the job uses")
    return levels, _field(flavors[0], "spec") if flavors else {}


def _tolerated(taint: dict, tolerations: list) -> bool:
    """Whether a toleration matches ``taint`` (Kubernetes ``Toleration.ToleratesTaint``)."""
    for t in tolerations:
        if not isinstance(t, dict):
            continue
        key_ok = t.get("key") == taint.get("key") or (not t.get("key") and t.get("operator") == "Exists")
        effect_ok = not t.get("effect") or t.get("effect") == taint.get("effect")
        value_ok = t.get("operator") == "Exists" or str(t.get("value", "")) == str(taint.get("value", ""))
        if key_ok and effect_ok and value_ok:
            return True
    return False


SCHEDULING_TAINTS = ("NoSchedule", "NoExecute")
"""Taint effects that keep pods off a node (Kueue's TAS skips nodes with one not tolerated:
``scheduling_simulator_default.go``, ``IsSchedulingTaint``)."""


def _untolerated_taint(node: dict, tolerations: list) -> bool:
    taints = _field(node, "spec").get("taints") or []
    return any(
        isinstance(t, dict) and t.get("effect") in SCHEDULING_TAINTS and not _tolerated(t, tolerations) for t in taints
    )


def kubectl_items(doc: Any, what: str) -> list[dict]:
    """The ``items`` of a ``kubectl get ... -o json`` document, each an object (else ``ConvertError``)."""
    items = doc.get("items", []) if isinstance(doc, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ConvertError(f"{what}: expected kubectl JSON, an object whose 'items' is a list of objects")
    return items


def _field(obj: Any, key: str) -> dict:
    """``obj[key]`` as an object ({} when absent or null; ``ConvertError`` when something else)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConvertError(f"{key}: expected an object, not {type(value).__name__}")
    return value


def gpu_quantity(value: Any, where: str) -> int:
    """A whole number of GPUs from a Kubernetes quantity (``8`` or ``"8"``)."""
    if isinstance(value, bool) or not (
        isinstance(value, int) or isinstance(value, str) and value.isascii() and value.isdigit()
    ):
        raise ConvertError(f"{where}: {GPU_RESOURCE} {value!r} is not a whole number of GPUs")
    return int(value)


def _requested_gpus(pods: Any) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in kubectl_items(pods, "pods"):
        spec = _field(pod, "spec")
        node = spec.get("nodeName")
        phase = _field(pod, "status").get("phase")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        containers = spec.get("containers") or []
        if not isinstance(containers, list):
            raise ConvertError(f"pods: pod on {node!r}: spec.containers is not a list")
        for c in containers:
            req = _field(_field(c, "resources"), "requests").get(GPU_RESOURCE)
            used[node] = used.get(node, 0) + (0 if req is None else gpu_quantity(req, f"pods: pod on {node!r}"))
    return used


def _ready(node: dict) -> bool:
    """A Ready condition with status True (Kueue's ``IsNodeStatusConditionTrue``: none is not ready)."""
    conds = _field(node, "status").get("conditions") or []
    ready = [c for c in conds if isinstance(c, dict) and c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True"


def requested_gpus(pods_json: dict | None) -> dict[str, int]:
    """GPUs requested per node by the running pods of ``kubectl get pods -A -o json``."""
    return _requested_gpus(pods_json or {})


def free_gpus(node: dict, used: dict[str, int]) -> int:
    """Free GPUs of a ``kubectl get nodes -o json`` item: allocatable less ``used``, 0 when cordoned
    or not Ready."""
    name = _field(node, "metadata").get("name", "")
    alloc = gpu_quantity(_field(_field(node, "status"), "allocatable").get(GPU_RESOURCE, 0), f"nodes: {name!r}")
    if _field(node, "spec").get("unschedulable") or not _ready(node):
        return 0
    return max(0, alloc - used.get(name, 0))


def from_kueue(topology_text: str, nodes_json: dict, pods_json: dict | None = None) -> dict:
    """``cluster.topology`` from a Kueue ``Topology`` object (and the ``ResourceFlavor`` naming it,
    when the file has one) and ``kubectl get nodes -o json``: the nodes Kueue's topology-aware
    scheduling sees, those with the flavor's ``nodeLabels`` and every level label; a node with a
    NoSchedule or NoExecute taint the flavor does not tolerate has no free GPU."""
    levels, flavor = _kueue_docs(topology_text)
    wanted = {str(k): str(v) for k, v in _field(flavor, "nodeLabels").items()}
    tolerations = flavor.get("tolerations") or []
    used = requested_gpus(pods_json)
    nodes = []
    for item in kubectl_items(nodes_json, "nodes"):
        meta = _field(item, "metadata")
        name, labels = meta.get("name"), _field(meta, "labels")
        if not name or any(lv not in labels and lv != HOSTNAME_LABEL for lv in levels):
            continue  # not part of this topology
        if any(labels.get(k) != v for k, v in wanted.items()):
            continue  # not of the flavor
        nodes.append(
            {
                "name": name,
                "labels": {lv: labels[lv] for lv in levels if lv in labels},
                "free_gpus": 0 if _untolerated_taint(item, tolerations) else free_gpus(item, used),
            }
        )
    if not nodes:
        flavor_part = f" and the ResourceFlavor's nodeLabels {wanted}" if wanted else ""
        raise ConvertError(f"nodes: no node carries every level label {levels}{flavor_part}")
    if HOSTNAME_LABEL not in levels:
        levels = levels + [HOSTNAME_LABEL]
    nvlink = CLIQUE_LABEL if CLIQUE_LABEL in levels else (HOSTNAME_LABEL if HOSTNAME_LABEL in levels else levels[-1])
    return {"levels": levels, "nvlink_level": nvlink, "nodes": nodes}
