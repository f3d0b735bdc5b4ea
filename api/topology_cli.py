"""``pplan topology from-slurm`` / ``from-kueue`` / ``from-volcano``: write ``cluster.topology`` JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import hostlist
from pydantic import ValidationError

from api.cli_args import EXIT_INVALID, EXIT_OK, OutputError, write_output
from api.documents import MAX_INVENTORY_BYTES, DocumentError, parse_json, read_text
from api.topology_convert import ConvertError, from_kueue
from api.topology_slurm import from_slurm
from api.topology_volcano import from_volcano
from optimizer.topology_spec import ClusterTopology


def _read(path: str) -> str:
    """A scheduler file, read no further than ``MAX_INVENTORY_BYTES``."""
    try:
        return read_text(path, MAX_INVENTORY_BYTES)
    except UnicodeDecodeError as exc:
        raise ConvertError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _inventory(path: str) -> Any:
    """A ``kubectl ... -o json`` document, bounded (``api.documents``)."""
    return parse_json(_read(path), MAX_INVENTORY_BYTES, max_values=None)  # bounded by its bytes only


def _emit(topology: dict, out: str | None) -> None:
    text = json.dumps(topology, indent=2) + "\n"
    if out:
        try:
            Path(out).write_text(text)
        except OSError as exc:  # a full disk, a missing directory: the answer, not the input
            raise OutputError(f"{out}: {exc.strerror or exc}") from exc
    else:
        write_output(text)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.source == "from-slurm":
            topo = from_slurm(_read(args.file), args.gpus_per_node, args.busy or "", args.name)
        elif args.source == "from-volcano":
            nodes = _inventory(args.nodes) if args.nodes else None
            pods = _inventory(args.pods) if args.pods else None
            topo = from_volcano(_read(args.file), nodes, pods, args.gpus_per_node, args.busy or "")
        else:
            pods = _inventory(args.pods) if args.pods else None
            topo = from_kueue(_read(args.topology), _inventory(args.nodes), pods)
        _emit(checked(with_nvlink_level(topo, args.nvlink_level)), args.output)
    except (ConvertError, DocumentError, OSError, hostlist.BadHostlist) as exc:
        sys.stderr.write(f"pplan: topology {args.source}: {exc}\n")
        return EXIT_INVALID
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError, ValueError) as exc:
        # a field of another shape than the scheduler writes (a list for a name, a number for a
        # mapping) that the converter's own checks did not name
        sys.stderr.write(f"pplan: topology {args.source}: malformed input ({type(exc).__name__}: {exc})\n")
        return EXIT_INVALID
    return EXIT_OK


def with_nvlink_level(topo: dict, level: str | None) -> dict:
    """``topo`` with ``--nvlink-level``: the level whose domains are NVLink domains (an NVL72 rack
    as a Slurm block, a provider's clique label), one of its levels."""
    if level is None:
        return topo
    if level not in topo["levels"]:
        raise ConvertError(f"--nvlink-level: {level!r} is not one of the topology's levels {topo['levels']}")
    return {**topo, "nvlink_level": level}


def checked(topo: dict) -> dict:
    """``topo`` when /plan takes it as ``cluster.topology``; else a ``ConvertError`` naming the
    first field it refuses (a label that is not a string, free GPUs beyond 1,024, ...)."""
    try:
        ClusterTopology.model_validate(topo)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConvertError(
            f"the topology it makes is not one /plan takes: {where or 'topology'}: {first['msg']}"
        ) from None
    return topo


MAX_GPUS_PER_NODE = 1024
"""The most free GPUs a topology node may have (``TopologyNode.free_gpus``)."""


def _positive(text: str) -> int:
    """A GPU count from 1 to ``MAX_GPUS_PER_NODE`` (argparse reports anything else as a usage
    error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_GPUS_PER_NODE:
        raise argparse.ArgumentTypeError(f"expected a whole number of GPUs from 1 to {MAX_GPUS_PER_NODE}, not {text!r}")
    return value


def add_topology_commands(sub: argparse._SubParsersAction) -> None:
    topo = sub.add_parser("topology", help="convert a scheduler's topology to cluster.topology JSON")
    kinds = topo.add_subparsers(dest="source", required=True, metavar="SOURCE")
    slurm = kinds.add_parser("from-slurm", help="Slurm topology.yaml or topology.conf (tree or block plugin)")
    slurm.add_argument("file", metavar="TOPOLOGY_YAML_OR_CONF")
    slurm.add_argument("--gpus-per-node", type=_positive, default=8, help="GPUs on each node (default 8)")
    slurm.add_argument("--busy", help="hostlist of nodes in use (e.g. from squeue -h -o %%N)")
    slurm.add_argument("--name", help="topology name (default: the cluster_default one)")
    kueue = kinds.add_parser("from-kueue", help="Kueue Topology object + kubectl get nodes -o json")
    kueue.add_argument("topology", metavar="TOPOLOGY_YAML")
    kueue.add_argument("nodes", metavar="NODES_JSON", help="kubectl get nodes -o json")
    kueue.add_argument("--pods", metavar="PODS_JSON", help="kubectl get pods -A -o json (GPUs in use)")
    volcano = kinds.add_parser("from-volcano", help="Volcano HyperNode objects (kubectl get hypernodes -o yaml)")
    volcano.add_argument("file", metavar="HYPERNODES_YAML")
    volcano.add_argument(
        "--nodes", metavar="NODES_JSON", help="kubectl get nodes -o json (free GPUs; regexMatch, labelMatch)"
    )
    volcano.add_argument("--pods", metavar="PODS_JSON", help="kubectl get pods -A -o json (GPUs in use)")
    volcano.add_argument(
        "--gpus-per-node", type=_positive, default=8, help="free GPUs on each node without --nodes (default 8)"
    )
    volcano.add_argument("--busy", help="hostlist of nodes in use, without --nodes")
    for p in (slurm, kueue, volcano):
        p.add_argument(
            "--nvlink-level",
            help="the level whose domains are NVLink domains (e.g. slurm/block for NVL72 racks as Slurm blocks; "
            "default: the clique label where there is one, else the node)",
        )
        p.add_argument("--output", "-o", help="write the JSON here (default: standard output)")
        p.set_defaults(handler=_run)
