"""Goodput, time to train, cost, energy and data bandwidth of a plan, and the objectives that rank
plans by them. The numbers come from ``formulas``; the defaults from the capacity catalog."""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.capacity import formulas as f
from optimizer.cost.gpu_rates import gemm_efficiency_of, power_clock
from optimizer.cost.memory import OPTIMIZER_BYTES, WEIGHT_BYTES
from optimizer.params import count_params
from optimizer.reference import current
from optimizer.results import Goodput, Plan, TimeToTrain
from optimizer.specs import JobSpec, Objective

SMALL_VOCAB_LIMIT = 65_500
"""Vocabularies below this store token ids as uint16 (Megatron's indexed dataset)."""


@dataclass(frozen=True)
class CapacityInputs:
    """A job's capacity figures with the catalog's defaults filled in."""

    num_gpus: int
    nodes: int
    params: int
    mtbf_gpu_s: float
    restart_s: float
    checkpoint_write_s: float | None  # as given; None: derived from the write rate
    write_bytes_per_s_per_node: float
    pue: float
    price_per_gpu_hour_usd: float | None
    idle_w: float
    tdp_w: float
    node_overhead_w: float
    gemm_efficiency: float
    bytes_per_token: float
    total_tokens: int | None
    global_batch_tokens: int


def price_per_gpu_hour_usd(job: JobSpec) -> float | None:
    """The job's price per GPU-hour: its GPU's in ``costs.price_per_gpu_hour_usd_by_gpu``, else
    ``costs.price_per_gpu_hour_usd``, else the catalog's for its GPU (None: none of them)."""
    by_gpu = job.costs.price_per_gpu_hour_usd_by_gpu or {}
    if job.cluster.gpu in by_gpu:
        return by_gpu[job.cluster.gpu]
    if job.costs.price_per_gpu_hour_usd is not None:
        return job.costs.price_per_gpu_hour_usd
    catalog_price = current().capacity.gpus[job.cluster.gpu].price_per_gpu_hour_usd  # type: ignore[index]
    return None if catalog_price is None else catalog_price.value


def job_nodes(job: JobSpec) -> int:
    """The nodes the job runs on: its topology assignment's (placed on free nodes, a node may
    give it fewer GPUs than it has), else whole nodes."""
    topo = job.cluster.topology
    if topo is not None and topo.assignment is not None:
        return len(topo.assignment.nodes)
    return math.ceil(job.cluster.resolved_num_gpus / (job.cluster.gpus_per_node or 1))


def resolve_inputs(job: JobSpec) -> CapacityInputs:
    cap = current().capacity
    d = cap.defaults
    gpu_id = job.cluster.gpu
    gpu = current().catalog.gpus[gpu_id]  # type: ignore[index]
    gcap = cap.gpus[gpu_id]  # type: ignore[index]
    rel, costs = job.reliability, job.costs
    price = price_per_gpu_hour_usd(job)
    # under a power cap the best achievable rate is the capped clock's
    eff = gemm_efficiency_of(job, gpu) * power_clock(job, gpu)
    vocab = job.model.vocab_size or 0
    token_bytes = d.token_bytes_small_vocab if vocab < SMALL_VOCAB_LIMIT else d.token_bytes_large_vocab
    n = job.cluster.resolved_num_gpus
    tdp = min(job.cluster.gpu_power_limit_w or gpu.tdp_w.value, gpu.tdp_w.value)  # a cap only lowers it
    return CapacityInputs(
        num_gpus=n,
        nodes=job_nodes(job),
        params=count_params(job.model).total,
        mtbf_gpu_s=(rel.gpu_mtbf_hours or d.gpu_mtbf_hours.value) * f.HOUR_S,
        restart_s=rel.restart_s if rel.restart_s is not None else d.restart_s.value,
        checkpoint_write_s=rel.checkpoint_write_s,
        write_bytes_per_s_per_node=rel.checkpoint_write_bytes_per_s_per_node
        or d.checkpoint_write_bytes_per_s_per_node.value,
        pue=costs.pue or d.pue.value,
        price_per_gpu_hour_usd=price,
        idle_w=min(gcap.idle_power_w.value, tdp),
        tdp_w=tdp,
        node_overhead_w=gcap.node_overhead_power_w.value,
        gemm_efficiency=eff,
        bytes_per_token=token_bytes.value,
        total_tokens=job.training.total_tokens,
        global_batch_tokens=job.training.global_batch_tokens or 0,
    )


LOW_GOODPUT = 0.5
"""Below this goodput fraction a plan's note says that failures take most of the time."""


def best_whole_steps(interval_s: float, step_s: float, write_s: float, mtbf_s: float, restart_s: float) -> tuple:
    """(goodput, steps): the whole number of steps between checkpoints, at most Young-Daly's rounded
    up, with the most goodput (checkpoints happen between steps). Daly's goodput is unimodal in the
    interval and its optimum lies at or below Young-Daly's, so an integer ternary search finds it."""

    def g(n: int) -> float:
        return f.goodput_fraction(n * step_s, write_s, mtbf_s, restart_s)

    lo, hi = 1, max(1, math.ceil(interval_s / step_s))
    while hi - lo > 2:
        a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if g(a) < g(b):
            lo = a + 1
        else:
            hi = b
    return max((g(n), n) for n in range(lo, hi + 1))


def goodput_of(inp: CapacityInputs, plan: Plan) -> Goodput:
    ckpt = f.checkpoint_bytes(inp.params, WEIGHT_BYTES, OPTIMIZER_BYTES)
    write_s = inp.checkpoint_write_s or f.sharded_write_time_s(ckpt, inp.nodes, inp.write_bytes_per_s_per_node)
    mtbf = f.system_mtbf_s(inp.mtbf_gpu_s, inp.num_gpus)
    interval = f.young_daly_interval_s(write_s, mtbf)
    fraction, steps = best_whole_steps(interval, plan.step_time_s, write_s, mtbf, inp.restart_s)
    return Goodput(
        checkpoint_bytes=ckpt,
        checkpoint_write_s=write_s,
        checkpoint_interval_s=steps * plan.step_time_s,
        checkpoint_interval_steps=steps,
        mtbf_system_s=mtbf,
        restart_s=inp.restart_s,
        fraction=fraction,
        tokens_per_s=plan.tokens_per_s * fraction,
    )


def power_per_gpu_w(inp: CapacityInputs, plan: Plan) -> float:
    """Board power at the plan's hardware utilisation (HFU over the GPU's best GEMM rate) plus
    the host's share, per GPU."""
    board = f.board_power_w(inp.idle_w, inp.tdp_w, plan.hfu / inp.gemm_efficiency)
    return board + inp.node_overhead_w


def time_to_train_of(inp: CapacityInputs, plan: Plan, goodput: Goodput) -> TimeToTrain | None:
    if inp.total_tokens is None or goodput.fraction <= 0.0:
        return None
    steps = math.ceil(inp.total_tokens / inp.global_batch_tokens)
    # whole steps: the last one trains a full batch (the budget rounded up to one)
    wall = f.wall_time_s(steps * inp.global_batch_tokens, plan.tokens_per_s, goodput.fraction)
    hours = f.gpu_hours(wall, inp.num_gpus)
    power = power_per_gpu_w(inp, plan)
    cost = None if inp.price_per_gpu_hour_usd is None else f.cost_usd(hours, inp.price_per_gpu_hour_usd)
    return TimeToTrain(
        total_tokens=inp.total_tokens,
        steps=steps,
        days=wall / f.DAY_S,
        gpu_hours=hours,
        cost_usd=cost,
        price_per_gpu_hour_usd=inp.price_per_gpu_hour_usd,
        energy_mwh=f.energy_mwh(wall, inp.num_gpus, power - inp.node_overhead_w, inp.node_overhead_w, inp.pue),
        power_per_gpu_w=power,
        pue=inp.pue,
        expected_failures=wall / goodput.mtbf_system_s,
    )


def annotate(inp: CapacityInputs, plan: Plan) -> Plan:
    """``plan`` with its ``goodput``, ``time_to_train`` and ``data_loading_bytes_per_s``."""
    goodput = goodput_of(inp, plan)
    notes = plan.notes
    if goodput.fraction < LOW_GOODPUT:
        notes = [*notes, (
            f"goodput {goodput.fraction:.1%}: a failure every {goodput.mtbf_system_s:,.1f} s on average, against "
            f"checkpoints every {goodput.checkpoint_interval_s:,.1f} s (each {goodput.checkpoint_write_s:,.1f} s to "
            f"write) and {goodput.restart_s:,.0f} s restarts, leaves most of the time to failures"
            + ("; no time to train" if goodput.fraction <= 0.0 else "")
        )]  # fmt: skip
    return plan.model_copy(
        update={
            "notes": notes,
            "goodput": goodput,
            "time_to_train": time_to_train_of(inp, plan, goodput),
            "data_loading_bytes_per_s": f.data_loading_bytes_per_s(plan.tokens_per_s, inp.bytes_per_token),
        }
    )


def objective_value(objective: Objective, inp: CapacityInputs, plan: Plan) -> float:
    """What ``objective`` minimises, per token so that it needs no token budget (the ranking is
    the same with one): step time, seconds, dollars or joules per delivered token."""
    if objective == "throughput":
        return plan.step_time_s
    assert plan.goodput is not None
    rate = plan.goodput.tokens_per_s
    if rate <= 0.0:
        return math.inf
    if objective in ("time_to_train", "goodput_throughput"):
        return 1.0 / rate
    if objective == "cost":
        return inp.num_gpus * (inp.price_per_gpu_hour_usd or 1.0) / rate
    return inp.num_gpus * power_per_gpu_w(inp, plan) * inp.pue / rate  # energy


def rank(objective: Objective, inp: CapacityInputs, plans: list[Plan]) -> list[Plan]:
    """Annotated plans ordered by ``objective`` (stable: ties keep the search's order)."""
    if objective == "throughput":
        return plans
    return sorted(plans, key=lambda p: objective_value(objective, inp, p))
