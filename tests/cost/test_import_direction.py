"""The cost model never imports the search, and the search never imports the service:
``optimizer.service`` builds on ``optimizer.search``, which builds on ``optimizer.cost``, not the
reverse, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COST = sorted((ROOT / "optimizer" / "cost").glob("*.py"))
SEARCH = sorted((ROOT / "optimizer" / "search").glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` anywhere in the file names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("path", COST, ids=lambda p: p.name)
def test_cost_modules_import_nothing_from_search_or_service(path: Path) -> None:
    upward = sorted(m for m in imported_modules(path) if m.startswith(("optimizer.search", "optimizer.service")))
    assert upward == [], f"{path.name} imports {upward}"


@pytest.mark.parametrize("path", SEARCH, ids=lambda p: p.name)
def test_search_modules_import_nothing_from_service(path: Path) -> None:
    upward = sorted(m for m in imported_modules(path) if m.startswith(("optimizer.service", "api")))
    assert upward == [], f"{path.name} imports {upward}"


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from optimizer.search.floors import split_floor_s\n")
    assert "optimizer.search.floors" in imported_modules(probe)
