"""The ``pplan`` command: input and output formats, exit codes (0 ok, 2 invalid, 3 infeasible).

``TestRealService`` runs the real planner; the other tests replace it with stand-ins where they
need one, so they pin the command itself.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import cli
from jobs import LLAMA3_70B_ON_1024_H100, job_copy
from optimizer import service
from optimizer.errors import InvalidLayout
from optimizer.results import (
    LaunchArgs,
    MemoryBreakdown,
    Plan,
    PlanResponse,
    SolverInfo,
    TimeBreakdown,
)
from optimizer.specs import EvaluateRequest, Layout, PlanRequest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PPLAN = Path(sys.executable).with_name("pplan")

JOB: dict[str, Any] = job_copy(LLAMA3_70B_ON_1024_H100)
EVALUATE_DOC: dict[str, Any] = {
    **JOB,
    "config": {"tp": 8, "pp": 4, "zero_stage": 1, "recompute": "selective"},
}


def canned_plan() -> Plan:
    """A syntactically complete Plan (numbers are placeholders, not estimates)."""
    return Plan(
        config=Layout(tp=8, pp=4, dp=32, vpp=5, num_micro_batches=32, recompute="selective"),
        placement={"tp": "nvlink", "cp": "nvlink", "ep": "nvlink", "dp": "leaf", "pp": "spine"},
        step_time_s=9.8,
        tokens_per_s=854862.0,
        tokens_per_s_per_gpu=834.8,
        mfu=0.4312,
        hfu=0.47,
        model_tflops_per_gpu=426.5,
        time_breakdown_s=TimeBreakdown(compute=8.0, tp_comm=0.8, pp_bubble=1.0),
        memory_gib=MemoryBreakdown(
            weights=4.4,
            gradients=4.4,
            optimizer=1.1,
            activations=30.0,
            buffers=3.0,
            total=42.9,
            capacity=79.2,
        ),
        fits_memory=True,
        bottleneck="compute",
        launch=LaunchArgs(megatron="--tensor-model-parallel-size 8"),
    )


@pytest.fixture
def fake_service(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the planner: plan() returns ``state['plan_response']``; requests are recorded."""
    state: dict[str, Any] = {
        "plan_response": PlanResponse(status="optimal", plans=[canned_plan()], solver=SolverInfo(proved_optimal=True)),
        "requests": [],
    }

    def fake_plan(request: PlanRequest) -> PlanResponse:
        state["requests"].append(request)
        return state["plan_response"]

    def fake_evaluate(request: EvaluateRequest) -> Plan:
        state["requests"].append(request)
        return canned_plan()

    monkeypatch.setattr(service, "plan", fake_plan)
    monkeypatch.setattr(service, "evaluate", fake_evaluate)
    return state


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data)
    elif name.endswith(".json"):
        path.write_text(json.dumps(data))
    else:
        path.write_text(yaml.safe_dump(data))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -------------------------------------------------------------------------------- input documents


@pytest.mark.parametrize("name", ["job.json", "job.yaml", "job.yml", "job.txt"])
def test_plan_reads_json_and_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_service: dict[str, Any], name: str
) -> None:
    code, out, _ = run(capsys, "plan", str(write(tmp_path, name, JOB)))
    assert code == cli.EXIT_OK
    assert json.loads(out)["status"] == "optimal"
    assert fake_service["requests"] == [PlanRequest.model_validate(JOB)]


def test_yaml_without_a_known_extension_is_detected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_service: dict[str, Any]
) -> None:
    path = write(tmp_path, "job.request", yaml.safe_dump(JOB))
    assert run(capsys, "plan", str(path))[0] == cli.EXIT_OK


def test_plan_reads_standard_input(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake_service: dict[str, Any],
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(JOB)))
    assert run(capsys, "plan", "-")[0] == cli.EXIT_OK


@pytest.mark.parametrize(
    "path",
    sorted(p for p in EXAMPLES.iterdir() if p.name.startswith(("plan-", "evaluate-"))),
    ids=lambda p: p.name,
)
def test_every_example_is_a_valid_request(path: Path) -> None:
    data = cli.load_document(str(path))
    model = EvaluateRequest if path.name.startswith("evaluate-") else PlanRequest
    model.model_validate(data)


def test_deepspeed_zero3_example_matches_its_published_run() -> None:
    """docs/api.md quotes this example: 65.0 tokens/s a GPU predicted, 61.4 measured (SC'21 Table 2,
    768 A100)."""
    data = cli.load_document(str(EXAMPLES / "evaluate-gpt3-175b-zero3-deepspeed.yaml"))
    plan = service.evaluate(EvaluateRequest.model_validate(data))
    assert plan.tokens_per_s_per_gpu == pytest.approx(65.0, abs=0.05)
    assert plan.tokens_per_s_per_gpu == pytest.approx(61.4, rel=0.06)


def test_torchtitan_example_matches_its_published_run() -> None:
    """The example describes torchtitan's stack (eager, SDPA flash, fp32 gradient reduction, PyTorch
    cross-entropy): 5,667 tokens/s a GPU predicted (5,762 measured) in 82.2 GiB (82.4 GiB reserved,
    published); its loss costs 12.7 GiB of that over a fused one (the logits and the allocator's
    share)."""
    data = cli.load_document(str(EXAMPLES / "evaluate-llama3.1-8b-torchtitan.yaml"))
    plan = service.evaluate(EvaluateRequest.model_validate(data))
    assert plan.tokens_per_s_per_gpu == pytest.approx(5667, abs=1) and plan.memory_gib.total == pytest.approx(
        82.2, abs=0.05
    )
    assert plan.tokens_per_s_per_gpu == pytest.approx(5762, rel=0.05)
    assert plan.memory_gib.total == pytest.approx(82.4, rel=0.05)
    data["training"]["cross_entropy"] = "fused"
    fused = service.evaluate(EvaluateRequest.model_validate(data))
    assert plan.memory_gib.total - fused.memory_gib.total == pytest.approx(12.7, abs=0.05)


def test_the_required_examples_exist() -> None:
    names = {p.name for p in EXAMPLES.iterdir()}
    assert {
        "plan-llama3-70b-dgx-h100.yaml",
        "plan-llama3.1-405b-16k.yaml",
        "plan-mixtral-8x22b.yaml",
        "plan-deepseek-v3-gb200-nvl72.yaml",
        "plan-qwen3-235b.yaml",
        "evaluate-llama3-70b.yaml",
        "plan-custom-model.json",
    } <= names


# --------------------------------------------------------------------------------- output formats


def test_plan_yaml_output(tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_service: dict[str, Any]) -> None:
    code, out, _ = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)), "--format", "yaml")
    assert code == cli.EXIT_OK
    assert PlanResponse.model_validate(yaml.safe_load(out)) == fake_service["plan_response"]


def test_plan_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_service: dict[str, Any]) -> None:
    code, out, _ = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)), "--format", "table")
    assert code == cli.EXIT_OK
    lines = out.splitlines()
    assert lines[0].startswith("status: optimal")
    header = lines[1].split()
    for column in (
        "rank",
        "tp",
        "pp",
        "dp",
        "cp",
        "ep",
        "vpp",
        "mbs",
        "zero",
        "recompute",
        "placement",
        "step_s",
        "mfu",
        "mem_gib",
        "bottleneck",
    ):
        assert column in header
    row = lines[3]
    for cell in (
        "selective",
        "tp:nvlink",
        "dp:leaf",
        "pp:spine",
        "9.800",
        "43.1%",
        "42.9/79",
        "compute",
    ):
        assert cell in row


def test_evaluate_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_service: dict[str, Any]) -> None:
    path = str(write(tmp_path, "eval.yaml", EVALUATE_DOC))
    code, out, _ = run(capsys, "evaluate", path)
    assert code == cli.EXIT_OK and Plan.model_validate(json.loads(out)) == canned_plan()
    code, out, _ = run(capsys, "evaluate", path, "-f", "yaml")
    assert code == cli.EXIT_OK and Plan.model_validate(yaml.safe_load(out)) == canned_plan()
    code, out, _ = run(capsys, "evaluate", path, "--format", "table")
    assert code == cli.EXIT_OK
    assert "bottleneck" in out and "pp_bubble=1.000" in out and "capacity=79.2" in out


@pytest.mark.parametrize("which", cli.CATALOGS)
def test_catalog_formats(capsys: pytest.CaptureFixture[str], which: str) -> None:
    code, out, _ = run(capsys, "catalog", which)
    assert code == cli.EXIT_OK
    entries = json.loads(out)
    assert entries and all("id" in entry for entry in entries)
    code, out, _ = run(capsys, "catalog", which, "--format", "yaml")
    assert code == cli.EXIT_OK and yaml.safe_load(out) == entries
    code, out, _ = run(capsys, "catalog", which, "--format", "table")
    assert code == cli.EXIT_OK
    assert out.splitlines()[0].split()[0] == "id"
    assert all(entry["id"] in out for entry in entries)


# ------------------------------------------------------------------------------------- exit codes


def test_infeasible_exits_3_with_the_explanation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_service: dict[str, Any]
) -> None:
    fake_service["plan_response"] = PlanResponse(
        status="infeasible",
        plans=[],
        solver=SolverInfo(),
        explanation="smallest need 93.1 GiB > 79.2 GiB",
    )
    code, out, err = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)))
    assert code == cli.EXIT_INFEASIBLE == 3
    assert json.loads(out)["status"] == "infeasible"
    assert "93.1 GiB" in err
    code, out, _ = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)), "--format", "table")
    assert code == 3 and "explanation: smallest need 93.1 GiB" in out


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {**JOB, "model": {"preset": "llama9"}},
            ["model:", "unknown model preset id 'llama9'", "llama3-70b"],
        ),
        (
            {**JOB, "cluster": {"gpu": "tpu-v9", "num_gpus": 8}},
            ["cluster:", "unknown gpu id 'tpu-v9'", "h100-sxm-80gb"],
        ),
        ({**JOB, "training": {"global_batch_size": 8}}, ["training.seq_len: Field required"]),
        ({**JOB, "searhc": {}}, ["searhc: Extra inputs are not permitted"]),
        ({**JOB, "search": {"top_k": 500}}, ["search.top_k"]),
    ],
    ids=["unknown-preset", "unknown-gpu", "missing-seq-len", "extra-field", "top-k"],
)
def test_invalid_request_exits_2_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_service: dict[str, Any],
    document: dict[str, Any],
    expected: list[str],
) -> None:
    code, out, err = run(capsys, "plan", str(write(tmp_path, "job.yaml", document)))
    assert code == cli.EXIT_INVALID == 2
    assert out == ""
    for text in expected:
        assert text in err
    assert fake_service["requests"] == []


def test_invalid_layout_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def reject(request: EvaluateRequest) -> Plan:
        raise InvalidLayout("config.tp", "tp (3) must divide num_attention_heads (64)")

    monkeypatch.setattr(service, "evaluate", reject)
    code, _, err = run(capsys, "evaluate", str(write(tmp_path, "eval.yaml", EVALUATE_DOC)))
    assert code == 2
    assert "config.tp: tp (3) must divide num_attention_heads (64)" in err


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.yaml", None, "cannot read"),
        ("broken.json", '{"model": ', "cannot parse"),
        ("broken.yaml", "model: [unclosed", "cannot parse"),
        ("list.yaml", "- 1\n- 2\n", "expected a request document"),
    ],
)
def test_unusable_file_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: str | None,
    expected: str,
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "plan", str(path))
    assert code == 2
    assert expected in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["catalog", "tpus"])
    assert exc.value.code == 2


@pytest.mark.parametrize("args", [["sweep", "examples/sweep-llama3-70b-h100.yaml", "--workers", "-1"],
                                  ["serve", "--workers", "0"], ["sweep", "x.yaml", "--workers", "two"]])  # fmt: skip
def test_worker_counts_below_one_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    assert "argument --workers" in capsys.readouterr().err


def test_bad_environment_setting_is_named_as_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PPLAN_SEARCH_MEMORY_MIB", "abc")
    code, _, err = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)))
    assert code == 2
    assert "PPLAN_* settings: invalid environment" in err
    assert "PPLAN_SEARCH_MEMORY_MIB: Input should be a valid integer" in err
    assert "job.yaml" not in err  # the document is fine
    monkeypatch.setenv("PPLAN_SEARCH_MEMORY_MIB", "512")
    monkeypatch.setenv("PPLAN_MAX_TIME_LIMIT_S", "1")  # below the default time limit: a cross-field check
    code, _, err = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)))
    assert code == 2 and "PPLAN_DEFAULT_TIME_LIMIT_S: default_time_limit_s (10.0) exceeds" in err
    monkeypatch.setenv("PPLAN_MAX_TIME_LIMIT_S", "inf")  # would switch the time-limit clamp off
    code, _, err = run(capsys, "plan", str(write(tmp_path, "job.yaml", JOB)))
    assert code == 2 and "PPLAN_MAX_TIME_LIMIT_S: Input should be a finite number" in err


def test_serve_passes_host_and_port_to_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append({"app": app, **kwargs}))
    monkeypatch.setenv("PPLAN_PORT", "9100")
    assert cli.main(["serve", "--host", "0.0.0.0"]) == 0
    assert calls[0]["app"] == "api.main:app"
    assert calls[0]["host"] == "0.0.0.0" and calls[0]["port"] == 9100
    assert cli.main(["serve", "--port", "9200"]) == 0
    assert calls[1]["host"] == "127.0.0.1" and calls[1]["port"] == 9200


# ------------------------------------------------------------------- the installed console script


def test_console_script_catalog_table() -> None:
    result = subprocess.run(
        [str(PPLAN), "catalog", "clusters", "--format", "table"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "gb200-nvl72" in result.stdout


def test_console_script_invalid_input_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", {**JOB, "model": {"preset": "nope"}})
    result = subprocess.run([str(PPLAN), "plan", str(path)], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "unknown model preset id 'nope'" in result.stderr


# ------------------------------------------------------------------------------- the real planner


class TestRealService:
    """Through ``optimizer.service`` itself (no stand-ins)."""

    def test_evaluate_example(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = run(capsys, "evaluate", str(EXAMPLES / "evaluate-llama3-70b.yaml"))
        assert code == 0, err
        plan = Plan.model_validate(json.loads(out))
        assert plan.step_time_s > 0 and 0 < plan.mfu < 1 and plan.config.dp == 32

    def test_evaluate_invalid_layout_exits_2(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        doc = {**EVALUATE_DOC, "config": {**EVALUATE_DOC["config"], "tp": 3}}
        code, _, err = run(capsys, "evaluate", str(write(tmp_path, "eval.yaml", doc)))
        assert code == 2
        assert "config" in err

    def test_plan_example_table(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = run(capsys, "plan", str(EXAMPLES / "plan-custom-model.json"), "--format", "table")
        assert code == 0, err
        assert out.splitlines()[0].split()[1] in {"optimal", "feasible"}
        assert "rank" in out

    def test_plan_infeasible_exits_3(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        doc = {
            "model": {
                "name": "dense-2t", "num_layers": 160, "hidden_size": 32768,
                "ffn_hidden_size": 131072, "num_attention_heads": 256, "num_kv_heads": 32,
                "vocab_size": 128256,
            },
            "training": {"seq_len": 4096, "global_batch_size": 64},
            "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        }  # fmt: skip
        code, out, err = run(capsys, "plan", str(write(tmp_path, "job.yaml", doc)))
        assert code == 3
        assert json.loads(out)["explanation"]
        assert "infeasible" in err

    def test_console_script_evaluate_table(self) -> None:
        result = subprocess.run(
            [
                str(PPLAN),
                "evaluate",
                str(EXAMPLES / "evaluate-llama3-70b.yaml"),
                "--format",
                "table",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "bottleneck" in result.stdout


def test_yaml_reads_exponent_floats_as_numbers(tmp_path: Path) -> None:
    """YAML 1.2 reads ``1e12`` as a number; PyYAML's 1.1 rules read it as the string '1e12'."""
    path = write(tmp_path, "job.yaml", "a: 1e12\nb: -2E-3\nc: 1.5e3\nd: '1e3'\ne: 12e\nf: 7\n")
    assert cli.load_document(str(path)) == {"a": 1e12, "b": -2e-3, "c": 1500.0, "d": "1e3", "e": "12e", "f": 7}
    job = write(tmp_path, "plan.yaml", yaml.safe_dump(JOB).replace("training:", "training:\n  total_tokens: 1e12", 1))
    assert PlanRequest.model_validate(cli.load_document(str(job))).training.total_tokens == 10**12


def test_yaml_reads_integers_and_booleans_as_yaml_1_2(tmp_path: Path) -> None:
    """PyYAML's 1.1 rules read 0512 as octal (330), 1:04 in base 60 (64) and on / yes as true,
    silently; requests read YAML 1.2's integers (0o and 0x prefixes) and booleans, so those are
    strings the request refuses, and a leading zero is an error."""
    path = write(tmp_path, "job.yaml", "a: 0x10\nb: 0o17\nc: 1_000\nd: 1:04\ne: on\nf: yes\ng: true\nh: -3\n")
    dates = write(tmp_path, "dates.yaml", "a: 1:04.5\nb: 2024-01-01\nc: .5\nd: 3.\n")
    assert cli.load_document(str(dates)) == {"a": "1:04.5", "b": "2024-01-01", "c": 0.5, "d": 3.0}
    assert cli.load_document(str(path)) == {
        "a": 16,
        "b": 15,
        "c": 1000,
        "d": "1:04",
        "e": "on",
        "f": "yes",
        "g": True,
        "h": -3,
    }
    bad = write(
        tmp_path, "plan.yaml", yaml.safe_dump(JOB).replace("global_batch_size: 1024", "global_batch_size: 01024")
    )
    with pytest.raises(cli.InputError, match="'01024': an integer with a leading zero"):
        cli.load_document(str(bad))
    overlap = write(
        tmp_path, "on.yaml", yaml.safe_dump(JOB).replace("training:", "training:\n  tp_comm_overlap: on", 1)
    )
    with pytest.raises(ValueError, match="tp_comm_overlap"):
        PlanRequest.model_validate(cli.load_document(str(overlap)))


def test_a_broken_json_document_gets_the_json_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an extension a document is tried as JSON, then YAML; one that starts as JSON
    reports the JSON error (YAML's flow-mapping error about the same text misleads)."""
    monkeypatch.setattr("sys.stdin", io.StringIO('{"model": '))
    with pytest.raises(cli.InputError, match="not valid JSON: Expecting value"):
        cli.load_document("-")
    monkeypatch.setattr("sys.stdin", io.StringIO("a: [1"))
    with pytest.raises(cli.InputError, match="YAML"):
        cli.load_document("-")


def test_inventories_keep_exponent_like_names_as_strings() -> None:
    """Topology files and kubectl output keep YAML 1.1's rules: a node named 2e1 stays a name."""
    from api.documents import parse_yaml_all

    assert parse_yaml_all("nodes: [2e1, gpu001]\nblock: 1e1\n") == [{"nodes": ["2e1", "gpu001"], "block": "1e1"}]


def test_cli_plan_keeps_the_search_memory_budget(tmp_path, capsys, monkeypatch) -> None:
    """PPLAN_SEARCH_MEMORY_MIB bounds `pplan plan` as it bounds /plan (the CLI kept 512 MiB)."""
    import json as _json

    monkeypatch.setenv("PPLAN_SEARCH_MEMORY_MIB", "16")
    path = tmp_path / "plan.json"
    path.write_text(_json.dumps({  # 141,360 layouts and more: over 16 MiB, under the default 512
        "model": {"num_layers": 1008, "hidden_size": 14400, "num_attention_heads": 720, "vocab_size": 128000},
        "training": {"seq_len": 46080, "global_batch_size": 80640},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 5040},
        "search": {"time_limit_s": 5, "allow": {"zero_stage": [0, 1, 2, 3]}},
    }))  # fmt: skip
    assert cli.main(["plan", str(path)]) == 2
    assert "over the per-request memory budget of 16 MiB" in capsys.readouterr().err


def test_cli_evaluate_locates_request_fields_as_the_api_does(tmp_path, capsys) -> None:
    import json as _json

    path = tmp_path / "evaluate.json"
    path.write_text(_json.dumps({
        "model": {"preset": "llama3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "precision": "fp4"},
        "cluster": {"preset": "dgx-h100", "num_gpus": 8},
        "config": {"tp": 1},
    }))  # fmt: skip
    assert cli.main(["evaluate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "invalid layout: training.precision: fp4 needs FP4 tensor cores" in err and "config.training" not in err


def test_cli_names_a_cross_field_errors_field_once(tmp_path, capsys) -> None:
    """A model validator's message starts with its field; the CLI printed it twice
    (``reliability.x: reliability.x: ...``) or after ``(document)``."""
    import json as _json

    job = {"model": {"preset": "llama3-8b"}, "training": {"seq_len": 4096, "global_batch_size": 256},
           "cluster": {"preset": "dgx-h100", "num_gpus": 8}}  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(
        _json.dumps({**job, "reliability": {"checkpoint_write_s": 10, "checkpoint_write_bytes_per_s_per_node": 1e9}})
    )
    assert cli.main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "  reliability.checkpoint_write_bytes_per_s_per_node: give it or checkpoint_write_s, not both" in err
    path.write_text(_json.dumps({**job, "search": {"fix": {"recompute": "moe"}}}))
    assert cli.main(["plan", str(path)]) == 2
    assert "  search.fix.recompute: 'moe' recomputes MoE blocks and needs an MoE model" in capsys.readouterr().err


def test_server_module_names_a_bad_environment_variable() -> None:
    env = {**os.environ, "PPLAN_PORT": "abc"}
    result = subprocess.run(
        [sys.executable, "-m", "api.server"], check=False, capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 1
    assert "PPLAN_PORT: Input should be a valid integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_and_sweep_flags_keep_the_settings_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    """``pplan serve --workers 100000`` started hundreds of uvicorn workers (PPLAN_WORKERS stops at
    256) and ``--port 99999`` ended in a traceback; the flags now go through the same bounds."""
    assert cli.main(["serve", "--workers", "100000"]) == 2
    assert "--workers 100000: Input should be less than or equal to 256" in capsys.readouterr().err
    assert cli.main(["serve", "--port", "99999"]) == 2
    assert "--port 99999: Input should be less than or equal to 65535" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli.main(["sweep", "--workers", "1000", "x.json"])
    assert usage.value.code == 2 and "1000 is above 256" in capsys.readouterr().err


def test_documents_are_read_no_further_than_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pplan plan /dev/zero` or an endless pipe was read whole before the 8 MiB check (a
    MemoryError traceback); the read now stops one character past the limit. A UTF-8 byte-order
    mark, which HTTP accepts, is dropped."""
    from api.documents import MAX_DOCUMENT_BYTES

    asked: list[int] = []

    class Endless:
        def read(self, n: int = -1) -> str:
            asked.append(n)
            assert n > 0, "an unbounded read"
            return "{" * n

    monkeypatch.setattr("sys.stdin", Endless())
    with pytest.raises(cli.InputError, match="larger than 8,388,608 bytes"):
        cli.load_document("-")
    assert asked == [MAX_DOCUMENT_BYTES + 1]
    bom = tmp_path / "job.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(JOB).encode())
    assert cli.load_document(str(bom)) == JOB


def test_no_plan_in_the_time_limit_and_an_empty_sweep_exit_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both exited 0, so a CI step that ran them passed without an answer."""
    from api import sweep_cli
    from optimizer.capacity.sweep import PointResult, SweepStatus

    real = cli.service.plan

    def no_plans(request: PlanRequest) -> Any:
        answer = real(request)
        return answer.model_copy(update={"status": "feasible", "plans": [], "explanation": "time limit reached"})

    monkeypatch.setattr(cli.service, "plan", no_plans)
    job = write(tmp_path, "job.json", json.dumps(JOB))
    assert cli.main(["plan", str(job)]) == 4
    assert "no plan: time limit reached" in capsys.readouterr().err
    failed = [PointResult(point={"num_gpus": n}, status="infeasible", explanation="does not fit") for n in (8, 16)]
    status = SweepStatus(id="s", status="done", done=2, total=2, results=failed, pareto=[])
    monkeypatch.setattr(sweep_cli, "run", lambda *a, **k: status)
    assert cli.main(["sweep", str(job), "-q"]) == 4
    assert "sweep point num_gpus=16: infeasible: does not fit" in capsys.readouterr().err


def test_output_that_cannot_be_written_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """A full disk, a closed standard output and a reader that left (``| head``) were tracebacks;
    each is now one line on stderr and exit 1 (docs/api.md, exit codes)."""
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "api.cli", "evaluate", str(root / "examples" / "evaluate-llama3-70b.yaml")]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, cwd=root, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "pplan: could not write the output: No space left on device\n")
    closed = subprocess.run(argv, cwd=root, stderr=subprocess.PIPE, text=True, timeout=120,
                            preexec_fn=lambda: os.close(1))  # fmt: skip
    assert (closed.returncode, closed.stderr) == (1, "pplan: standard output is closed\n")
    reader = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # the reader leaves before the answer is written
    assert reader.wait(timeout=120) == 1
    assert reader.stderr.read() == "pplan: could not write the output: Broken pipe\n"


def test_other_system_errors_are_not_called_output_errors(tmp_path: Path) -> None:
    """Only a failed write of the answer reads "could not write the output": a topology written to
    a full disk is exit 1 too (it was 2, invalid input), and a flat Slurm topology says it is flat
    (it was a KeyError)."""
    root = Path(__file__).resolve().parents[2]
    slurm = root / "tests" / "placement" / "topology_data" / "slurm-topology.yaml"
    argv = [sys.executable, "-m", "api.cli", "topology", "from-slurm", str(slurm)]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, cwd=root, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "pplan: could not write the output: No space left on device\n")
    for out in ("/dev/full", str(tmp_path / "missing" / "topology.json")):  # -o PATH fails alike
        written = subprocess.run([*argv, "-o", out], cwd=root, capture_output=True, text=True, timeout=120)
        assert written.returncode == 1 and written.stderr.startswith(f"pplan: could not write the output: {out}: ")
    flat = subprocess.run([*argv, "--name", "topo3"], cwd=root, capture_output=True, text=True, timeout=120)
    assert flat.returncode == 2 and "topology.yaml: 'topo3' is flat (no tree or block" in flat.stderr
