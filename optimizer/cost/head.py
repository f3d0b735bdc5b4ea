"""The LM head's and loss's time for one micro-batch on one GPU, memoised per job by what it reads."""

from __future__ import annotations

from typing import NamedTuple

from optimizer.cost.caches import Memo
from optimizer.cost.context import JobContext
from optimizer.cost.layer import gemm_time_s
from optimizer.cost.rules import ResolvedLayout


def head_time_s(ctx: JobContext, lay: ResolvedLayout) -> float:
    """Forward and backward of the LM head and loss for one micro-batch (memoised per job)."""
    return head_time_at_s(ctx, lay.tp, lay.cp, lay.micro_batch_size)


class HeadKey(NamedTuple):
    """All the LM head's time reads of a layout."""

    tp: int
    cp: int
    micro_batch_size: int


HEAD_TIME = Memo[HeadKey, float]("head_time_s")


def head_time_at_s(ctx: JobContext, tp: int, cp: int, micro_batch_size: int) -> float:
    """``head_time_s`` of a layout with these sizes (memoised per ``HeadKey``)."""
    key = tuple.__new__(HeadKey, (tp, cp, micro_batch_size))
    table = ctx.caches[HEAD_TIME]
    t = table.get(key)
    if t is None:
        t = table[key] = _head_time_uncached(ctx, key)
    return t


def _head_time_uncached(ctx: JobContext, key: HeadKey) -> float:
    """The LM head's time from its key alone."""
    tp, cp, micro_batch_size = key
    model = ctx.job.model
    h = float(model.hidden_size or 0)
    vocab = float(model.vocab_size or 0)
    tokens = micro_batch_size * ctx.job.training.seq_len / cp
    t = 3.0 * gemm_time_s(ctx, 2.0 * tokens * h * vocab / tp, tokens, vocab / tp, h)
    t += 3.0 * tokens * vocab / tp * ctx.logit_bytes / ctx.hbm_bytes_per_s
    return t
