"""Fixtures shared by the search test modules."""

from __future__ import annotations

import pytest

from optimizer.cost import build_context


@pytest.fixture
def without_expert_host_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cost every job of the test with ``expert_gemm_host_s`` = 0 (search, brute force and
    re-scoring alike): for planner-mechanics scenarios found before the host floor on small
    expert GEMMs, whose plans it moves (docs/cost-model.md)."""
    import dataclasses

    from optimizer.calibration import DEFAULT

    monkeypatch.setattr(build_context, "__defaults__", (dataclasses.replace(DEFAULT, expert_gemm_host_s=0.0),))
