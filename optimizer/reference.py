"""The reference data a process plans with: the hardware catalog (GPUs, networks, clusters), the
model presets and the capacity catalog.

Request validation (cluster presets, GPU and network ids, model presets), the cost model and the
catalog routes read them through ``current()``, never from files. ``shipped()`` is the package's
own data, loaded and validated once; an application that plans with other data passes it in:
``api.main.create_app(reference=...)`` for the HTTP service, ``with using(data): ...`` around
direct calls (``PlanRequest.model_validate``, ``optimizer.service.plan``)::

    data = ReferenceData(load_catalog_from(Path("my_catalog")), read_model_presets())
    with using(data):
        answer = plan(PlanRequest.model_validate(document))
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from hardware_catalog import Catalog, load_catalog
from hardware_catalog.capacity import CapacityCatalog, load_capacity_catalog
from optimizer.preset_file import ModelPreset, read_model_presets


@dataclass(frozen=True, eq=False)
class ReferenceData:
    """A hardware catalog, the model presets and the capacity catalog (prices, power, failure
    rates) that go with it. Compared and hashed by identity (the cost model's per-job cache keys
    on it), so build one per data set and keep it."""

    catalog: Catalog
    presets: Mapping[str, ModelPreset] = field(default_factory=read_model_presets)
    capacity: CapacityCatalog = field(default_factory=load_capacity_catalog)

    def __post_init__(self) -> None:
        missing = sorted(set(self.catalog.gpus) - set(self.capacity.gpus))
        if missing:
            raise ValueError(f"the capacity catalog has no entry for GPUs {missing} of the hardware catalog")


@functools.cache
def shipped() -> ReferenceData:
    """The package's catalog and presets (``hardware_catalog/data``, ``optimizer/data/models.toml``)."""
    return ReferenceData(load_catalog(), read_model_presets(), load_capacity_catalog())


_CURRENT: ContextVar[ReferenceData | None] = ContextVar("reference_data", default=None)


def current() -> ReferenceData:
    """The reference data of the running request or call: the innermost ``using``, else ``shipped()``."""
    data = _CURRENT.get()
    return shipped() if data is None else data


@contextmanager
def using(data: ReferenceData) -> Iterator[ReferenceData]:
    """Plan with ``data`` inside the block (this thread or task only)."""
    token = _CURRENT.set(data)
    try:
        yield data
    finally:
        _CURRENT.reset(token)


def install(data: ReferenceData) -> None:
    """Plan with ``data`` from now on in this thread (a worker process's initializer)."""
    _CURRENT.set(data)
