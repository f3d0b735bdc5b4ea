"""The recompute modes and parallel axes the engine branches on are defined once
(``optimizer.modes``) and match the HTTP contract's strings exactly."""

from __future__ import annotations

from typing import get_args

from optimizer.cost.topology import GRID_AXES
from optimizer.modes import Axis, RecomputeMode
from optimizer.search.ranking import LEAST_RECOMPUTE
from optimizer.search.space import RECOMPUTE
from optimizer.specs import AXES, Layout, Recompute


def test_recompute_modes_are_the_contract_strings() -> None:
    assert [m.value for m in RecomputeMode] == ["none", "core_attn", "selective", "op", "moe", "full"]
    assert set(get_args(Recompute)) == {m.value for m in RecomputeMode}


def test_axes_are_the_contract_strings() -> None:
    assert AXES == ("tp", "cp", "ep", "dp", "pp") == tuple(Axis)
    assert GRID_AXES == ("tp", "cp", "dp", "pp")


def test_members_equal_hash_and_read_as_their_strings() -> None:
    mode = RecomputeMode.SELECTIVE
    assert mode == "selective" and hash(mode) == hash("selective")
    assert "selective" in frozenset({mode}) and {"selective": 1}[mode] == 1
    assert f"{mode} {mode!r} {[mode, Axis.TP]}" == "selective 'selective' ['selective', 'tp']"
    assert Layout(recompute=mode).model_dump_json().count('"recompute":"selective"') == 1


def test_search_orders_are_unchanged() -> None:
    assert RECOMPUTE == ("none", "core_attn", "selective", "op", "moe", "full")
    assert LEAST_RECOMPUTE == ("none", "core_attn", "op", "selective", "moe", "full")
