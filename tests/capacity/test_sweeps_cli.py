"""``pplan sweep FILE``: the same sweep code on local processes, the front as a table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from api import cli
from jobs import LLAMA3_8B_ON_8_H100, job_copy

DOC = {
    "job": job_copy(LLAMA3_8B_ON_8_H100, training={**LLAMA3_8B_ON_8_H100["training"], "total_tokens": 10**11}),
    "vary": {"num_gpus": [8, 16, 24]},
}


def test_sweep_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(DOC))
    assert cli.main(["sweep", str(path), "--format", "json", "--workers", "1", "--quiet"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["status"] == "done" and body["done"] == body["total"] == 3
    assert [r["status"] for r in body["results"]] == ["done"] * 3
    front = {e["num_gpus"] for e in body["pareto"]}
    assert front and front <= {8, 16, 24}
    assert cli.main(["sweep", str(path), "--format", "table", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and "num_gpus=8" in out


def test_sweep_yaml_keeps_the_json_field_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({**DOC, "vary": {"num_gpus": [8]}}))
    assert cli.main(["sweep", str(path), "--format", "json", "--workers", "1", "--quiet"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert cli.main(["sweep", str(path), "--format", "yaml", "--workers", "1", "--quiet"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert list(as_yaml) == list(as_json)  # not sorted: status first, as the HTTP body
    assert list(as_yaml["results"][0]) == list(as_json["results"][0])


def test_invalid_point_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps({**DOC, "vary": {"cluster": ["dgx-h100", "no-such-cluster"]}}))
    assert cli.main(["sweep", str(path), "--quiet"]) == 2
    assert "no-such-cluster" in capsys.readouterr().err


def test_the_cli_sweep_keeps_the_servers_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As POST /sweeps: too many points is an error (it planned all 289), and each point's time
    limit is defaulted and clamped by the PPLAN_* settings (it ran each point as long as asked)."""
    path = tmp_path / "sweep.json"
    path.write_text(
        json.dumps({**DOC, "vary": {"num_gpus": list(range(1, 18)), "global_batch_size": list(range(240, 257))}})
    )
    assert cli.main(["sweep", str(path), "--quiet"]) == 2
    assert "289 points exceed the server limit max_sweep_points (256)" in capsys.readouterr().err
    monkeypatch.setenv("PPLAN_MAX_TIME_LIMIT_S", "0.001")
    monkeypatch.setenv("PPLAN_DEFAULT_TIME_LIMIT_S", "0.001")
    path.write_text(json.dumps(DOC))
    assert cli.main(["sweep", str(path), "--format", "json", "--workers", "1", "--quiet"]) == 4  # no point planned
    assert {r["status"] for r in json.loads(capsys.readouterr().out)["results"]} == {"timed_out"}


def test_sweep_results_keep_the_plan_warnings_and_the_clamp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each point carries what /plan warns about it (12 GPUs are not whole 8-GPU nodes); the
    sweep says once that the job's time limit was clamped to the server's."""
    monkeypatch.setenv("PPLAN_MAX_TIME_LIMIT_S", "5")
    monkeypatch.setenv("PPLAN_DEFAULT_TIME_LIMIT_S", "5")
    job = {**DOC["job"], "search": {"time_limit_s": 30}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"job": job, "vary": {"num_gpus": [8, 12]}}))
    assert cli.main(["sweep", str(path), "--format", "json", "--workers", "1", "--quiet"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["warnings"] == ["search.time_limit_s (30 s) clamped to the server limit max_time_limit_s (5 s)"]
    eight, twelve = body["results"]
    assert not any("whole number of 8-GPU nodes" in w for w in eight["warnings"])
    assert any(w.startswith("num_gpus (12) is not a whole number of 8-GPU nodes") for w in twelve["warnings"])
    assert cli.main(["sweep", str(path), "--format", "table", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "warning: search.time_limit_s (30 s) clamped" in out
    assert "warning: num_gpus=12: num_gpus (12) is not a whole number of 8-GPU nodes" in out


def test_sweep_warnings_are_listed_once() -> None:
    from api.sweep_cli import sweep_warnings
    from optimizer.capacity.sweep import PointResult, SweepStatus

    results = [PointResult(point={"num_gpus": n}, status="infeasible", warnings=["w", f"only {n}"]) for n in (8, 16)]
    status = SweepStatus(id="s", status="done", done=2, total=2, results=results, warnings=["w"], pareto=[])
    assert sweep_warnings(status) == ["w", "num_gpus=8: only 8", "num_gpus=16: only 16"]


def test_the_mfu_warnings_of_several_points_are_one_line() -> None:
    """Every point of a dense sweep carried the same 'above the best published' warning with its
    own MFU: eight full-length lines. They are now one, with the points and the MFU range."""
    from api.sweep_cli import sweep_warnings
    from optimizer.capacity.sweep import PointResult, SweepStatus

    rest = "is above the best published for h100-sxm-80gb at bf16 (49.4%, ...): treat it as an upper estimate"
    results = [
        PointResult(point={"num_gpus": n}, status="done", warnings=[f"predicted MFU {m}% {rest}"] + extra)
        for n, m, extra in ((8, 52.5, ["only 8"]), (16, 50.9, []), (32, 51.4, []))
    ]
    status = SweepStatus(id="s", status="done", done=3, total=3, results=results, warnings=["w"], pareto=[])
    assert sweep_warnings(status) == [
        "w",
        f"num_gpus=8; num_gpus=16; num_gpus=32: predicted MFU 50.9-52.5% {rest}",
        "num_gpus=8: only 8",
    ]
