"""``pplan sweep FILE``: a POST /sweeps document planned on local processes, with a progress bar
(rich) and the Pareto front as a table."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from api.cli_args import EXIT_NO_ANSWER, EXIT_OK, write_output
from api.settings import MIB, Settings
from api.sweep_manager import SweepManager
from api.sweeps import limited_points, validated_points
from optimizer.capacity.sweep import SweepRequest, SweepStatus
from optimizer.job_warnings import MFU_OPENING, split_mfu_warning

POLL_S = 0.2
TABLE_WIDTH = 140
"""Columns of the table when standard output is not a terminal."""


def run(document: dict, workers: int | None, show_progress: bool = True) -> SweepStatus:
    """Plan every point of ``document`` (a POST /sweeps body) and return the finished sweep."""
    request = SweepRequest.model_validate(document)
    settings = Settings()  # the limits POST /sweeps applies: points, and each point's time limit
    jobs, warnings = limited_points(validated_points(request, settings.max_sweep_points), settings)
    manager = SweepManager(
        workers=workers or os.cpu_count() or 1, max_running=1, space_memory_bytes=settings.search_memory_mib * MIB
    )
    try:
        sweep_id = manager.start(jobs, warnings)
        columns = (TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), disable=not show_progress) as bar:
            task = bar.add_task("points", total=len(jobs))
            while True:
                status = manager.status(sweep_id)
                assert status is not None
                bar.update(task, completed=status.done)
                if status.status != "running":
                    return status
                time.sleep(POLL_S)
    finally:
        manager.close()


def pareto_table(status: SweepStatus) -> Table:
    table = Table(title=f"Pareto front: {len(status.pareto)} of {status.total} points")
    for header in ("point", "GPUs", "tokens/s", "goodput tokens/s", "days", "cost USD", "USD / M tokens"):
        table.add_column(header, justify="left" if header == "point" else "right")

    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for e in status.pareto:
        table.add_row(
            point_name(e.point),
            f"{e.num_gpus:,}",
            num(e.tokens_per_s, ",.0f"),
            num(e.goodput_tokens_per_s, ",.0f"),
            num(e.time_to_train_days, ",.1f"),
            num(e.cost_usd, ",.0f"),
            num(e.usd_per_million_tokens, ".3f"),
        )
    return table


def point_name(point: dict) -> str:
    """A sweep point as its varied values: ``num_gpus=16, cluster=dgx-h100``."""
    return ", ".join(f"{k}={v}" for k, v in point.items())


def sweep_warnings(status: SweepStatus) -> list[str]:
    """The sweep's warnings, then each point's, the point named (a warning several points share
    once, with the first of them); the MFU warnings of several points as one line, with the
    points and the range of their MFUs, where the first of them was."""
    lines = list(status.warnings)
    seen: set[str] = set(status.warnings)
    mfu: dict[str, tuple[int, list[str], list[float]]] = {}  # rest of the warning -> line, points, MFUs
    for result in status.results:
        for w in result.warnings:
            split = split_mfu_warning(w)
            if split is not None:
                value, rest = split
                if rest not in mfu:
                    mfu[rest] = (len(lines), [], [])
                    lines.append("")
                mfu[rest][1].append(point_name(result.point))
                mfu[rest][2].append(value)
            elif w not in seen:
                seen.add(w)
                lines.append(f"{point_name(result.point)}: {w}")
    for rest, (i, points, values) in mfu.items():
        low, high = min(values), max(values)
        span = f"{low:.1f}%" if low == high else f"{low:.1f}-{high:.1f}%"
        lines[i] = f"{'; '.join(points)}: {MFU_OPENING} {span} {rest}"
    return lines


def command(args: argparse.Namespace, document: dict) -> int:
    """The ``sweep`` subcommand; exit code 0, 2 for an invalid point, or 4 when no point was
    planned (every one infeasible, timed out or failed: stderr says why for each)."""
    status = run(document, args.workers, show_progress=not args.quiet)  # a bad point: RequestValidationError
    if args.format == "table":
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else TABLE_WIDTH
        console = Console(width=width, record=True, file=io.StringIO())  # written at once: write_output
        console.print(pareto_table(status))
        for line in sweep_warnings(status):
            console.print(f"warning: {line}", markup=False, highlight=False)
        write_output(console.export_text(styles=sys.stdout.isatty()))
    else:
        data = status.model_dump(mode="json")
        write_output(
            json.dumps(data, indent=2) + "\n"
            if args.format == "json"
            else yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        )
    if not any(r.status == "done" for r in status.results):
        for r in status.results:
            sys.stderr.write(f"pplan: sweep point {point_name(r.point)}: {r.status}: {r.explanation or ''}\n")
        return EXIT_NO_ANSWER
    return EXIT_OK
