"""The columns of ``pplan catalog ... --format table``: one row per catalog entry."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from api.plan_rows import table
from optimizer.reference import current
from optimizer.units import GB, GIB, TB, TFLOPS, US

GIGA = GB  # 10**9: Gbit/s line rates and billions of parameters


def _q(entry: Any, name: str, scale: float = 1.0) -> str:
    quantity = getattr(entry, name, None)
    return "-" if quantity is None else f"{quantity.value / scale:g}"


_CATALOG_COLUMNS: dict[str, tuple[Sequence[str], Callable[[str, Any], list[object]]]] = {
    "gpus": (
        ("id", "name", "memory_gib", "bf16_tflops", "fp8_tflops", "hbm_tb_s", "nvlink_domain"),
        lambda i, e: [
            i, e.name, f"{e.memory_usable_bytes.value / GIB:.1f}",
            _q(e, "bf16_dense_flops", TFLOPS), _q(e, "fp8_dense_flops", TFLOPS),
            _q(e, "hbm_bandwidth_bytes_per_s", TB), e.default_nvlink_domain_size,
        ],
    ),
    "networks": (
        ("id", "name", "technology", "port_gbit_s", "latency_us", "busbw_fraction"),
        lambda i, e: [
            i, e.name, e.technology, _q(e, "port_rate_bits_per_s", GIGA), _q(e, "latency_s", US),
            _q(e, "busbw_fraction"),
        ],
    ),
    "clusters": (
        ("id", "name", "gpu", "gpus_per_node", "nvlink_domain", "network", "nics_per_node",
         "tiers"),
        lambda i, e: [
            i, e.name, e.gpu, e.gpus_per_node, e.nvlink_domain_size, e.network, e.nics_per_node,
            ">".join(t.name for t in e.tiers),
        ],
    ),
    "models": (
        ("id", "name", "layers", "hidden", "heads", "kv_heads", "experts", "params_b"),
        lambda i, e: [
            i, e.name, e.num_layers, e.hidden_size, e.num_attention_heads,
            e.num_kv_heads or e.num_attention_heads,
            (e.moe or {}).get("num_experts") or "-", f"{e.published_total_params / GIGA:.1f}",
        ],
    ),
}  # fmt: skip


def catalog_entries(which: str) -> Mapping[str, BaseModel]:
    if which == "models":
        return current().presets
    entries: Mapping[str, BaseModel] = getattr(current().catalog, which)
    return entries


def catalog_table(which: str) -> str:
    """The table of catalog ``which`` (gpus, networks, clusters, models)."""
    headers, row = _CATALOG_COLUMNS[which]
    return table(headers, [row(entry_id, entry) for entry_id, entry in catalog_entries(which).items()])
