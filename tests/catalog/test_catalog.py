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
        assert "SuperPOD" in c.source or "arXiv:" in c.source, cid  # a reference design or a published cluster
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
    h800 = catalog.gpus["h800-sxm-80gb"]
    assert h800.scale_up_bandwidth_per_dir_bytes_per_s.value == pytest.approx(200e9)
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
    data = tmp_path / "copy"
    data.mkdir()
    for name in FILES:
        shutil.copy(DATA_DIR / name, data / name)
    assert load_catalog_from(data).version == catalog.version
    (data / "networks.toml").write_text((data / "networks.toml").read_text() + "\n# edit\n")
    assert load_catalog_from(data).version != catalog.version


# --- broken data files ----------------------------------------------------------------------------
# A small valid catalog written to tmp_path, then broken one way per test.


def _q(value: str, kind: str = "spec") -> str:
    return f'{{ value = {value}, kind = "{kind}", source = "test fixture" }}'


MINI_GPUS = f"""
[gpu-x]
name = "Test GPU"
vendor = "nvidia"
generation = "hopper"
memory_marketed_bytes = {_q("80e9")}
memory_usable_bytes = {_q("85520809984", "measured")}
hbm_bandwidth_bytes_per_s = {_q("3.35e12")}
fp32_dense_flops = {_q("66.9e12", "peak-dense")}
bf16_dense_flops = {_q("989.4e12", "peak-dense")}
fp16_dense_flops = {_q("989.4e12", "peak-dense")}
scale_up_link = "nvlink4"
scale_up_topology = "switch"
scale_up_bandwidth_per_dir_bytes_per_s = {_q("450e9")}
scale_up_busbw_fraction = {_q("0.8", "measured")}
default_nvlink_domain_size = 8
tdp_w = {_q("700")}
gemm_efficiency_bf16 = {_q("0.8", "measured")}
"""

MINI_NETWORKS = f"""
[net-x]
name = "Test fabric"
technology = "infiniband"
port_rate_bits_per_s = {_q("400e9")}
latency_s = {_q("3e-6", "derived")}
busbw_fraction = {_q("0.94", "measured")}
switch_radix_ports = {_q("64")}
"""

MINI_CLUSTERS = """
[cluster-x]
name = "Test cluster"
gpu = "gpu-x"
gpus_per_node = 8
nvlink_domain_size = 8
network = "net-x"
nics_per_node = 8
tiers = [
  { name = "nvlink", span_gpus = 8 },
  { name = "leaf", span_gpus = 256 },
  { name = "spine" },
]
source = "test fixture"
"""

MINI = {"gpus.toml": MINI_GPUS, "networks.toml": MINI_NETWORKS, "clusters.toml": MINI_CLUSTERS}


def _mini(tmp_path: Path, file: str = "", old: str = "", new: str = "") -> Path:
    """Write the small catalog to tmp_path, replacing ``old`` by ``new`` in ``file``."""
    data = tmp_path / "data"
    data.mkdir()
    for name, text in MINI.items():
        if name == file:
            assert old in text, f"fixture text not found in {name}: {old!r}"
            text = text.replace(old, new, 1)
        (data / name).write_text(text)
    return data


def _load_error(data: Path) -> str:
    with pytest.raises(CatalogError) as info:
        load_catalog_from(data)
    return str(info.value)


def test_mini_catalog_is_valid(tmp_path: Path) -> None:
    cat = load_catalog_from(_mini(tmp_path))
    assert set(cat.gpus) == {"gpu-x"} and set(cat.clusters) == {"cluster-x"}
    assert cat.clusters["cluster-x"].tiers[-1].span_gpus is None


def test_unknown_key(tmp_path: Path) -> None:
    data = _mini(tmp_path, "gpus.toml", "[gpu-x]\n", "[gpu-x]\npeak_magic_flops = 1.0\n")
    msg = _load_error(data)
    assert "gpus.toml" in msg and "gpu-x" in msg and "peak_magic_flops" in msg
    assert "unknown key" in msg


def test_unknown_key_inside_quantity(tmp_path: Path) -> None:
    old = "port_rate_bits_per_s = { value = 400e9,"
    data = _mini(tmp_path, "networks.toml", old, old + ' unit = "Gb",')
    msg = _load_error(data)
    assert "networks.toml" in msg and "net-x" in msg and "port_rate_bits_per_s.unit" in msg


def test_duplicate_key(tmp_path: Path) -> None:
    data = _mini(tmp_path, "gpus.toml", "[gpu-x]\n", f"[gpu-x]\ntdp_w = {_q('650')}\n")
    msg = _load_error(data)
    assert "gpus.toml" in msg and "tdp_w" in msg and "duplicate" in msg


def test_duplicate_id(tmp_path: Path) -> None:
    data = _mini(tmp_path, "networks.toml", "[net-x]\n", '[net-x]\nname = "a"\n\n[net-x]\n')
    msg = _load_error(data)
    assert "networks.toml" in msg and "net-x" in msg and "duplicate" in msg


@pytest.mark.parametrize("bad", ["-400e9", "0", "inf", "nan"])
def test_non_positive_or_non_finite_number(tmp_path: Path, bad: str) -> None:
    old = "port_rate_bits_per_s = { value = 400e9"
    data = _mini(tmp_path, "networks.toml", old, f"port_rate_bits_per_s = {{ value = {bad}")
    msg = _load_error(data)
    assert "networks.toml" in msg and "net-x" in msg and "port_rate_bits_per_s.value" in msg


def test_fraction_out_of_range(tmp_path: Path) -> None:
    data = _mini(tmp_path, "networks.toml", "value = 0.94", "value = 1.5")
    msg = _load_error(data)
    assert "networks.toml" in msg and "busbw_fraction" in msg


def test_non_positive_integer_field(tmp_path: Path) -> None:
    data = _mini(tmp_path, "clusters.toml", "nics_per_node = 8", "nics_per_node = 0")
    msg = _load_error(data)
    assert "clusters.toml" in msg and "cluster-x" in msg and "nics_per_node" in msg


def test_missing_source(tmp_path: Path) -> None:
    no_source = 'tdp_w = { value = 700, kind = "spec" }'
    data = _mini(tmp_path, "gpus.toml", f"tdp_w = {_q('700')}", no_source)
    msg = _load_error(data)
    assert "gpus.toml" in msg and "gpu-x" in msg and "tdp_w.source" in msg and "missing" in msg


def test_blank_source(tmp_path: Path) -> None:
    blank = 'tdp_w = { value = 700, kind = "spec", source = "    " }'
    data = _mini(tmp_path, "gpus.toml", f"tdp_w = {_q('700')}", blank)
    msg = _load_error(data)
    assert "gpus.toml" in msg and "tdp_w.source" in msg


def test_bad_kind(tmp_path: Path) -> None:
    data = _mini(tmp_path, "gpus.toml", 'kind = "peak-dense"', 'kind = "sparse"')
    msg = _load_error(data)
    assert "gpus.toml" in msg and "fp32_dense_flops.kind" in msg


def test_unknown_gpu_in_cluster(tmp_path: Path) -> None:
    data = _mini(tmp_path, "clusters.toml", 'gpu = "gpu-x"', 'gpu = "gpu-y"')
    msg = _load_error(data)
    assert "clusters.toml" in msg and "cluster-x" in msg and "'gpu'" in msg and "gpu-y" in msg


def test_unknown_network_in_cluster(tmp_path: Path) -> None:
    data = _mini(tmp_path, "clusters.toml", 'network = "net-x"', 'network = "ib-edr-100"')
    msg = _load_error(data)
    assert "clusters.toml" in msg and "cluster-x" in msg and "'network'" in msg


def test_first_tier_must_be_nvlink(tmp_path: Path) -> None:
    data = _mini(tmp_path, "clusters.toml", 'name = "nvlink"', 'name = "rack"')
    msg = _load_error(data)
    assert "clusters.toml" in msg and "cluster-x" in msg and "tiers[0].name" in msg


def test_nvlink_tier_span_matches_domain(tmp_path: Path) -> None:
    old = '{ name = "nvlink", span_gpus = 8 }'
    data = _mini(tmp_path, "clusters.toml", old, '{ name = "nvlink", span_gpus = 4 }')
    msg = _load_error(data)
    assert "cluster-x" in msg and "tiers[0].span_gpus" in msg and "nvlink_domain_size" in msg


@pytest.mark.parametrize("leaf", ["8", "4", "100"])
def test_spans_must_increase_and_nest(tmp_path: Path, leaf: str) -> None:
    data = _mini(tmp_path, "clusters.toml", "span_gpus = 256", f"span_gpus = {leaf}")
    msg = _load_error(data)
    assert "clusters.toml" in msg and "cluster-x" in msg and "tiers[1].span_gpus" in msg


def test_only_outermost_tier_may_omit_span(tmp_path: Path) -> None:
    old = '{ name = "leaf", span_gpus = 256 }'
    data = _mini(tmp_path, "clusters.toml", old, '{ name = "leaf" }')
    msg = _load_error(data)
    assert "cluster-x" in msg and "tiers[1].span_gpus" in msg


def test_bad_id(tmp_path: Path) -> None:
    data = _mini(tmp_path, "networks.toml", "[net-x]", "[Net_X]")
    msg = _load_error(data)
    assert "networks.toml" in msg and "Net_X" in msg


def test_missing_file(tmp_path: Path) -> None:
    data = _mini(tmp_path)
    (data / "clusters.toml").unlink()
    msg = _load_error(data)
    assert "clusters.toml" in msg


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    data = _mini(tmp_path, "gpus.toml", "[gpu-x]\n", "[gpu-x]\nfoo = 1\nbar = 2\n")
    with pytest.raises(CatalogError) as info:
        load_catalog_from(data)
    assert len(info.value.problems) == 2
    assert info.value.file.endswith("gpus.toml")


def test_flash2_attention_fractions_follow_the_flashattention2_paper(catalog: Catalog) -> None:
    """A100: 73% of peak forward and 63% backward, combined by FLOPs (1 : 2.5); H100: 335 TFLOP/s
    forward + backward of 989.4; H200 and H800 share the H100's SMs and clocks; nothing else has a
    published number."""
    a100 = 3.5 / (1 / 0.73 + 2.5 / 0.63)
    for gpu_id in ("a100-sxm-40gb", "a100-sxm-80gb"):
        assert catalog.gpus[gpu_id].flash2_attention_fraction.value == pytest.approx(a100, abs=5e-4)
    for gpu_id in ("h100-sxm-80gb", "h200-sxm-141gb", "h800-sxm-80gb"):
        assert catalog.gpus[gpu_id].flash2_attention_fraction.value == pytest.approx(335 / 989.4, abs=5e-4)
    assert {g for g, e in catalog.gpus.items() if e.flash2_attention_fraction is not None} == {
        "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "h800-sxm-80gb",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "gpu", "kernel", "efficiency"),
    [
        ("dgx-a100", "a100-sxm-80gb", "flash2", 0.32 * 0.656 / 0.339),  # FlashAttention-2 on A100
        ("dgx-a100", "a100-sxm-80gb", "flash3", 0.32 * 0.656 / 0.339),  # capped to flash2 on Ampere
        ("dgx-h100", "h100-sxm-80gb", "flash2", 0.32),  # the GPU the calibration rows ran on
        ("dgx-h100", "h800-sxm-80gb", "flash2", 0.32),
        ("dgx-h100", "h100-sxm-80gb", "flash3", 0.6),  # Hopper-native kernels: no per-GPU scaling
        ("dgx-b200", "b200", "flash2", 0.32),  # no published FlashAttention-2 rate: the calibration's
    ],
)
def test_flash2_attention_efficiency_scales_with_the_gpus_published_fraction(
    cluster: str, gpu: str, kernel: str, efficiency: float
) -> None:
    from optimizer.cost import build_context
    from optimizer.specs import JobSpec

    job = JobSpec.model_validate({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64, "attention_kernel": kernel},
        "cluster": {"preset": cluster, "gpu": gpu, "num_gpus": 8},
    })  # fmt: skip
    assert build_context(job).attention_efficiency == pytest.approx(efficiency, rel=1e-12)
