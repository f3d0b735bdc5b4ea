"""Hardware catalog: shipped data, spot values, and loud failures on broken data files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hardware_catalog import Catalog, CatalogError, load_catalog, load_catalog_from
from hardware_catalog.loader import DATA_DIR, FILES, ID_PATTERN
from hardware_catalog.schema import Quantity

MIB = 2**20

REQUIRED_GPUS = {
    "a100-sxm-40gb",
    "a100-sxm-80gb",
    "h100-sxm-80gb",
    "h800-sxm-80gb",
    "h200-sxm-141gb",
    "b200",
    "gb200",
    "mi300x",
}
REQUIRED_NETWORKS = {"ib-hdr-200", "ib-ndr-400", "ib-xdr-800", "roce-400"}
REQUIRED_CLUSTERS = {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72"}
KINDS = {"spec", "peak-dense", "measured", "derived", "reference-design", "model-constant"}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def _all_quantities(cat: Catalog) -> list[tuple[str, Quantity]]:
    out: list[tuple[str, Quantity]] = []
    for group in (cat.gpus, cat.networks):
        for entry_id, entry in group.items():
            for field in type(entry).model_fields:
                value = getattr(entry, field)
                if isinstance(value, Quantity):
                    out.append((f"{entry_id}.{field}", value))
    return out


# --- shipped data ---------------------------------------------------------------------------------


def test_required_ids_exist(catalog: Catalog) -> None:
    assert REQUIRED_GPUS <= set(catalog.gpus)
    assert REQUIRED_NETWORKS <= set(catalog.networks)
    assert REQUIRED_CLUSTERS <= set(catalog.clusters)


def test_ids_are_well_formed(catalog: Catalog) -> None:
    for entry_id in [*catalog.gpus, *catalog.networks, *catalog.clusters]:
        assert ID_PATTERN.match(entry_id), entry_id


def test_every_quantity_has_source_and_kind(catalog: Catalog) -> None:
    quantities = _all_quantities(catalog)
    assert len(quantities) > 100
    for where, q in quantities:
        assert q.kind in KINDS, where
        assert q.source.strip(), where
        assert q.value > 0, where


def test_clusters_carry_sources(catalog: Catalog) -> None:
    for cid, c in catalog.clusters.items():
        assert "SuperPOD" in c.source, cid
        assert c.gpu in catalog.gpus and c.network in catalog.networks, cid


def test_spot_values(catalog: Catalog) -> None:
    h100 = catalog.gpus["h100-sxm-80gb"]
    assert h100.bf16_dense_flops.value == pytest.approx(989.4e12)
    assert h100.bf16_dense_flops.kind == "peak-dense"
    assert h100.fp8_dense_flops is not None
    assert h100.fp8_dense_flops.value == pytest.approx(1978.9e12)
    assert h100.memory_usable_bytes.value == 81559 * MIB
    assert h100.scale_up_bandwidth_per_dir_bytes_per_s.value == pytest.approx(450e9)
    assert catalog.gpus["b200"].scale_up_bandwidth_per_dir_bytes_per_s.value == pytest.approx(900e9)
    assert catalog.gpus["h800-sxm-80gb"].scale_up_bandwidth_per_dir_bytes_per_s.value == pytest.approx(200e9)
    assert catalog.networks["ib-ndr-400"].port_rate_bits_per_s.value == pytest.approx(400e9)
    nvl72 = catalog.clusters["gb200-nvl72"]
    assert nvl72.tiers[0].name == "nvlink"
    assert nvl72.tiers[0].span_gpus == 72
    assert nvl72.nvlink_domain_size == 72


def test_fp16_equals_bf16(catalog: Catalog) -> None:
    for gid, g in catalog.gpus.items():
        assert g.fp16_dense_flops.value == g.bf16_dense_flops.value, gid


def test_nvlink_domain_defaults(catalog: Catalog) -> None:
    for gid, g in catalog.gpus.items():
        expected = 72 if gid in {"gb200", "gb300"} else 8
        assert g.default_nvlink_domain_size == expected, gid


def test_amd_is_mesh(catalog: Catalog) -> None:
    for gid, g in catalog.gpus.items():
        assert g.scale_up_topology == ("mesh" if g.vendor == "amd" else "switch"), gid


def test_cluster_tiers(catalog: Catalog) -> None:
    for cid, c in catalog.clusters.items():
        names = [t.name for t in c.tiers]
        assert names == ["nvlink", "leaf", "spine"], cid
        assert c.tiers[0].span_gpus == c.nvlink_domain_size, cid
        assert c.tiers[-1].span_gpus is None, cid


def test_load_catalog_is_cached() -> None:
    assert load_catalog() is load_catalog()


def test_version_is_content_hash(tmp_path: Path, catalog: Catalog) -> None:
    assert len(catalog.version) == 12
    int(catalog.version, 16)
    assert load_catalog_from(DATA_DIR).version == catalog.version
    data = _copy_data(tmp_path)
    (data / "networks.toml").write_text((data / "networks.toml").read_text() + "\n# comment\n")
    assert load_catalog_from(data).version != catalog.version


# --- broken data files ----------------------------------------------------------------------------


def _copy_data(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for name in FILES:
        shutil.copy(DATA_DIR / name, data / name)
    return data


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"fixture text not found in {path.name}: {old!r}"
    path.write_text(text.replace(old, new, 1))


def _load_error(data: Path) -> str:
    with pytest.raises(CatalogError) as info:
        load_catalog_from(data)
    return str(info.value)


def test_unknown_key(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "gpus.toml", "[b200]\n", "[b200]\npeak_magic_flops = 1.0\n")
    msg = _load_error(data)
    assert "gpus.toml" in msg and "b200" in msg and "peak_magic_flops" in msg and "unknown key" in msg


def test_unknown_key_inside_quantity(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "networks.toml", "port_rate_bits_per_s = { value = 400e9,", "port_rate_bits_per_s = { value = 400e9, unit = 'Gb',")
    msg = _load_error(data)
    assert "networks.toml" in msg and "ib-ndr-400" in msg and "port_rate_bits_per_s.unit" in msg


def test_duplicate_key(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "gpus.toml", "[mi300x]\n", "[mi300x]\ntdp_w = { value = 750, kind = 'spec', source = 'x' }\n")
    msg = _load_error(data)
    assert "gpus.toml" in msg and "tdp_w" in msg and "duplicate" in msg


def test_duplicate_id(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    path = data / "networks.toml"
    path.write_text(path.read_text() + "\n[ib-ndr-400]\nname = 'again'\n")
    msg = _load_error(data)
    assert "networks.toml" in msg and "ib-ndr-400" in msg and "duplicate" in msg


@pytest.mark.parametrize("bad", ["-400e9", "0", "inf", "nan"])
def test_non_positive_or_non_finite_number(tmp_path: Path, bad: str) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "networks.toml", "port_rate_bits_per_s = { value = 400e9", f"port_rate_bits_per_s = {{ value = {bad}")
    msg = _load_error(data)
    assert "networks.toml" in msg and "ib-ndr-400" in msg and "port_rate_bits_per_s.value" in msg


def test_non_positive_integer_field(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "clusters.toml", "nics_per_node = 8", "nics_per_node = 0")
    msg = _load_error(data)
    assert "clusters.toml" in msg and "dgx-a100" in msg and "nics_per_node" in msg


def test_missing_source(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(
        data / "gpus.toml",
        'tdp_w = { value = 700, kind = "spec", source = "NVIDIA H100 datasheet via hardware-facts §1-2 [HPCT] [SMI]" }',
        'tdp_w = { value = 700, kind = "spec" }',
    )
    msg = _load_error(data)
    assert "gpus.toml" in msg and "h100-sxm-80gb" in msg and "tdp_w.source" in msg and "missing" in msg


def test_blank_source(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(
        data / "gpus.toml",
        'tdp_w = { value = 700, kind = "spec", source = "NVIDIA H100 datasheet via hardware-facts §1-2 [HPCT] [SMI]" }',
        'tdp_w = { value = 700, kind = "spec", source = "     " }',
    )
    msg = _load_error(data)
    assert "gpus.toml" in msg and "tdp_w.source" in msg


def test_bad_kind(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "gpus.toml", 'kind = "peak-dense"', 'kind = "sparse"')
    msg = _load_error(data)
    assert "gpus.toml" in msg and ".kind" in msg


def test_unknown_gpu_in_cluster(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "clusters.toml", 'gpu = "b200"', 'gpu = "b201"')
    msg = _load_error(data)
    assert "clusters.toml" in msg and "dgx-b200" in msg and "'gpu'" in msg and "b201" in msg


def test_unknown_network_in_cluster(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "clusters.toml", 'network = "ib-hdr-200"', 'network = "ib-edr-100"')
    msg = _load_error(data)
    assert "clusters.toml" in msg and "dgx-a100" in msg and "'network'" in msg


def test_first_tier_must_be_nvlink(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "clusters.toml", '{ name = "nvlink", span_gpus = 72', '{ name = "rack", span_gpus = 72')
    msg = _load_error(data)
    assert "clusters.toml" in msg and "gb200-nvl72" in msg and "tiers[0].name" in msg


def test_nvlink_tier_span_matches_domain(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "clusters.toml", '{ name = "nvlink", span_gpus = 72', '{ name = "nvlink", span_gpus = 36')
    msg = _load_error(data)
    assert "gb200-nvl72" in msg and "tiers[0].span_gpus" in msg and "nvlink_domain_size" in msg


def test_spans_must_increase(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "clusters.toml", '{ name = "leaf", span_gpus = 576', '{ name = "leaf", span_gpus = 72')
    msg = _load_error(data)
    assert "gb200-nvl72" in msg and "tiers[1].span_gpus" in msg


def test_bad_id(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "networks.toml", "[roce-400]", "[RoCE_400]")
    msg = _load_error(data)
    assert "networks.toml" in msg and "RoCE_400" in msg


def test_missing_file(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    (data / "clusters.toml").unlink()
    msg = _load_error(data)
    assert "clusters.toml" in msg


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    data = _copy_data(tmp_path)
    _edit(data / "gpus.toml", "[b200]\n", "[b200]\nfoo = 1\n")
    _edit(data / "gpus.toml", "[mi300x]\n", "[mi300x]\nbar = 1\n")
    with pytest.raises(CatalogError) as info:
        load_catalog_from(data)
    assert len(info.value.problems) == 2
    assert info.value.file.endswith("gpus.toml")
