"""The code's shape: small modules, short functions, and an import graph without cycles.

Every module of ``optimizer/`` and ``api/`` stays under ``MAX_MODULE_LINES`` lines and every
function under ``MAX_FUNCTION_LINES``; no module imports (at module level or inside a function,
directly or through other modules) a module that imports it back. A package's ``__init__`` counts
as importing what it imports, ``from pkg import name`` counts as importing ``pkg.name`` when
that is a module, and importing ``pkg.mod`` counts as importing ``pkg`` too (Python runs its
``__init__`` first) unless the importer is inside ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("optimizer", "api")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

LONG_FUNCTIONS_ALLOWED: set[str] = set()
"""Functions allowed over the limit (none; an entry must name a function that is still long)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the checked packages, by dotted name (a package by its own name)."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The checked modules module ``name`` (source text ``source``) imports anywhere, inside
    functions too: ``import a.b`` names ``a.b``; ``from a import b`` names ``a.b`` when that is a
    module and ``a`` otherwise; relative imports are resolved against ``name``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            # the deepest checked module the target names
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                found |= entered_packages(name, target, known)
    return found


def entered_packages(name: str, target: str, known: set[str]) -> set[str]:
    """The checked packages importing ``target`` runs first (each parent package's
    ``__init__``), less those module ``name`` is already inside (their ``__init__`` is running)."""
    parts = target.split(".")
    own = name.split(".")
    return {
        pkg
        for i in range(1, len(parts))
        if (pkg := ".".join(parts[:i])) in known and pkg != name and own[:i] != parts[:i]
    }


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path.read_text(), path.name == "__init__.py", known) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def long_modules(mods: dict[str, Path]) -> dict[str, int]:
    """Modules over ``MAX_MODULE_LINES`` lines, with their line counts."""
    counts = {name: len(path.read_text().splitlines()) for name, path in mods.items()}
    return {name: n for name, n in counts.items() if n > MAX_MODULE_LINES}


def long_functions(mods: dict[str, Path]) -> dict[str, int]:
    """Functions and methods over ``MAX_FUNCTION_LINES`` lines (decorators not counted), by
    module-qualified name, with their line counts."""
    long: dict[str, int] = {}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = n
    return long


def test_modules_are_short() -> None:
    long = long_modules(modules())
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_functions_are_short() -> None:
    long = {name: n for name, n in long_functions(modules()).items() if name not in LONG_FUNCTIONS_ALLOWED}
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_allowed_long_functions_still_exist_and_are_long() -> None:
    """An allow-list entry goes once its function is short (or gone)."""
    assert set(long_functions(modules())) >= LONG_FUNCTIONS_ALLOWED


def test_size_checks_flag_a_long_module_and_a_long_method(tmp_path: Path) -> None:
    def method(lines: int) -> str:
        """A class whose one method spans ``lines`` lines, its ``def`` included."""
        return "class A:\n    def f(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(lines - 1))

    at_limit, over = tmp_path / "a.py", tmp_path / "b.py"
    at_limit.write_text(method(MAX_FUNCTION_LINES))
    over.write_text(method(MAX_FUNCTION_LINES + 1))
    assert long_functions({"a": at_limit, "b": over}) == {"b.f": MAX_FUNCTION_LINES + 1}
    long_module = tmp_path / "c.py"
    long_module.write_text("x = 0\n" * (MAX_MODULE_LINES + 1))
    assert long_modules({"b": over, "c": long_module}) == {"c": MAX_MODULE_LINES + 1}


def test_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


LAYERS = ("api", "optimizer.service", "optimizer.search", "optimizer.cost")
"""Data flows down this list: a module imports nothing from a layer above its own."""


def layer_of(module: str) -> int | None:
    return next((i for i, top in enumerate(LAYERS) if module == top or module.startswith(top + ".")), None)


def test_layers_import_downward() -> None:
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in import_graph().items()
        for b in targets
        if (la := layer_of(a)) is not None and (lb := layer_of(b)) is not None and lb < la
    )
    assert upward == [], f"imports against the api -> service -> search -> cost direction: {upward}"


def test_cycle_finder_reports_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_imports_resolve_relative_function_level_and_from_package_names() -> None:
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.c", "p.sub.d", "q"}
    source = """
from . import d
from p.sub import not_a_module
import q


def f():
    from ..b import name
    from p import a
"""
    assert imports_of("p.sub.c", source, False, known) == {"p.sub.d", "p.sub", "q", "p.b", "p.a"}
    assert imports_of("p.sub", "from . import c\nfrom .. import b\n", True, known) == {"p.sub.c", "p.b"}


def test_importing_a_submodule_imports_its_package_first() -> None:
    """``frameworks -> specs.common`` runs ``specs/__init__``, which imports ``specs.job``, which
    imports ``frameworks``: a cycle Python reports as a partially initialised module."""
    known = {"p", "p.frameworks", "p.specs", "p.specs.common", "p.specs.job"}
    graph = {
        "p.frameworks": imports_of("p.frameworks", "from p.specs.common import X\n", False, known),
        "p.specs": imports_of("p.specs", "from .job import JobSpec\n", True, known),
        "p.specs.job": imports_of(
            "p.specs.job", "from p.frameworks import profile\nfrom . import common\n", False, known
        ),
    }
    assert graph["p.frameworks"] == {"p.specs.common", "p.specs"}
    assert graph["p.specs.job"] == {"p.frameworks", "p.specs.common"}  # already inside p.specs
    assert find_cycle(graph) == ["p.frameworks", "p.specs", "p.specs.job", "p.frameworks"]


def private_imports(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``from module import _name`` of the project's own modules from outside the module's package
    (a private name another package depends on), as ``file: module._name``."""
    found = []
    for path in paths:
        package = ".".join(path.relative_to(root).parent.parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or (node.module or "").split(".")[0] not in PROJECT_PACKAGES:
                continue
            if node.module.rpartition(".")[0] == package:  # type: ignore[union-attr]
                continue  # a package's own helpers
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}: {node.module}.{alias.name}")
    return found


PROJECT_PACKAGES = ("optimizer", "api", "hardware_catalog", "benchmarks")


def test_no_private_names_are_imported() -> None:
    paths = [p for d in (*PROJECT_PACKAGES, "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    assert private_imports(paths) == []


def test_private_import_check_flags_one(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "m.py").write_text("from optimizer.cost.context import _build_context_cached\n")
    (tmp_path / "optimizer").mkdir()
    (tmp_path / "optimizer" / "n.py").write_text("from optimizer.helpers import _shared\n")
    found = private_imports([tmp_path / "tests" / "m.py", tmp_path / "optimizer" / "n.py"], tmp_path)
    assert found == ["tests/m.py: optimizer.cost.context._build_context_cached"]


GPU_RATE_FIELDS = ("gemm_efficiency_bf16", "gemm_efficiency_fp8")


def test_gemm_efficiency_is_read_in_one_place() -> None:
    """The catalog's GEMM fractions are chosen in ``optimizer/cost/gpu_rates.py`` only (by precision,
    and replaced by ``cluster.gemm_efficiency``): a second reader would drift from the cost model
    (the board-power estimate and the notes once kept their own copies)."""
    readers = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "optimizer").rglob("*.py")
        if any(f".{name}" in path.read_text() for name in GPU_RATE_FIELDS)
    }
    assert readers == {"optimizer/cost/gpu_rates.py"}
