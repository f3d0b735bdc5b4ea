"""GET endpoints of the catalogs: GPUs, scale-out networks, cluster presets and model presets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field, create_model

from api.errors import MessageBody
from hardware_catalog.schema import ClusterEntry, GpuEntry, NetworkEntry
from optimizer.errors import UnknownCatalogId
from optimizer.presets import ModelPreset
from optimizer.reference import current

router = APIRouter(tags=["catalog"])


def _with_id(entry_cls: type[BaseModel], name: str) -> type[BaseModel]:
    """The response model of a catalog entry: its fields, preceded by ``id`` when it has none."""
    if "id" in entry_cls.model_fields:
        return entry_cls
    fields: dict[str, Any] = {"id": (str, Field(description="Catalog id (the key used in requests)."))}
    fields |= {field: (info.annotation, info) for field, info in entry_cls.model_fields.items()}
    return create_model(name, __doc__=entry_cls.__doc__, **fields)


GpuItem = _with_id(GpuEntry, "GpuItem")
NetworkItem = _with_id(NetworkEntry, "NetworkItem")
ClusterItem = _with_id(ClusterEntry, "ClusterItem")
ModelItem = _with_id(ModelPreset, "ModelPresetItem")
# Response models of the list endpoints (built at runtime, so type checkers cannot see them).
GpuList = list[GpuItem]  # type: ignore[valid-type]
NetworkList = list[NetworkItem]  # type: ignore[valid-type]
ClusterList = list[ClusterItem]  # type: ignore[valid-type]
ModelList = list[ModelItem]  # type: ignore[valid-type]


def catalog_items(entries: Mapping[str, BaseModel]) -> list[dict[str, Any]]:
    """Catalog entries as JSON-ready dicts, each led by its ``id`` (the list endpoints' answer)."""
    return [{"id": entry_id, **entry.model_dump(mode="json")} for entry_id, entry in entries.items()]


def _one(kind: str, entries: Mapping[str, BaseModel], entry_id: str) -> dict[str, Any]:
    if entry_id not in entries:
        raise HTTPException(status_code=404, detail=str(UnknownCatalogId(kind, entry_id, list(entries))))
    return {"id": entry_id, **entries[entry_id].model_dump(mode="json")}


def _not_found(kind: str) -> dict[int | str, dict[str, Any]]:
    return {
        404: {
            "model": MessageBody,
            "description": f"Unknown {kind} id; the message lists the valid ids.",
        }
    }


@router.get("/gpus", response_model=GpuList, operation_id="list_gpus", summary="List accelerators")
async def list_gpus() -> list[dict[str, Any]]:
    """Accelerators: dense peak FLOP/s per precision, memory, scale-up links, with sources."""
    return catalog_items(current().catalog.gpus)


@router.get("/gpus/{gpu_id}", response_model=GpuItem, operation_id="get_gpu", responses=_not_found("gpu"))
async def get_gpu(gpu_id: str) -> dict[str, Any]:
    """One accelerator by id."""
    return _one("gpu", current().catalog.gpus, gpu_id)


@router.get(
    "/networks",
    response_model=NetworkList,
    operation_id="list_networks",
    summary="List scale-out fabrics",
)
async def list_networks() -> list[dict[str, Any]]:
    """Scale-out fabrics: line rate, latency and achievable bus bandwidth, with sources."""
    return catalog_items(current().catalog.networks)


@router.get(
    "/networks/{network_id}",
    response_model=NetworkItem,
    operation_id="get_network",
    responses=_not_found("network"),
)
async def get_network(network_id: str) -> dict[str, Any]:
    """One scale-out fabric by id."""
    return _one("network", current().catalog.networks, network_id)


@router.get(
    "/clusters",
    response_model=ClusterList,
    operation_id="list_clusters",
    summary="List cluster presets",
)
async def list_clusters() -> list[dict[str, Any]]:
    """Cluster presets: GPU, node size, NVLink domain, NICs and network tiers, with sources."""
    return catalog_items(current().catalog.clusters)


@router.get(
    "/clusters/{cluster_id}",
    response_model=ClusterItem,
    operation_id="get_cluster",
    responses=_not_found("cluster"),
)
async def get_cluster(cluster_id: str) -> dict[str, Any]:
    """One cluster preset by id."""
    return _one("cluster", current().catalog.clusters, cluster_id)


@router.get(
    "/models",
    response_model=ModelList,
    operation_id="list_models",
    summary="List model presets",
)
async def list_models() -> list[dict[str, Any]]:
    """Model presets: published architectures with their source and published parameter counts."""
    return catalog_items(current().presets)


@router.get(
    "/models/{model_id}",
    response_model=ModelItem,
    operation_id="get_model",
    responses=_not_found("model"),
)
async def get_model(model_id: str) -> dict[str, Any]:
    """One model preset by id."""
    return _one("model", current().presets, model_id)
