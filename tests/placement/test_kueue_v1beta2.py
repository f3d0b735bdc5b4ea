"""The Kueue assignment in v1beta2's shape (``kueue_v1beta2``) holds the v1beta1 domains, within
the CRD's rules (``apis/kueue/v1beta2/workload_types.go`` at Kueue ff69552e: exactly one of
universal / individual; each individual list has domainCount entries)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from optimizer.assignment_results import KueueDomain
from optimizer.placement.outputs import kueue_v1beta2

LEVELS = ["block", "rack", "kubernetes.io/hostname"]


def _expand(v2: dict) -> list[tuple[list[str], int]]:
    """The v1beta2 slices back to (values, count) per domain."""
    out = []
    for sl in v2["slices"]:
        n = sl["domainCount"]
        cols = []
        for lv in sl["valuesPerLevel"]:
            assert len(lv) == 1  # exactly one of universal / individual
            cols.append([lv["universal"]] * n if "universal" in lv else lv["individual"]["roots"])
            assert len(cols[-1]) == n
        pods = sl["podCounts"]
        assert len(pods) == 1
        counts = [pods["universal"]] * n if "universal" in pods else pods["individual"]
        assert len(counts) == n
        out += [([c[i] for c in cols], counts[i]) for i in range(n)]
    return out


@given(st.lists(st.tuples(st.sampled_from(["b1", "b2"]), st.sampled_from(["r1", "r2", "r3"]),
                          st.integers(1, 40), st.integers(1, 8)), min_size=1, max_size=12, unique_by=lambda t: t[2]))  # fmt: skip
def test_v1beta2_slices_hold_the_v1beta1_domains(nodes: list[tuple[str, str, int, int]]) -> None:
    domains = [KueueDomain(values=[b, r, f"node-{i}"], count=c) for b, r, i, c in nodes]
    v2 = kueue_v1beta2(LEVELS, domains).model_dump(mode="json")
    assert v2["levels"] == LEVELS
    assert _expand(v2) == [(d.values, d.count) for d in domains]


def test_shared_values_and_counts_are_universal() -> None:
    domains = [KueueDomain(values=["b1", "r1", "n1"], count=4), KueueDomain(values=["b1", "r2", "n2"], count=4)]
    assert kueue_v1beta2(LEVELS, domains).model_dump(mode="json")["slices"] == [{
        "domainCount": 2,
        "valuesPerLevel": [{"universal": "b1"}, {"individual": {"roots": ["r1", "r2"]}},
                           {"individual": {"roots": ["n1", "n2"]}}],
        "podCounts": {"universal": 4},
    }]  # fmt: skip
    uneven = [KueueDomain(values=["b1", "r1", "n1"], count=3), KueueDomain(values=["b1", "r1", "n2"], count=1)]
    assert kueue_v1beta2(LEVELS, uneven).model_dump(mode="json")["slices"][0]["podCounts"] == {"individual": [3, 1]}
