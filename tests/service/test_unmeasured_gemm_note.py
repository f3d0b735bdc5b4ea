"""A plan on a GPU whose GEMM efficiency the catalog carries over from another part says so:
every compute time rests on that number (h800: H100's, same die and clocks; gb300: GB200's)."""

from __future__ import annotations

import pytest

from optimizer.service import plan
from optimizer.specs import PlanRequest


def _notes(cluster: dict, precision: str = "bf16") -> list[str]:
    request = {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 256, "precision": precision},
        "cluster": cluster,
    }
    return plan(PlanRequest.model_validate(request)).plans[0].notes


def test_a_derived_gemm_efficiency_is_noted() -> None:
    (note,) = [n for n in _notes({"preset": "hgx-h800", "num_gpus": 64}) if "GEMM efficiency" in n]
    assert note.startswith("h800-sxm-80gb's GEMM efficiency (0.803 of peak) is derived, not measured")


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100", "dgx-b200"])
def test_measured_ones_are_not(preset: str) -> None:
    assert not any("GEMM efficiency" in n for n in _notes({"preset": preset, "num_gpus": 64}))


def test_fp8_on_a_gpu_without_a_low_precision_efficiency_says_which_it_uses() -> None:
    (note,) = [n for n in _notes({"preset": "dgx-h100", "gpu": "mi300x", "num_gpus": 64}, "fp8") if "GEMM" in n]
    assert note.startswith("mi300x has no measured low-precision GEMM efficiency: its fp8 GEMMs run at its bf16")
