"""The rows and columns of the CLI's plan tables (``pplan plan``, ``evaluate``, ``compare``)."""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.results import Plan


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines) + "\n"


PLAN_HEADERS = (
    "rank", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "zero", "recompute",
    "placement", "step_s", "mfu", "mem_gib", "bottleneck",
)  # fmt: skip


def with_etp(plans: Sequence[Plan]) -> bool:
    """Whether a table shows the expert tensor-parallel column: some plan splits experts."""
    return any(p.config.etp > 1 for p in plans)


def plan_headers(etp: bool) -> tuple[str, ...]:
    """``PLAN_HEADERS``, with ``etp`` after ``ep`` when ``etp``."""
    return (*PLAN_HEADERS[:6], "etp", *PLAN_HEADERS[6:]) if etp else PLAN_HEADERS


def placement(plan: Plan) -> str:
    degrees = plan.config.model_dump()
    shown = [f"{axis}:{tier}" for axis, tier in plan.placement.items() if (degrees.get(axis) or 1) > 1]
    return " ".join(shown) or "-"


def plan_row(rank: int, plan: Plan, etp: bool = False) -> list[object]:
    """One table row (``etp``: with the expert tensor-parallel column after ``ep``)."""
    c, mem = plan.config, plan.memory_gib
    memory = f"{mem.total:.1f}/{mem.usable:.1f}" + ("" if plan.fits_memory else " OOM")
    return [
        rank, c.tp, c.pp, c.dp if c.dp is not None else "-", c.cp, c.ep, *([c.etp] if etp else []), c.vpp,
        c.micro_batch_size, c.zero_stage, c.recompute, placement(plan), f"{plan.step_time_s:.3f}",
        f"{plan.mfu:.1%}", memory, plan.bottleneck,
    ]  # fmt: skip
