"""With a model preset, null on a nullable field means the preset's value; null on a field that
takes no null (``sliding_window_every``) is a 422 naming it, never silently replaced."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optimizer.specs import PlanRequest

JOB = {
    "training": {"seq_len": 4096, "global_batch_size": 16},
    "cluster": {"preset": "dgx-h100", "num_gpus": 16},
}


def test_null_on_a_nullable_field_takes_the_presets_value() -> None:
    model = {"preset": "llama3-8b", "num_layers": None, "mla": None}
    request = PlanRequest.model_validate({"model": model, **JOB})
    assert request.model.num_layers == 32
    assert request.model.mla is None


def test_null_on_a_field_that_takes_no_null_is_refused() -> None:
    with pytest.raises(ValidationError) as err:
        model = {"preset": "llama3-8b", "sliding_window_every": None}
        PlanRequest.model_validate({"model": model, **JOB})
    assert [e["loc"] for e in err.value.errors()] == [("model", "sliding_window_every")]
