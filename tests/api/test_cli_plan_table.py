"""`pplan plan --format table`: each plan's notes, the response's warnings and the explanation,
with memory shown against usable memory (capacity less headroom, what fits_memory is judged on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.cli import main as pplan


def test_plan_table_shows_notes_warnings_and_usable_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch_size": 1536},
        "cluster": {"preset": "dgx-a100", "num_gpus": 1024},
        "search": {"top_k": 2, "fix": {"tp": 4, "pp": 8, "vpp": 12, "zero_stage": 2}, "memory_headroom_gib": 4},
    }))  # fmt: skip
    # ZeRO-2 named with pipelines: searched, and each plan's notes say no framework runs it
    assert pplan(["plan", str(path), "--format", "table"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("1 "))
    # the A100's 80 GiB capacity less 4 GiB headroom: 76.0 usable (79.0 with the default 1 GiB)
    assert "59.3/76.0" in row
    assert any(line.startswith("plan 1 note: zero_stage 2 with pipeline parallelism") for line in lines)
    assert any(line.startswith("plan 1 note: runs on no framework as costed") for line in lines)
    assert any(line.startswith("plan 2 note: ") for line in lines)
    assert any(line.startswith("warning: predicted MFU 59.5% is above the best published") for line in lines)
    assert any(line.startswith("explanation: Top plan (TP4 PP8 DP32 VPP12") for line in lines)
