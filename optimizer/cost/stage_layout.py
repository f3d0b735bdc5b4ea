"""The layout fields the per-stage arithmetic reads: one ``ResolvedLayout``, or numpy columns
of many layouts (``cost.columns``)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.cost.num import Num


class StageLayout(Protocol):
    """The layout fields the stage arithmetic reads (``stage_fixed_terms``, ``stage_memory``,
    ``dp_exposed_s``, ``pp_comm_s``, ``step_breakdown``): a ``ResolvedLayout``, or a batch of
    layouts whose depth, micro-batch size and count and sequence parallelism are numpy columns
    (``cost.columns.LayoutColumns``)."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def etp(self) -> int: ...
    @property
    def zero_stage(self) -> int: ...
    @property
    def vpp(self) -> Num: ...
    @property
    def micro_batch_size(self) -> Num: ...
    @property
    def num_micro_batches(self) -> Num: ...
    @property
    def sequence_parallel(self) -> bool | np.ndarray: ...
