"""The CLI's tables show an ``etp`` column after ``ep`` exactly when some plan splits experts."""

from __future__ import annotations

from api.cli import evaluate_table
from optimizer.service import evaluate
from optimizer.specs import EvaluateRequest


def _header(etp: int) -> list[str]:
    req = {"model": {"preset": "mixtral-8x22b"}, "training": {"seq_len": 4096, "global_batch_size": 1024},
           "cluster": {"preset": "dgx-h100", "num_gpus": 256}, "config": {"tp": 4, "pp": 4, "ep": 8, "etp": etp}}  # fmt: skip
    table = evaluate_table(evaluate(EvaluateRequest.model_validate(req))).splitlines()
    header, row = table[0].split(), table[2].split()
    assert len(header) == len(row[: len(header)])
    return [f"{h}={v}" for h, v in zip(header, row, strict=False)]


def test_etp_column_only_when_experts_are_split() -> None:
    assert _header(2)[4:6] == ["ep=8", "etp=2"]  # the one-layout table has no rank column
    assert not any(cell.startswith("etp=") for cell in _header(1))
