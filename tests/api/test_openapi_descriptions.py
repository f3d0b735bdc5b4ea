"""Every property of every request schema in /openapi.json carries a description.

Walks each operation's request body from its schema down through every ``$ref`` it reaches
(nested models, list items, ``anyOf`` branches), so a field added without ``description=``
anywhere in a request fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from api.main import create_app

REQUEST_SCHEMAS = ("PlanRequest", "EvaluateRequest", "CompareRequest", "SweepRequest")


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    return create_app().openapi()


def _refs(node: Any) -> list[str]:
    """Component names referenced anywhere inside ``node``."""
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def request_components(spec: dict[str, Any]) -> set[str]:
    """Every component schema a request body of ``spec`` reaches."""
    bodies = [
        op["requestBody"]
        for path in spec["paths"].values()
        for op in path.values()
        if isinstance(op, dict) and "requestBody" in op
    ]
    schemas = spec["components"]["schemas"]
    todo, seen = _refs(bodies), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_refs(schemas[name]))
    return seen


def undocumented(spec: dict[str, Any], names: set[str]) -> list[str]:
    """``Schema.property`` for each property without a non-empty description."""
    schemas = spec["components"]["schemas"]
    return [
        f"{name}.{prop}"
        for name in sorted(names)
        for prop, sub in schemas[name].get("properties", {}).items()
        if not str(sub.get("description", "")).strip()
    ]


def test_request_bodies_reach_every_request_model(openapi: dict[str, Any]) -> None:
    names = request_components(openapi)
    for expected in (
        *REQUEST_SCHEMAS,
        "ModelSpec",
        "TrainingSpec",
        "ClusterSpec",
        "SearchSpec",
        "LayoutFix",
        "LayoutAllow",
        "ClusterTopology",
        "TopologyNode",
        "SweepVary",
        "MoEConfig",
        "MLAConfig",
        "CostsSpec",
        "ReliabilitySpec",
        "PlacementSpec",
    ):
        assert any(n == expected or n.startswith(expected + "-") for n in names), expected
    assert len(names) >= 20


def test_every_request_property_has_a_description(openapi: dict[str, Any]) -> None:
    names = request_components(openapi)
    properties = sum(len(openapi["components"]["schemas"][n].get("properties", {})) for n in names)
    assert properties >= 100
    assert undocumented(openapi, names) == []


def test_a_missing_description_is_caught(openapi: dict[str, Any]) -> None:
    """The check fails on a schema with one property stripped of its description."""
    spec = {**openapi, "components": {"schemas": dict(openapi["components"]["schemas"])}}
    training = dict(spec["components"]["schemas"]["TrainingSpec"])
    props = dict(training["properties"])
    props["seq_len"] = {k: v for k, v in props["seq_len"].items() if k != "description"}
    training["properties"] = props
    spec["components"]["schemas"]["TrainingSpec"] = training
    assert undocumented(spec, request_components(spec)) == ["TrainingSpec.seq_len"]
