"""Bounded parsing of request documents (JSON or YAML): size, nesting depth and YAML aliases.

A request document is a few hundred bytes nested four levels deep. These limits refuse what no
request needs before it costs time or memory: a document nested 100,000 deep (which would
overflow the parsers' recursion), or a YAML "billion laughs" whose aliases expand to millions of
nodes. Every refusal is a ``DocumentError`` with a one-line reason.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import yaml

MAX_DOCUMENT_BYTES = 8 << 20  # a 16,384-node topology (MAX_TOPOLOGY_NODES) with GKE-style names and labels
"""Largest request document read (the HTTP body limit's default)."""
MAX_DEPTH = 32
"""Deepest nesting of objects / arrays (a request document needs 4)."""
MAX_JSON_VALUES = 262_144
"""Most values a JSON document may hold, counted as its commas outside strings plus one (array
items and object members after the first): a 16,384-node topology with four labels a node takes
about 131,000, with eight labels and a full assignment about 197,000. Each value can cost a
validation error (and pydantic builds them all), so this bounds the work and a 422's size too."""
MAX_YAML_NODES = 400_000
"""Most YAML nodes a document may hold once every alias is expanded (a topology node with three
labels takes about 15: a 16,384-node topology about 250,000)."""
MAX_INVENTORY_BYTES = 64 << 20
"""Largest scheduler inventory read by ``pplan topology`` (``kubectl get nodes -o json`` of
thousands of nodes runs to tens of MB)."""
MAX_INVENTORY_YAML_NODES = 10_000_000
"""Most YAML nodes of such an inventory, aliases included."""

JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
"""A JSON string, or an unterminated one to the end of the text: every match ends where the
string does (no backtracking), so ``json_depth`` reads each character once. Requiring the
closing quote made an unterminated string cost a scan to the end from every quote in it:
quadratic (a 40 KB body of escaped quotes took 8 s)."""
_BRACKET = re.compile(r"[\[\]{}]")


class DocumentError(ValueError):
    """The document is too large, too deep, expands too much, or is not valid JSON / YAML."""


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in ``text`` outside strings (a linear scan)."""
    return json_shape(text)[0]


def json_shape(text: str) -> tuple[int, int]:
    """The nesting depth and the value count (commas plus one, what ``MAX_JSON_VALUES`` bounds) of
    the JSON ``text``, outside strings, from one linear pass."""
    bare = JSON_STRING.sub('""', text)
    depth = deepest = 0
    for match in _BRACKET.finditer(bare):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest, bare.count(",") + 1


def too_many_values_message() -> str:
    return f"JSON document with more than {MAX_JSON_VALUES:,} values (array items and object members)"


def parse_json(text: str, max_bytes: int = MAX_DOCUMENT_BYTES, max_values: int | None = MAX_JSON_VALUES) -> Any:
    """``json.loads`` within ``max_bytes`` and ``MAX_DEPTH``; a key given twice in one object is
    an error (JSON parsers keep the last silently)."""
    _check_size(text, max_bytes)
    depth, values = json_shape(text)
    if depth > MAX_DEPTH:
        raise DocumentError(f"JSON nested deeper than {MAX_DEPTH} levels")
    if max_values is not None and values > max_values:
        raise DocumentError(too_many_values_message())
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise DocumentError(duplicate_message(exc.key)) from exc
    except ValueError as exc:
        raise DocumentError(f"not valid JSON: {exc}") from exc


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def duplicate_message(key: str) -> str:
    return f"key {key!r} is given twice in one object (the last would silently win)"


def duplicate_json_key(text: str | bytes) -> str | None:
    """The first key some object of the JSON ``text`` gives twice (None: none, or not JSON)."""
    try:
        json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        return exc.key
    except ValueError:
        return None
    return None


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses deep nesting and alias expansion beyond the limits."""

    def __init__(self, stream: str, max_nodes: int = MAX_YAML_NODES) -> None:
        super().__init__(stream)
        self._max_nodes = max_nodes
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

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A mapping that gives a key twice is an error (PyYAML keeps the last silently)."""
        seen: set[Any] = set()
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)  # 1 and '1' are two keys
                if key in seen:
                    raise DocumentError(f"{duplicate_message(key_node.value)}, line {key_node.start_mark.line + 1}")
                seen.add(key)
        return super().construct_mapping(node, deep)

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > self._max_nodes:
            raise DocumentError(f"YAML expands to more than {self._max_nodes:,} nodes (aliases included)")


class _RequestLoader(_BoundedLoader):
    """A request document's loader: also reads ``1e12`` as a float (YAML 1.2; PyYAML's 1.1 rules
    want a dot, ``1.0e+12``, and give the string '1e12'), as token budgets are written.
    Inventories (topology files, kubectl output) keep the 1.1 rules: node names stay strings."""


YAML_INT, YAML_BOOL = "tag:yaml.org,2002:int", "tag:yaml.org,2002:bool"
YAML_FLOAT, YAML_TIMESTAMP = "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp"
# YAML 1.2 numbers and booleans: PyYAML's 1.1 rules read 0512 as octal (330), 1:04 and 1:04.5 as
# base 60 (64, 64.5), 2024-01-01 as a date and on / yes / off / no as booleans, silently; under 1.2
# those are strings the request refuses
_RequestLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in rules if tag not in (YAML_INT, YAML_BOOL, YAML_FLOAT, YAML_TIMESTAMP)]
    for first, rules in _RequestLoader.yaml_implicit_resolvers.items()
}
_RequestLoader.add_implicit_resolver(
    YAML_FLOAT,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_RequestLoader.add_implicit_resolver(YAML_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_RequestLoader.add_implicit_resolver(
    YAML_INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)


def _construct_int(loader: _RequestLoader, node: yaml.ScalarNode) -> int:
    """A YAML 1.2 integer (decimal, 0o octal, 0x hex); a decimal with a leading zero, which YAML 1.1
    reads as octal, is refused rather than read either way."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    if re.fullmatch(r"[-+]?0[0-9]+", text):
        raise DocumentError(
            f"line {node.start_mark.line + 1}: {text!r}: an integer with a leading zero (write it without)"
        )
    return int(text, 0)


_RequestLoader.add_constructor(YAML_INT, _construct_int)


def parse_yaml(text: str) -> Any:
    """A request document: ``yaml.safe_load`` (``_RequestLoader``) within ``MAX_DOCUMENT_BYTES``,
    ``MAX_DEPTH`` and ``MAX_YAML_NODES``."""
    return _load_yaml(text, MAX_DOCUMENT_BYTES, MAX_YAML_NODES, all_documents=False, loader_class=_RequestLoader)


def parse_yaml_all(
    text: str, max_bytes: int = MAX_INVENTORY_BYTES, max_nodes: int = MAX_INVENTORY_YAML_NODES
) -> list[Any]:
    """``yaml.safe_load_all`` within ``max_bytes``, ``MAX_DEPTH`` and ``max_nodes`` (all documents)."""
    return _load_yaml(text, max_bytes, max_nodes, all_documents=True)


def _load_yaml(
    text: str, max_bytes: int, max_nodes: int, all_documents: bool, loader_class: type[_BoundedLoader] = _BoundedLoader
) -> Any:
    _check_size(text, max_bytes)
    try:
        loader = loader_class(text, max_nodes)
    except yaml.YAMLError as exc:  # characters YAML does not allow
        raise DocumentError(f"not valid YAML: {_one_line(exc)}") from exc
    try:
        if not all_documents:
            return loader.get_single_data()
        docs = []
        while loader.check_data():
            docs.append(loader.get_data())
        return docs
    except DocumentError:
        raise
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # e.g. an integer of 5,000 digits
        raise DocumentError(f"not valid YAML: {_one_line(exc)}") from exc
    except RecursionError as exc:  # a safety net behind MAX_DEPTH
        raise DocumentError("YAML nested too deep") from exc
    finally:
        loader.dispose()


def read_text(path: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """A document file (``-``: standard input) as UTF-8 text (a byte-order mark dropped), read no
    further than one character past ``max_bytes``: ``/dev/zero`` or an endless pipe is refused at
    the limit instead of read into memory. Raises ``OSError``, ``UnicodeDecodeError`` or
    ``DocumentError`` (too large)."""
    if path == "-":
        text = sys.stdin.read(max_bytes + 1).removeprefix("\ufeff")
    else:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read(max_bytes + 1)
    _check_size(text, max_bytes)
    return text


def _check_size(text: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> None:
    if len(text) > max_bytes:
        raise DocumentError(f"larger than {max_bytes:,} bytes")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]
