"""Load and validate the hardware catalog: ``gpus.toml``, ``networks.toml``, ``clusters.toml``.

Validation happens once, at load time, and fails loudly: every problem becomes a
:class:`CatalogError` whose message names the file, the entry id and the field.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from hardware_catalog.schema import ClusterEntry, GpuEntry, NetworkEntry, Quantity

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The catalog shipped with the package."""

GPUS_FILE = "gpus.toml"
NETWORKS_FILE = "networks.toml"
CLUSTERS_FILE = "clusters.toml"
FILES: tuple[str, ...] = (GPUS_FILE, NETWORKS_FILE, CLUSTERS_FILE)

ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
VERSION_HEX_CHARS = 12
FIRST_TIER = "nvlink"

_Entry = TypeVar("_Entry", bound=BaseModel)


class CatalogError(Exception):
    """The catalog data is invalid.

    ``str(err)`` lists every problem as ``file: entry 'id': field 'name': reason``;
    ``file`` and ``problems`` hold the same information.
    """

    def __init__(self, file: str | Path, problems: list[str]) -> None:
        self.file = str(file)
        self.problems = list(problems)
        lines = [f"{self.file}: {p}" for p in self.problems]
        head = f"invalid hardware catalog ({len(lines)} problem{'s' if len(lines) != 1 else ''})"
        super().__init__(head + ":\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class Catalog:
    """The validated catalog.

    Treat the mappings as read-only: ``load_catalog()`` hands the same instance to every caller.
    """

    gpus: dict[str, GpuEntry]
    networks: dict[str, NetworkEntry]
    clusters: dict[str, ClusterEntry]
    version: str
    """First 12 hex digits of the SHA-256 of the three data files (name + content, fixed order)."""


@functools.cache
def load_catalog() -> Catalog:
    """The catalog shipped with the package (loaded and validated once per process)."""
    return load_catalog_from(DATA_DIR)


def load_catalog_from(directory: Path) -> Catalog:
    """Load and validate the three catalog files found in ``directory``."""
    directory = Path(directory)
    raw: dict[str, bytes] = {}
    for name in FILES:
        path = directory / name
        try:
            raw[name] = path.read_bytes()
        except OSError as exc:
            raise CatalogError(path, [f"cannot read catalog file ({exc.strerror or exc})"]) from exc

    gpus = _parse_entries(directory / GPUS_FILE, raw[GPUS_FILE], GpuEntry)
    networks = _parse_entries(directory / NETWORKS_FILE, raw[NETWORKS_FILE], NetworkEntry)
    clusters = _parse_entries(directory / CLUSTERS_FILE, raw[CLUSTERS_FILE], ClusterEntry)
    _check_clusters(directory / CLUSTERS_FILE, clusters, gpus, networks)
    return Catalog(gpus=gpus, networks=networks, clusters=clusters, version=_version(raw))


def _version(raw: Mapping[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in FILES:
        data = raw[name]
        digest.update(name.encode())
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()[:VERSION_HEX_CHARS]


# --- parsing ------------------------------------------------------------------------------------

_TOML_LINE = re.compile(r"at line (\d+)")
_KEY_AT_LINE = re.compile(r"^\s*(\[\[?[^\]]*\]\]?|[A-Za-z0-9_.\"'-]+)\s*(=|$)")


def _toml_problem(text: str, exc: tomllib.TOMLDecodeError) -> str:
    """Turn a TOML syntax error into a message naming the line and the key on it."""
    msg = str(exc)
    match = _TOML_LINE.search(msg)
    if match is None:
        return f"invalid TOML: {msg}"
    lineno = int(match.group(1))
    lines = text.splitlines()
    line = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    key = _KEY_AT_LINE.match(line)
    where = f"line {lineno}"
    if key is not None:
        where += f", key '{key.group(1).strip()}'"
    hint = ""
    if "overwrite" in msg.lower() or "twice" in msg.lower() or "duplicate" in msg.lower():
        hint = " (duplicate id or key)"
    return f"invalid TOML at {where}: {msg}{hint}"


def _parse_entries(path: Path, data: bytes, model: type[_Entry]) -> dict[str, _Entry]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(path, [f"not UTF-8 ({exc})"]) from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(path, [_toml_problem(text, exc)]) from exc

    problems: list[str] = []
    entries: dict[str, _Entry] = {}
    if not doc:
        problems.append("no entries")
    for entry_id, body in doc.items():
        label = f"entry '{entry_id}'"
        if not ID_PATTERN.match(entry_id):
            problems.append(f"{label}: id must match {ID_PATTERN.pattern}")
            continue
        if not isinstance(body, dict):
            kind = type(body).__name__
            problems.append(f"{label}: must be a table ([{entry_id}] with fields), got {kind}")
            continue
        try:
            entry = model.model_validate(body, strict=True)
        except ValidationError as exc:
            problems.extend(f"{label}: {p}" for p in _pydantic_problems(exc))
            continue
        problems.extend(f"{label}: {p}" for p in _quantity_problems(entry))
        entries[entry_id] = entry
    if problems:
        raise CatalogError(path, problems)
    return entries


def _loc(loc: tuple[int | str, ...]) -> str:
    """``("tiers", 0, "name")`` -> ``tiers[0].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<entry>"


def _pydantic_problems(exc: ValidationError) -> Iterator[str]:
    for err in exc.errors(include_url=False):
        field = _loc(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            reason = "unknown key (not in the schema)"
        elif kind == "missing":
            reason = "missing required field"
        else:
            reason = err["msg"]
            if "input" in err and not isinstance(err["input"], dict | list):
                reason += f" (got {err['input']!r})"
        yield f"field '{field}': {reason}"


def _quantities(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Quantity]]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, Quantity):
            yield prefix + name, value
        elif isinstance(value, BaseModel):
            yield from _quantities(value, f"{prefix}{name}.")


def _quantity_problems(entry: BaseModel) -> Iterator[str]:
    """Checks the schema cannot express: finite values and non-blank sources."""
    for field, q in _quantities(entry):
        if not math.isfinite(q.value):
            yield f"field '{field}.value': must be finite, got {q.value!r}"
        if not q.source.strip():
            yield f"field '{field}.source': must not be blank"


# --- cross-entry checks -------------------------------------------------------------------------


def _check_clusters(
    path: Path,
    clusters: Mapping[str, ClusterEntry],
    gpus: Mapping[str, GpuEntry],
    networks: Mapping[str, NetworkEntry],
) -> None:
    problems: list[str] = []
    for cid, c in clusters.items():
        label = f"entry '{cid}'"
        if c.gpu not in gpus:
            known = ", ".join(sorted(gpus))
            problems.append(f"{label}: field 'gpu': unknown gpu id '{c.gpu}' (known: {known})")
        if c.network not in networks:
            known = ", ".join(sorted(networks))
            problems.append(f"{label}: field 'network': unknown network id '{c.network}' (known: {known})")
        if c.nvlink_domain_size % c.gpus_per_node and c.gpus_per_node % c.nvlink_domain_size:
            problems.append(
                f"{label}: field 'nvlink_domain_size': {c.nvlink_domain_size} and gpus_per_node "
                f"{c.gpus_per_node} must divide one another"
            )
        problems.extend(f"{label}: {p}" for p in _tier_problems(c))
    if problems:
        raise CatalogError(path, problems)


def _tier_problems(c: ClusterEntry) -> Iterator[str]:
    tiers = c.tiers
    names = [t.name for t in tiers]
    if names[0] != FIRST_TIER:
        yield (f"field 'tiers[0].name': the first (innermost) tier must be '{FIRST_TIER}', got '{names[0]}'")
    elif tiers[0].span_gpus != c.nvlink_domain_size:
        yield (
            f"field 'tiers[0].span_gpus': the '{FIRST_TIER}' tier span ({tiers[0].span_gpus}) "
            f"must equal nvlink_domain_size ({c.nvlink_domain_size})"
        )
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield f"field 'tiers[{i}].name': duplicate tier name '{name}'"
        seen.add(name)
    prev: int | None = None
    for i, t in enumerate(tiers):
        span = t.span_gpus
        field = f"field 'tiers[{i}].span_gpus'"
        if span is None:
            if i != len(tiers) - 1:
                yield f"{field}: only the last (outermost) tier may omit span_gpus"
            continue
        if prev is not None:
            if span <= prev:
                yield f"{field}: spans must increase outward ({span} <= {prev})"
            elif span % prev:
                yield f"{field}: {span} is not a multiple of the inner tier span {prev}"
        prev = span
