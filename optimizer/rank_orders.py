"""The rank orders the frameworks lay their process groups out in (innermost axis first).

Every framework runs the default order, tensor parallelism innermost, then context and data
parallelism, pipeline stages outermost: Megatron-Core's ``tp-cp-ep-dp-pp``, torchtitan's device
mesh (``pp, dp_replicate, dp_shard, cp, tp``, outermost first) and DeepSpeed's
``PipeModelDataParallelTopology`` (``pipe, data, model``). Only Megatron puts pipeline stages
inside data parallelism (``--use-tp-pp-dp-mapping``: ``tp-cp-ep-pp-dp``), and only at some sizes:
each profile's ``pp_inside_dp`` rule (``optimizer/data/frameworks.toml``) says which. A plan is
costed only in orders a framework it targets runs, and lists only the frameworks that run its
order."""

from __future__ import annotations

from collections.abc import Mapping

from optimizer.modes import Axis

DEFAULT_ORDER: tuple[str, ...] = (Axis.TP, Axis.CP, Axis.DP, Axis.PP)
PP_INSIDE_DP_ORDER: tuple[str, ...] = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)

PP_INSIDE_DP_RULES: tuple[str, ...] = ("never", "no_cp_ep", "expert_dp_equals_dp")
"""The ``pp_inside_dp`` rules, least to most permissive:

- ``never``: the default order only;
- ``no_cp_ep``: with ``cp = ep = 1`` and experts split like the dense layers (``etp = tp``): an
  order string ``tp-pp-dp``, which Megatron-Core's ``RankGenerator`` refuses when an axis it
  does not name is larger than 1, and whose expert data-parallel groups must be the dense ones;
- ``expert_dp_equals_dp``: ``tp-cp-ep-pp-dp`` when the expert grid's data-parallel size equals
  the dense one (``etp x ep = tp x cp``; a dense model's expert grid is ``etp = tp``, ``ep = 1``,
  so ``cp = 1``): ``initialize_model_parallel`` asserts it for orders not ending in ``pp``."""


def pp_inside_dp_allowed(rule: str, sizes: Mapping[str, int], is_moe: bool) -> bool:
    """Whether ``rule`` lets a layout of ``sizes`` (tp, cp, ep, etp) put pipeline stages inside
    data parallelism."""
    tp, cp, ep, etp = sizes[Axis.TP], sizes[Axis.CP], sizes[Axis.EP], sizes.get("etp", 1)
    expert_block = ep * etp if is_moe else tp
    if rule == "no_cp_ep":
        return cp == 1 and ep == 1 and expert_block == tp
    return rule == "expert_dp_equals_dp" and expert_block == tp * cp


def is_pp_inside_dp(order: tuple[str, ...], sizes: Mapping[str, int]) -> bool:
    """Whether ``order`` puts the pipeline stages inside data parallelism (both larger than 1)."""
    return sizes[Axis.PP] > 1 and sizes[Axis.DP] > 1 and order.index(Axis.PP) < order.index(Axis.DP)


def framework_orders(sizes: Mapping[str, int], rule: str, is_moe: bool) -> list[tuple[str, ...]]:
    """The rank orders a layout of ``sizes`` may be costed in under the ``pp_inside_dp`` ``rule``
    of the frameworks it targets: the default, and pipeline stages inside data parallelism where
    the rule allows it and it differs."""
    orders = [DEFAULT_ORDER]
    # cp = 1 as well: with pipeline stages between them the dp x cp sharding group is not one
    # stride, which the cost model's group geometry needs (Megatron itself allows it for MoE)
    inside = sizes[Axis.PP] > 1 and sizes[Axis.DP] > 1 and sizes[Axis.CP] == 1
    if inside and pp_inside_dp_allowed(rule, sizes, is_moe):
        orders.append(PP_INSIDE_DP_ORDER)
    return orders


def most_permissive(rules: list[str]) -> str:
    """The most permissive of ``rules`` (``never`` for none)."""
    return max(rules, key=PP_INSIDE_DP_RULES.index, default="never")
