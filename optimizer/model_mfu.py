"""The best MFU published for each MoE model shape on each GPU, training precision and sequence
length: an MoE plan of the same shape and sequence length predicted above it gets a warning naming
that run (MFU rises with the sequence length: attention's share of the FLOPs grows).

A model's shape is its ``ModelShape`` (layers, hidden size, attention heads, FFN width, experts,
experts per token, expert FFN width), so a custom model of a published shape matches too. The
numbers come from the calibration set of published runs: ``benchmarks/job_checks.py --write``
writes ``optimizer/data/model_mfu.toml`` and ``--check`` fails when it differs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from optimizer.specs import ModelSpec

DATA_PATH = Path(__file__).resolve().parent / "data" / "model_mfu.toml"


class ModelShape(NamedTuple):
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    num_experts: int
    """0 for a dense model."""
    top_k: int
    expert_ffn_hidden_size: int


def model_shape(model: ModelSpec) -> ModelShape:
    """The shape of a (resolved) model spec."""
    moe = model.moe
    return ModelShape(
        int(model.num_layers or 0), int(model.hidden_size or 0), int(model.num_attention_heads or 0),
        int(model.ffn_hidden_size or 0), moe.num_experts if moe else 0, moe.top_k if moe else 0,
        moe.expert_ffn_hidden_size if moe else 0,
    )  # fmt: skip


@dataclass(frozen=True)
class ModelBest:
    model: str
    """The published run's model name."""
    shape: ModelShape
    gpus: tuple[str, ...]
    precision: str
    """"16-bit" (bf16, fp16) or "fp8" (fp8, MXFP8)."""
    mfu: float
    run: str
    """The row id in the calibration set (``benchmarks/data/published_runs.json``)."""
    num_gpus: int
    seq_len: int
    source: str


def precision_key(precision: str) -> str:
    return "16-bit" if precision in ("bf16", "fp16") else precision


@lru_cache(maxsize=1)
def load_model_bests(path: Path = DATA_PATH) -> tuple[ModelBest, ...]:
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    return tuple(
        ModelBest(
            r["model"],
            ModelShape(**r["shape"]),
            tuple(r["gpus"]),
            r["precision"],
            float(r["mfu"]),
            r["run"],
            int(r["num_gpus"]),
            int(r["seq_len"]),
            r["source"],
        )  # fmt: skip
        for r in data.get("best", [])
    )


def best_for_model(model: ModelSpec, gpu: str, precision: str, seq_len: int) -> ModelBest | None:
    """The best published run of ``model``'s shape on ``gpu`` at ``precision`` and ``seq_len``, if any."""
    shape, key = model_shape(model), precision_key(precision)
    return next(
        (b for b in load_model_bests()
         if b.shape == shape and gpu in b.gpus and b.precision == key and b.seq_len == seq_len),
        None,
    )  # fmt: skip
