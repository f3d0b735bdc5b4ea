"""Capacity-planning catalog (``data/capacity.toml``): prices, power and failure statistics.

Validated once at load time like the hardware catalog: every number is a sourced
:class:`~hardware_catalog.schema.Quantity`, and a problem is a :class:`CatalogError` naming the
file, the entry and the field.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from pydantic import ValidationError

from hardware_catalog.loader import DATA_DIR, CatalogError, _pydantic_problems, _quantity_problems, load_catalog
from hardware_catalog.schema import Quantity, _Strict

CAPACITY_FILE = "capacity.toml"


class CapacityDefaults(_Strict):
    """Defaults for every job; a request's ``costs`` / ``reliability`` fields override them."""

    gpu_mtbf_hours: Quantity
    restart_s: Quantity
    pue: Quantity
    checkpoint_write_bytes_per_s_per_node: Quantity
    token_bytes_small_vocab: Quantity
    token_bytes_large_vocab: Quantity


class GpuCapacity(_Strict):
    """Per GPU id: price, idle board power and the host's power per GPU."""

    price_per_gpu_hour_usd: Quantity | None = None
    idle_power_w: Quantity
    node_overhead_power_w: Quantity


class CapacityCatalog(_Strict):
    defaults: CapacityDefaults
    gpus: dict[str, GpuCapacity]


@functools.cache
def load_capacity_catalog() -> CapacityCatalog:
    """The shipped capacity catalog (loaded and validated once per process)."""
    return load_capacity_catalog_from(DATA_DIR)


def load_capacity_catalog_from(directory: Path) -> CapacityCatalog:
    """Load ``capacity.toml`` from ``directory``; every GPU id must be in the hardware catalog."""
    path = Path(directory) / CAPACITY_FILE
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(path, [f"cannot read capacity catalog ({exc})"]) from exc
    try:
        cat = CapacityCatalog.model_validate(doc, strict=True)
    except ValidationError as exc:
        raise CatalogError(path, list(_pydantic_problems(exc))) from exc
    problems = [f"defaults: {p}" for p in _quantity_problems(cat.defaults)]
    known = load_catalog().gpus
    for gid, entry in cat.gpus.items():
        if gid not in known:
            problems.append(f"entry 'gpus.{gid}': unknown gpu id (known: {', '.join(sorted(known))})")
        problems.extend(f"entry 'gpus.{gid}': {p}" for p in _quantity_problems(entry))
    missing = sorted(set(known) - set(cat.gpus))
    if missing:
        problems.append(f"no entry for gpu ids {missing} (every GPU needs its power figures)")
    if problems:
        raise CatalogError(path, problems)
    return cat
