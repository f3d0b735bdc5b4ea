"""Reference data passed in: requests are validated and costed with the catalog and presets the
caller gives (``optimizer.reference``, ``api.main.create_app(reference=...)``), not with files
the validators read."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.main import create_app
from api.settings import Settings
from optimizer.reference import ReferenceData, current, shipped, using
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest

BASE_GPU = "h100-sxm-80gb"
CUSTOM_GPU = "h100-custom-60gb"
CUSTOM_USABLE_BYTES = 60e9


def custom_reference() -> ReferenceData:
    """The shipped data plus one GPU: an H100 with 60 GB usable."""
    ref = shipped()
    base = ref.catalog.gpus[BASE_GPU]
    usable = base.memory_usable_bytes.model_copy(update={"value": CUSTOM_USABLE_BYTES})
    gpu = base.model_copy(update={"memory_usable_bytes": usable})
    catalog = dataclasses.replace(ref.catalog, gpus={**ref.catalog.gpus, CUSTOM_GPU: gpu})
    capacity = ref.capacity.model_copy(update={"gpus": {**ref.capacity.gpus, CUSTOM_GPU: ref.capacity.gpus[BASE_GPU]}})
    return ReferenceData(catalog, ref.presets, capacity)


CUSTOM = custom_reference()


def evaluate_doc(gpu: str) -> dict[str, Any]:
    return {
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "cluster": {"gpu": gpu, "num_gpus": 8, "gpus_per_node": 8},
        "config": {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective"},
    }


def test_the_shipped_data_is_the_default() -> None:
    assert current() is shipped()
    with using(CUSTOM):
        assert current() is CUSTOM
    assert current() is shipped()


def test_validation_reads_the_data_passed_in() -> None:
    with pytest.raises(ValidationError, match=CUSTOM_GPU):
        EvaluateRequest.model_validate(evaluate_doc(CUSTOM_GPU))
    with using(CUSTOM):
        req = EvaluateRequest.model_validate(evaluate_doc(CUSTOM_GPU))
    assert req.cluster.gpu == CUSTOM_GPU


def test_costing_reads_the_data_passed_in() -> None:
    """Same job, same layout: only the GPU's usable memory differs, and the plan says so (the cost
    model's per-job cache keeps the two data sets apart)."""
    base = evaluate(EvaluateRequest.model_validate(evaluate_doc(BASE_GPU)))
    with using(CUSTOM):
        custom = evaluate(EvaluateRequest.model_validate(evaluate_doc(CUSTOM_GPU)))
    assert custom.step_time_s == base.step_time_s
    assert custom.memory_gib.total == base.memory_gib.total
    assert base.memory_gib.usable - custom.memory_gib.usable == pytest.approx(
        (shipped().catalog.gpus[BASE_GPU].memory_usable_bytes.value - CUSTOM_USABLE_BYTES) / 2**30
    )


def test_the_capacity_catalog_must_cover_every_gpu() -> None:
    ref = shipped()
    catalog = dataclasses.replace(ref.catalog, gpus={**ref.catalog.gpus, CUSTOM_GPU: ref.catalog.gpus[BASE_GPU]})
    with pytest.raises(ValueError, match=CUSTOM_GPU):
        ReferenceData(catalog, ref.presets, ref.capacity)


def test_an_app_plans_with_the_data_it_is_given() -> None:
    settings = Settings(solver_workers=1, evaluate_workers=1, sweep_workers=1)
    with TestClient(create_app(settings, reference=CUSTOM)) as client:
        assert client.post("/evaluate", json=evaluate_doc(CUSTOM_GPU)).status_code == 200
        assert CUSTOM_GPU in [g["id"] for g in client.get("/gpus").json()]
    with TestClient(create_app(settings)) as client:
        response = client.post("/evaluate", json=evaluate_doc(CUSTOM_GPU))
        assert response.status_code == 422
        assert CUSTOM_GPU in response.text
        assert CUSTOM_GPU not in [g["id"] for g in client.get("/gpus").json()]


def test_the_data_reaches_sweep_worker_processes() -> None:
    """Sweep workers get the app's data through the pool's initializer, pickled."""
    copy = pickle.loads(pickle.dumps(CUSTOM))
    assert CUSTOM_GPU in copy.catalog.gpus
    assert copy.catalog.gpus[CUSTOM_GPU].memory_usable_bytes.value == CUSTOM_USABLE_BYTES
