"""How a search runs: deterministic work limits, the time limit while bounding, the garbage collector."""

from __future__ import annotations

import pytest

from optimizer.service import search_plans
from optimizer.specs import PlanRequest
from tests.search.search_helpers import JOB_SPLIT_OBJECTIVE, _request


def test_split_models_stop_on_deterministic_work_not_wall_time(monkeypatch) -> None:
    """A split model that runs out of its work limit stops at the same point whatever the load:
    with the limit cut to nothing the four-stage split of JOB_SPLIT_OBJECTIVE is not proved, and
    the answer (``feasible``, a slower plan, the pair's floor as the bound) is the same on every
    run. With the real limit it is proved optimal."""
    from optimizer.search import splits

    proved = search_plans(_request(JOB_SPLIT_OBJECTIVE))
    assert proved.status == "optimal" and not proved.warnings
    monkeypatch.setattr(splits, "SOLVE_WORK_LIMIT", 1e-7)
    cut = [search_plans(_request(JOB_SPLIT_OBJECTIVE)) for _ in range(2)]
    assert [r.status for r in cut] == ["feasible", "feasible"]
    assert cut[0].plans == cut[1].plans and cut[0].solver.objective_bound == cut[1].solver.objective_bound
    assert cut[0].plans[0].step_time_s > proved.plans[0].step_time_s > cut[0].solver.objective_bound
    assert any("stopped at its work limit" in w for w in cut[0].warnings)


def test_time_limit_is_checked_while_the_space_is_bounded() -> None:
    """Bounding DeepSeek-V3's 2,083,992 layouts on 2,048 GPUs takes most of a second; a shorter time
    limit stops it there (between blocks) and says so, instead of bounding everything first."""
    req = PlanRequest.model_validate({
        "model": {"preset": "deepseek-v3"},
        "training": {"seq_len": 4096, "global_batch_size": 15360},
        "cluster": {"preset": "dgx-h100", "gpu": "h800-sxm-80gb", "num_gpus": 2048},
        "search": {"time_limit_s": 0.001},
    })  # fmt: skip
    response = search_plans(req)
    assert response.status == "feasible" and response.plans == []
    assert response.solver.status == "UNKNOWN" and not response.solver.proved_optimal
    # enumerating the space checks the deadline too, and at 1 ms it usually stops there
    enumerated = response.solver.candidates_enumerated
    assert enumerated <= 379_636  # what Megatron-LM runs (no ZeRO-2/3 with pp > 1)
    assert (
        f"time_limit_s = 0.001 s ran out while enumerating the layouts of the space ({enumerated:,} so far)"
        in response.explanation
        or "time_limit_s = 0.001 s ran out while bounding the 379,636 layouts" in response.explanation
    )


def test_search_gives_the_garbage_collector_back() -> None:
    """``search`` pauses the cyclic collector while it runs and restores it afterwards, also
    when the request fails and when it was off to begin with."""
    import gc

    from optimizer.search import cyclic_gc_paused

    assert gc.isenabled()
    search_plans(_request(JOB_SPLIT_OBJECTIVE))
    assert gc.isenabled()
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():  # nested (a second concurrent search)
            pass
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
