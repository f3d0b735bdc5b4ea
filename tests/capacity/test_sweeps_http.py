"""POST /sweeps, GET /sweeps/{id}, DELETE /sweeps/{id} over HTTP (worker processes included)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from jobs import LLAMA3_8B_ON_8_H100, job_copy

TIMEOUT_S = 120.0
JOB_8B = job_copy(LLAMA3_8B_ON_8_H100)
COUNTS = [8, 16, 24, 32, 48, 64, 96, 128]


@pytest.fixture(scope="module")
def client():
    settings = Settings(sweep_workers=2, max_sweeps_running=1, max_sweep_points=40)
    with TestClient(create_app(settings)) as c:
        yield c


def _wait(client: TestClient, sweep_id: str) -> tuple[dict, list[int]]:
    seen: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        r = client.get(f"/sweeps/{sweep_id}")
        assert r.status_code == 200
        body = r.json()
        seen.append(body["done"])
        if body["status"] != "running":
            return body, seen
        time.sleep(0.1)
    raise AssertionError(f"sweep {sweep_id} still running after {TIMEOUT_S} s")


def _num_gpus(plan: dict) -> int:
    return round(plan["tokens_per_s"] / plan["tokens_per_s_per_gpu"])


def test_sweep_over_8_gpu_counts_returns_every_point(client):
    r = client.post("/sweeps", json={"job": JOB_8B, "vary": {"num_gpus": COUNTS}})
    assert r.status_code == 202
    created = r.json()
    assert created["total"] == 8 and created["status"] == "running"
    body, seen = _wait(client, created["id"])
    assert body["status"] == "done" and body["done"] == body["total"] == 8
    assert [res["point"] for res in body["results"]] == [{"num_gpus": n} for n in COUNTS]
    for res, n in zip(body["results"], COUNTS, strict=True):
        assert res["status"] == "done"
        assert _num_gpus(res["plan"]) == n
        assert res["plan"]["goodput"]["fraction"] > 0.99
    # progress never goes back and ends at the total, having been seen below it
    assert seen == sorted(seen) and seen[-1] == 8 and seen[0] < 8
    assert body["pareto"], "a finished sweep has a front"


def _dominates(a: dict, b: dict, speed: str, cost: str) -> bool:
    sa, sb = (a[speed], b[speed]) if speed == "time_to_train_days" else (-a[speed], -b[speed])
    return sa <= sb and a[cost] <= b[cost] and (sa < sb or a[cost] < b[cost])


def test_pareto_front_is_non_dominated(client):
    job = {**JOB_8B, "training": {**JOB_8B["training"], "total_tokens": 10**12}}
    vary = {"cluster": ["dgx-h100", "dgx-b200"], "num_gpus": [8, 16, 32, 64, 128]}
    r = client.post("/sweeps", json={"job": job, "vary": vary})
    assert r.status_code == 202
    body, _ = _wait(client, r.json()["id"])
    assert body["status"] == "done" and body["total"] == 10
    front = body["pareto"]
    done = [
        {**res["plan"]["time_to_train"], "index": i, "time_to_train_days": res["plan"]["time_to_train"]["days"]}
        for i, res in enumerate(body["results"])
        if res["status"] == "done"
    ]
    assert len(done) == 10
    for a in front:
        for b in front:
            assert not _dominates(a, b, "time_to_train_days", "cost_usd")
    on_front = {e["index"] for e in front}
    for d in done:  # everything left off is dominated by a point on the front
        if d["index"] not in on_front:
            assert any(_dominates(e, d, "time_to_train_days", "cost_usd") for e in front)
    days = [e["time_to_train_days"] for e in front]
    assert days == sorted(days)
    for e in front:
        plan = body["results"][e["index"]]["plan"]
        assert e["cost_usd"] == pytest.approx(plan["time_to_train"]["cost_usd"])
        assert e["num_gpus"] == _num_gpus(plan)


def test_cancel_and_limits(client):
    job = {
        "model": {"preset": "llama3-70b"},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
        "cluster": {"preset": "dgx-h100", "num_gpus": 512},
    }
    r = client.post("/sweeps", json={"job": job, "vary": {"num_gpus": [64 * k for k in range(1, 33)]}})
    assert r.status_code == 202
    sweep_id = r.json()["id"]
    # one sweep may run at a time here: a second is a 429
    busy = client.post("/sweeps", json={"job": JOB_8B, "vary": {"num_gpus": [8]}})
    assert busy.status_code == 429 and "max_sweeps_running" in busy.json()["detail"]
    # checked before the points are validated (seconds on a large topology): too many points, still 429
    grid = {"num_gpus": [8 * k for k in range(1, 21)], "seq_len": [1024 * k for k in range(1, 21)]}
    assert client.post("/sweeps", json={"job": JOB_8B, "vary": grid}).status_code == 429
    cancelled = client.delete(f"/sweeps/{sweep_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    body, _ = _wait(client, sweep_id)
    assert body["status"] == "cancelled"
    statuses = [res["status"] for res in body["results"]]
    assert statuses.count("cancelled") >= 20  # at most the points already handed to workers ran
    deadline = time.monotonic() + TIMEOUT_S  # the points already running finish and keep their plans
    while body["done"] < body["total"] and time.monotonic() < deadline:
        time.sleep(0.2)
        body = client.get(f"/sweeps/{sweep_id}").json()
    assert body["done"] == body["total"] == 32
    assert all(s in ("done", "cancelled") for s in (res["status"] for res in body["results"]))
    # a cancelled sweep no longer counts as running
    again = client.post("/sweeps", json={"job": JOB_8B, "vary": {"num_gpus": [8]}})
    assert again.status_code == 202
    _wait(client, again.json()["id"])


def test_bad_sweeps_are_4xx(client):
    too_many = client.post("/sweeps", json={"job": JOB_8B, "vary": {"num_gpus": list(range(8, 8 * 42, 8))}})
    assert too_many.status_code == 422
    assert too_many.json()["detail"][0]["loc"] == ["body", "vary"]
    assert "max_sweep_points" in too_many.json()["detail"][0]["msg"]
    bad_preset = client.post("/sweeps", json={"job": JOB_8B, "vary": {"cluster": ["dgx-h100", "no-such"]}})
    assert bad_preset.status_code == 422
    detail = bad_preset.json()["detail"][0]
    assert detail["loc"] == ["body", "vary", "cluster", 1] and "no-such" in detail["msg"]
    long_id = "x" * 300  # refused at the preset field inside the varied cluster: still the vary value
    too_long = client.post("/sweeps", json={"job": JOB_8B, "vary": {"cluster": ["dgx-h100", long_id]}})
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["body", "vary", "cluster", 1]
    # the job's own cluster field is invalid with every preset named: the job's field, not a value
    for bad in ({"network": "bogus"}, {"gpus_per_node": 3}):
        job = {**JOB_8B, "cluster": {**JOB_8B["cluster"], **bad}}
        for presets in (["dgx-h100", "dgx-b200"], ["dgx-h100"]):
            item = client.post("/sweeps", json={"job": job, "vary": {"cluster": presets}}).json()["detail"][0]
            assert item["loc"] == ["body", "job", "cluster"], (bad, presets, item)
    # judged on the cluster alone: another section's error does not move it to the vary value
    both = {**JOB_8B, "model": {"preset": "nope"}, "cluster": {**JOB_8B["cluster"], "network": "bogus"}}
    detail = client.post("/sweeps", json={"job": both, "vary": {"cluster": ["dgx-h100", "dgx-a100"]}}).json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "job", "model"], ["body", "job", "cluster"]], detail
    empty = client.post("/sweeps", json={"job": JOB_8B, "vary": {}})
    assert empty.status_code == 422
    repeated = client.post("/sweeps", json={"job": JOB_8B, "vary": {"num_gpus": [8, 8]}})
    assert repeated.status_code == 422
    assert client.get("/sweeps/nope").status_code == 404
    assert client.delete("/sweeps/nope").status_code == 404


def test_a_point_whose_pins_no_layout_takes_is_infeasible_and_the_pool_survives(client):
    """tp 3 divides 48 GPUs but not 8: the 8-GPU point is infeasible with the reason (the
    error crosses the process boundary intact), the 48-GPU point is planned, and the next sweep
    runs on the same workers."""
    job = {**JOB_8B, "model": {"preset": "gpt3-175b"}, "training": {"seq_len": 3072, "global_batch_size": 256},
           "search": {"fix": {"tp": 3}}}  # fmt: skip
    r = client.post("/sweeps", json={"job": job, "vary": {"num_gpus": [8, 48]}})
    assert r.status_code == 202, r.text
    body, _ = _wait(client, r.json()["id"])
    eight, forty_eight = body["results"]
    assert eight["status"] == "infeasible"
    assert eight["explanation"].startswith(
        "search.fix.tp: no layout can take tp = 3: tp (3) does not divide num_gpus (8)"
    )
    assert forty_eight["status"] == "done" and forty_eight["plan"]["config"]["tp"] == 3
    again = client.post("/sweeps", json={"job": JOB_8B, "vary": {"num_gpus": [8]}})
    assert _wait(client, again.json()["id"])[0]["results"][0]["status"] == "done"


def test_a_point_whose_time_ran_out_is_timed_out_not_infeasible(monkeypatch):
    """A point's search that ended without a plan and without a proof (``feasible``, solver
    ``UNKNOWN``) is ``timed_out``: calling it infeasible told a consumer the job cannot run."""
    from api import sweep_manager
    from optimizer.results import PlanResponse, SolverInfo
    from optimizer.specs import PlanRequest

    ran_out = PlanResponse(status="feasible", plans=[], solver=SolverInfo(status="UNKNOWN"), explanation="ran out")
    monkeypatch.setattr(sweep_manager.service, "plan", lambda request: ran_out)
    result = sweep_manager.run_point(PlanRequest.model_validate(JOB_8B))
    assert (result.status, result.plan, result.explanation) == ("timed_out", None, "ran out")
    proved = ran_out.model_copy(update={"status": "infeasible", "solver": SolverInfo(status="INFEASIBLE")})
    monkeypatch.setattr(sweep_manager.service, "plan", lambda request: proved)
    assert sweep_manager.run_point(PlanRequest.model_validate(JOB_8B)).status == "infeasible"


def test_points_without_a_price_are_said(client):
    """A100s have no catalog price: the sweep says their cost is null and what the front weighs
    instead; with a price for every GPU it says nothing."""
    vary = {"cluster": ["dgx-h100", "dgx-a100"]}
    r = client.post("/sweeps", json={"job": JOB_8B, "vary": vary})
    assert r.status_code == 202, r.text
    status, _ = _wait(client, r.json()["id"])
    [warning] = [w for w in status["warnings"] if w.startswith("no price for")]
    assert warning.startswith("no price for a100-sxm-80gb (")
    assert "the Pareto front weighs every point by its GPU count" in warning
    priced = {**JOB_8B, "costs": {"price_per_gpu_hour_usd_by_gpu": {"a100-sxm-80gb": 1.8, "h100-sxm-80gb": 2.5}}}
    r = client.post("/sweeps", json={"job": priced, "vary": vary})
    status, _ = _wait(client, r.json()["id"])
    assert not [w for w in status["warnings"] if w.startswith("no price for")]


def test_a_points_error_names_the_point_in_words(client):
    """A point's 422 says which point as `axis value` pairs (a web page or log shows it as is)."""
    job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 128},
           "cluster": {"preset": "dgx-h100", "num_gpus": 8}}  # fmt: skip
    r = client.post("/sweeps", json={"job": job, "vary": {"num_gpus": [8], "cluster": ["dgx-h100", "nope"]}})
    assert r.status_code == 422
    [detail] = r.json()["detail"]
    assert detail["loc"] == ["body", "vary", "cluster", 1]
    assert detail["msg"].startswith("at point num_gpus 8, cluster nope: unknown cluster preset id 'nope'")
