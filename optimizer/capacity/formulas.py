"""The capacity-planning formulas: checkpointing, goodput, time to train, cost, energy and data
bandwidth. Every caller (plans, sweeps, suggestions, the source text's worked examples) uses
these functions; none repeats them.

Units are SI (bytes, seconds, watts, bytes/s); ``_hours``, ``_days``, ``_usd`` and ``_mwh`` say so
in their names.
"""

from __future__ import annotations

import math

HOUR_S = 3600.0
DAY_S = 86400.0
JOULES_PER_MWH = 3.6e9


# ---- reliability (source text, section 6) ------------------------------------------------------


def system_mtbf_s(mtbf_gpu_s: float, n: int) -> float:
    """``MTBF_system = MTBF_gpu / N`` for independent failures."""
    return mtbf_gpu_s / n


def young_daly_interval_s(t_write_s: float, mtbf_system_s: float) -> float:
    """Young-Daly optimal checkpoint interval ``sqrt(2 * T_write * MTBF_system)``."""
    return math.sqrt(2.0 * t_write_s * mtbf_system_s)


def checkpoint_overhead_fraction(interval_s: float, t_write_s: float, mtbf_system_s: float) -> float:
    """Fraction of time lost to checkpointing every ``interval_s``.

    Writing costs ``T_write / tau``; a failure loses half an interval on average, once per
    ``MTBF``: ``tau / (2 * MTBF)``. At the Young-Daly interval the two terms are equal.
    """
    return t_write_s / interval_s + interval_s / (2.0 * mtbf_system_s)


def goodput_fraction(interval_s: float, t_write_s: float, mtbf_system_s: float, restart_s: float) -> float:
    """Expected productive share of wall-clock time when the job checkpoints every ``interval_s``
    of work, each checkpoint takes ``t_write_s``, failures come at random (exponential, mean
    ``mtbf_system_s``) and each costs ``restart_s`` plus the work since the last checkpoint.

    Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
    eq. (1) without the interrupted write: a segment of ``tau`` work plus its write takes
    ``M e^(R/M) (e^((tau + w)/M) - 1)`` of wall-clock time on average. To first order in
    ``1/M`` that is ``1 - w/tau - tau/(2M) - R/M``, the overhead of
    ``checkpoint_overhead_fraction`` plus the restarts; unlike that sum it stays above 0 when
    failures come nearly as often as checkpoints (the job still progresses, slowly)."""
    m = mtbf_system_s
    x = (interval_s + t_write_s) / m
    log_expm1 = x + math.log(-math.expm1(-x)) if x > 0 else -math.inf  # log(e^x - 1), no overflow
    log_wall = math.log(m) + restart_s / m + log_expm1
    return math.exp(math.log(interval_s) - log_wall) if interval_s > 0 else 0.0


def sharded_write_time_s(total_bytes: float, nodes: int, write_bytes_per_s_per_node: float) -> float:
    """Time to write a checkpoint split evenly over ``nodes``, each writing locally in parallel."""
    return total_bytes / nodes / write_bytes_per_s_per_node


def checkpoint_bytes(params: float, weight_bytes: float, optimizer_bytes: float) -> float:
    """A resumable checkpoint: the training-precision weights and the optimizer state (fp32 master
    weights and Adam moments) of every parameter; gradients are not saved."""
    return params * (weight_bytes + optimizer_bytes)


# ---- time, cost, energy ------------------------------------------------------------------------


def wall_time_s(total_tokens: float, tokens_per_s: float, goodput: float) -> float:
    """Wall-clock time to process ``total_tokens`` at ``tokens_per_s`` while productive a
    ``goodput`` share of the time."""
    if goodput <= 0.0:
        return math.inf
    return total_tokens / tokens_per_s / goodput


def gpu_hours(wall_s: float, num_gpus: int) -> float:
    return wall_s * num_gpus / HOUR_S


def cost_usd(gpu_hours_: float, price_per_gpu_hour_usd: float) -> float:
    """GPU-hours at a price per GPU-hour (the job pays for the time lost to failures too)."""
    return gpu_hours_ * price_per_gpu_hour_usd


def board_power_w(idle_w: float, tdp_w: float, utilisation: float) -> float:
    """Board power at ``utilisation`` (0: idle, 1: running at the best achievable rate, where the
    board draws its TDP), linear in between."""
    u = min(1.0, max(0.0, utilisation))
    return idle_w + (tdp_w - idle_w) * u


def energy_mwh(wall_s: float, num_gpus: int, board_w: float, node_overhead_w: float, pue: float) -> float:
    """Facility energy: every GPU's board power plus its share of the host's, for the wall-clock
    time, times the data centre's PUE."""
    return wall_s * num_gpus * (board_w + node_overhead_w) * pue / JOULES_PER_MWH


def data_loading_bytes_per_s(tokens_per_s: float, bytes_per_token: float) -> float:
    """Read bandwidth the data pipeline must sustain: ``BW = N * eta * D_batch / T_step`` of the
    source text, which is the delivered token rate times the stored bytes per token."""
    return tokens_per_s * bytes_per_token
