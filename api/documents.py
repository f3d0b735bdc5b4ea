"""Bounded parsing of request documents (JSON or YAML): size, nesting depth and YAML aliases.

A request document is a few hundred bytes nested four levels deep. These limits refuse what no
request needs before it costs time or memory: a document nested 100,000 deep (which would
overflow the parsers' recursion), or a YAML "billion laughs" whose aliases expand to millions of
nodes. Every refusal is a ``DocumentError`` with a one-line reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

MAX_DOCUMENT_BYTES = 1 << 20
"""Largest request document read (the HTTP body limit's default)."""
MAX_DEPTH = 32
"""Deepest nesting of objects / arrays (a request document needs 4)."""
MAX_YAML_NODES = 100_000
"""Most YAML nodes a document may hold once every alias is expanded."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class DocumentError(ValueError):
    """The document is too large, too deep, expands too much, or is not valid JSON / YAML."""


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in ``text`` outside strings (a linear scan)."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse_json(text: str) -> Any:
    """``json.loads`` within ``MAX_DOCUMENT_BYTES`` and ``MAX_DEPTH``."""
    _check_size(text)
    if json_depth(text) > MAX_DEPTH:
        raise DocumentError(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DocumentError(f"not valid JSON: {exc}") from exc


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses deep nesting and alias expansion beyond the limits."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[int, int] = {}

    # The scanner's own nesting (flow brackets, block indentation) is bounded too: it scans a
    # whole flow collection ahead of the composer, quadratically in its depth.
    def fetch_flow_collection_start(self, token_class: Any) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise DocumentError(f"YAML nested deeper than {MAX_DEPTH} levels")
        super().fetch_flow_collection_start(token_class)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) >= MAX_DEPTH:
            raise DocumentError(f"YAML nested deeper than {MAX_DEPTH} levels")
        added: bool = super().add_indent(column)
        return added

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            anchored = self.anchors.get(event.anchor)
            self._count(self._sizes.get(id(anchored), 1))
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise DocumentError(f"YAML nested deeper than {MAX_DEPTH} levels")
        before = self._nodes
        self._count(1)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._nodes - before
        return node

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > MAX_YAML_NODES:
            raise DocumentError(f"YAML expands to more than {MAX_YAML_NODES:,} nodes (aliases included)")


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` within ``MAX_DOCUMENT_BYTES``, ``MAX_DEPTH`` and ``MAX_YAML_NODES``."""
    _check_size(text)
    try:
        loader = _BoundedLoader(text)
    except yaml.YAMLError as exc:  # characters YAML does not allow
        raise DocumentError(f"not valid YAML: {_one_line(exc)}") from exc
    try:
        return loader.get_single_data()
    except DocumentError:
        raise
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # e.g. an integer of 5,000 digits
        raise DocumentError(f"not valid YAML: {_one_line(exc)}") from exc
    except RecursionError as exc:  # a safety net behind MAX_DEPTH
        raise DocumentError("YAML nested too deep") from exc
    finally:
        loader.dispose()


def _check_size(text: str) -> None:
    if len(text) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"larger than {MAX_DOCUMENT_BYTES:,} bytes")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
