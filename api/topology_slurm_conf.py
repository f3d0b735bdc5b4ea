"""Slurm's classic ``topology.conf`` read into the shape of its ``topology.yaml`` (one topology).

topology/tree lines: ``SwitchName=<name> [Switches=<hostlist>] [Nodes=<hostlist>]``; topology/block
lines: ``BlockName=<name> Nodes=<hostlist>`` and one ``BlockSizes=<n>[,<n>...]``
(``slurm.conf``'s man page, topology.conf(5)). ``#`` starts a comment; keys are case-insensitive,
as Slurm parses them; a line of ``LinkSpeed=`` is allowed and ignored."""

from __future__ import annotations

import re

from api.topology_convert import ConvertError

_PAIR = re.compile(r'(\w+)\s*=\s*("[^"]*"|\S+)')
"""A ``Key=value`` pair as Slurm's parser reads it: spaces around ``=`` allowed, a value quoted."""
TREE_KEYS = {"switchname", "switches", "nodes", "linkspeed"}
BLOCK_KEYS = {"blockname", "nodes"}


def looks_like_conf(text: str) -> bool:
    """Whether ``text`` is a topology.conf: its first statement is a ``Key=value`` pair."""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            return bool(re.match(r"(?i)(switchname|blockname|blocksizes)\s*=", line))
    return False


def parse_conf(text: str) -> list[dict]:
    """The topology.yaml list (one topology, ``tree`` or ``block``) ``text`` describes."""
    switches, blocks, sizes = [], [], None
    for number, line in _statements(text):
        pairs = {k.lower(): v.strip('"') for k, v in _PAIR.findall(line)}
        if not pairs or _PAIR.sub("", line).strip():
            raise ConvertError(f"topology.conf line {number}: expected Key=value pairs, not {line!r}")
        if "switchname" in pairs:
            _check_keys(pairs, TREE_KEYS, number)
            entry = {"switch": pairs["switchname"]}
            entry |= {k: pairs[k] for k in ("switches", "nodes") if k in pairs}
            switches.append({("children" if k == "switches" else k): v for k, v in entry.items()})
        elif "blockname" in pairs:
            _check_keys(pairs, BLOCK_KEYS, number)
            blocks.append({"block": pairs["blockname"], "nodes": pairs.get("nodes")})
        elif set(pairs) == {"blocksizes"}:
            sizes = _sizes(pairs["blocksizes"], number)
        else:
            raise ConvertError(f"topology.conf line {number}: needs SwitchName=, BlockName= or BlockSizes=")
    if switches and (blocks or sizes):
        raise ConvertError("topology.conf: both SwitchName (tree) and BlockName (block) lines; a file is one plugin's")
    if switches:
        return [{"topology": "topology.conf", "tree": {"switches": switches}}]
    if not blocks:
        raise ConvertError("topology.conf: no SwitchName or BlockName lines")
    return [{"topology": "topology.conf", "block": {"blocks": blocks, **({"block_sizes": sizes} if sizes else {})}}]


def _statements(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each statement: comments dropped, a line ending in ``\\``
    continued on the next, as Slurm's parser joins them."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined = (pending + line).strip()
        pending = ""
        if joined:
            out.append((start, joined))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _check_keys(pairs: dict[str, str], allowed: set[str], number: int) -> None:
    unknown = sorted(set(pairs) - allowed)
    if unknown:
        raise ConvertError(f"topology.conf line {number}: unknown key {unknown[0]!r} (allowed: {sorted(allowed)})")


def _sizes(value: str, number: int) -> list[int]:
    try:
        return [int(v) for v in value.split(",")]
    except ValueError:
        raise ConvertError(f"topology.conf line {number}: BlockSizes takes node counts, not {value!r}") from None
