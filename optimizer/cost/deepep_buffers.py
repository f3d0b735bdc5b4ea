"""The communication buffers DeepEP's normal (high-throughput) kernels hold on every rank of an
expert-parallel group, as Megatron-Core sizes them: the larger of the dispatch and combine
configs' NVLink and RDMA size hints (``megatron/core/transformer/moe/fused_a2a.py`` ``get_buffer``
at Megatron-LM 000c4ac2), from DeepEP's ``csrc/config.hpp`` ``get_nvl_buffer_size_hint`` /
``get_rdma_buffer_size_hint`` and the recommended configs of ``deep_ep/buffer.py``
(deepseek-ai/DeepEP 04b06f7a)."""

from __future__ import annotations

import bisect

from optimizer.cost.context import JobContext

NVL_PEERS = 8
"""``NUM_MAX_NVL_PEERS``: ranks one NVLink node holds."""
CHANNELS = 10
"""Half the SMs the kernels use: Megatron's ``--moe-deepep-num-sms`` 20 (its default)."""
SOURCE_META_BYTES = 8
"""``internode::get_source_meta_bytes()`` (two ints)."""
MAX_TOPK = 128
MAX_SCALES = 128
RDMA_SAFETY_BYTES = 1 << 20
WORKSPACE_BYTES = 32 << 20
"""DeepEP's ``NUM_WORKSPACE_BYTES``, allocated with every buffer."""

# group size -> (nvl recv tokens, rdma send tokens, rdma recv tokens) of the dispatch and combine
# configs (``Buffer.get_dispatch_config`` / ``get_combine_config``)
DISPATCH = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 20, 128), 24: (288, 32, 128),
            32: (288, 32, 128), 64: (288, 28, 128), 128: (560, 32, 128), 144: (720, 12, 128), 160: (720, 12, 128)}  # fmt: skip
COMBINE = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 28, 128), 24: (288, 20, 128),
           32: (288, 20, 128), 64: (288, 20, 128), 128: (560, 12, 128), 144: (720, 8, 128), 160: (720, 8, 128)}  # fmt: skip


def _align(a: int, b: int) -> int:
    return -(-a // b) * b


def _config(table: dict[int, tuple[int, int, int]], ranks: int) -> tuple[int, int, int]:
    """The config of ``ranks`` (DeepEP has one per listed size; another size takes the next one
    listed, or the largest)."""
    sizes = sorted(table)
    return table[sizes[min(bisect.bisect_left(sizes, ranks), len(sizes) - 1)]]


def _row_bytes(hidden_bytes: int) -> int:
    """One received token's slot: its row, source metadata, top-k indices (int64) and weights
    (fp32) and scales (fp32)."""
    return hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * 8 + MAX_TOPK * 4 + MAX_SCALES * 4


def _nvl_bytes(nvl_recv: int, hidden_bytes: int, ranks: int) -> int:
    rdma_ranks, nvl_ranks = max(ranks // NVL_PEERS, 1), min(ranks, NVL_PEERS)
    per_token = _row_bytes(hidden_bytes)
    total = CHANNELS * nvl_ranks * (2 * rdma_ranks + 3) * 4 + CHANNELS * nvl_ranks * nvl_recv * per_token
    return _align(total, 128)


def _rdma_bytes(send: int, recv: int, hidden_bytes: int, ranks: int) -> int:
    if ranks <= NVL_PEERS:
        return 0
    recv = _align(recv, send)
    rdma_ranks = ranks // NVL_PEERS
    per_token = 2 * (_row_bytes(hidden_bytes) + 16)  # send and receive halves; an int4 header each
    total = CHANNELS * rdma_ranks * (NVL_PEERS * 2 + 2) * 2 * 4 + CHANNELS * rdma_ranks * recv * per_token
    return _align(total + RDMA_SAFETY_BYTES, 128)


def deepep_buffer_bytes(hidden: int, ranks: int) -> float:
    """Bytes one rank of a ``ranks``-wide DeepEP group holds for ``hidden``-wide bf16 rows:
    NVLink and RDMA buffers (each the larger of dispatch's and combine's) and the workspace."""
    if ranks <= 1:
        return 0.0
    hidden_bytes = 2 * hidden
    nvl = max(_nvl_bytes(_config(t, ranks)[0], hidden_bytes, ranks) for t in (DISPATCH, COMBINE))
    rdma = max(_rdma_bytes(*_config(t, ranks)[1:], hidden_bytes, ranks) for t in (DISPATCH, COMBINE))
    return float(nvl + rdma + WORKSPACE_BYTES)


def dispatcher_buffer_bytes(ctx: JobContext, ranks: int) -> float:
    """What an MoE job's token dispatcher holds per GPU over an expert group (``ep x etp``) of
    ``ranks``: DeepEP's buffers for ``deepep`` and ``hybridep`` (costed as DeepEP); nothing for
    the NCCL dispatchers (their all-to-all goes through the NCCL buffers already charged)."""
    model = ctx.job.model
    if model.moe is None or ctx.job.training.moe_dispatcher not in ("deepep", "hybridep"):
        return 0.0
    return deepep_buffer_bytes(int(model.hidden_size or 0), ranks)
