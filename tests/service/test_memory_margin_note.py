"""Plans that fit with less free memory than the memory model's median error say so."""

from __future__ import annotations

import re
from pathlib import Path

from optimizer import plan_notes, service
from optimizer.specs import PlanRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "memory_check.md"


def test_the_margin_is_the_memory_checks_median_and_worst() -> None:
    text = DOC.read_text(encoding="utf-8")
    median = float(re.search(r"median \|error\|: ([0-9.]+)%", text).group(1))
    worst = float(re.search(r"furthest under the published peak: -([0-9.]+)%", text).group(1))
    assert plan_notes.MEMORY_MEDIAN_ERROR == median / 100
    assert round(plan_notes.MEMORY_WORST_UNDER * 100) == round(worst)


def test_a_tight_plan_names_the_margin_and_the_headroom_that_keeps_it() -> None:
    """Mixtral 8x22B on 64 H100: the top plan takes 77.8 of the GPU's 79.6 GiB, leaving less free
    than 5.1% of its peak; a 5 GiB headroom (5.1% of 79.6 GiB, rounded up) plans with the margin,
    and its plans carry no note."""
    job = {"model": {"preset": "mixtral-8x22b"}, "training": {"seq_len": 4096, "global_batch_size": 256},
           "cluster": {"preset": "dgx-h100", "num_gpus": 64}, "search": {"top_k": 1}}  # fmt: skip
    top = service.plan(PlanRequest.model_validate(job)).plans[0]
    [note] = [n for n in top.notes if n.startswith("memory: ")]
    assert note.startswith("memory: 77.8 of the GPU's 79.6 GiB leaves less free than the memory model's median")
    assert note.endswith("search.memory_headroom_gib 5 plans with that margin")
    roomy = service.plan(PlanRequest.model_validate({**job, "search": {"top_k": 3, "memory_headroom_gib": 5}}))
    for p in roomy.plans:
        assert p.memory_gib.total <= 79.65 - 5
        assert not [n for n in p.notes if n.startswith("memory: ")]
