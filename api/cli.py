"""The ``pplan`` command: serve the API, or plan / evaluate / list catalogs without HTTP.

``plan`` and ``evaluate`` read the same request documents as POST /plan and POST /evaluate
(JSON or YAML), validate them with the same request models and call the same service
functions. Exit codes (api/cli_args.py): 0 ok, 1 output not written, 2 invalid input, 3 infeasible job, 4 no answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api import sweep_cli
from api.catalog import catalog_items
from api.catalog_table import catalog_entries, catalog_table
from api.cli_args import (
    EXIT_INFEASIBLE,
    EXIT_INVALID,
    EXIT_NO_ANSWER,
    EXIT_OK,
    EXIT_OUTPUT,
    MAX_SWEEP_WORKERS,
    FlagError,
    OutputError,
    positive_int,
    serve_settings,
    sweep_workers,
    write_output,
)
from api.documents import DocumentError, parse_json, parse_yaml, read_text
from api.errors import FIELD_PATH, JOB_SECTIONS, validation_items
from api.plan_rows import plan_headers, plan_row, table, with_etp
from api.planning import apply_search_limits
from api.settings import MIB, Settings, settings_message
from api.topology_cli import add_topology_commands
from optimizer import service
from optimizer.errors import InvalidLayout, PlannerError
from optimizer.results import CompareResponse, Plan, PlanResponse
from optimizer.search import space_memory_budget
from optimizer.specs import CompareRequest, EvaluateRequest, PlanRequest

FORMATS = ("json", "yaml", "table")
CATALOGS = ("gpus", "networks", "clusters", "models")


class InputError(Exception):
    """The request file cannot be read or parsed (exit code 2)."""


# --------------------------------------------------------------------------- input


def load_document(path: str) -> dict[str, Any]:
    """A request document from a JSON or YAML file (``-``: standard input).

    The format follows the extension (``.json``, ``.yaml``, ``.yml``); otherwise JSON is tried
    first, then YAML.

    Raises:
        InputError: unreadable file, a syntax error, or a document that is not a mapping.
    """
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    except DocumentError as exc:
        raise InputError(f"cannot parse {path}: {exc}") from exc
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".json":
            data = parse_json(text)
        elif suffix in (".yaml", ".yml"):
            data = parse_yaml(text)
        else:
            try:
                data = parse_json(text)
            except DocumentError as json_error:
                try:
                    data = parse_yaml(text)
                except DocumentError:
                    if text.lstrip().startswith(("{", "[")):  # it looks like JSON: the JSON error
                        raise json_error from None
                    raise
    except DocumentError as exc:
        raise InputError(f"cannot parse {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a request document (a mapping), got {type(data).__name__}")
    return data


def _validation_message(exc: ValidationError, path: str) -> str:
    lines = [f"{path}: invalid request"]
    for item in validation_items(exc.errors()):
        loc, msg = ".".join(str(part) for part in item["loc"]), item["msg"]
        named = FIELD_PATH.match(msg)  # a cross-field check's message starts with its field
        if named is not None and (not loc or loc.endswith(named.group(1)) or named.group(1).endswith(loc)):
            loc, msg = named.group(1) if len(named.group(1)) > len(loc) else loc, msg[named.end() :]
        lines.append(f"  {loc or '(document)'}: {msg}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- output


def _dump(data: Any, fmt: str) -> str:
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return json.dumps(data, indent=2) + "\n"


def plan_table(response: PlanResponse) -> str:
    """A ranked table of the plans, with the solver status and any explanation or warnings."""
    solver = response.solver
    head = f"status: {response.status}  solver: {solver.engine}, {solver.wall_time_s:.2f} s"
    if solver.proved_optimal:
        head += ", proved optimal"
    parts = [head + "\n"]
    if response.plans:
        etp = with_etp(response.plans)
        parts.append(table(plan_headers(etp), [plan_row(i, p, etp) for i, p in enumerate(response.plans, start=1)]))
    if response.plans and response.plans[0].assignment is not None:
        a = response.plans[0].assignment
        parts.append(f"nodes (plan 1, rank order): {' '.join(a.nodes)}\nslurm: {a.slurm.sbatch}\n")
    if response.explanation:
        parts.append(f"explanation: {response.explanation}\n")
    for rank, p in enumerate(response.plans, start=1):
        parts.extend(f"plan {rank} note: {n}\n" for n in p.notes)
    parts.extend(f"warning: {w}\n" for w in response.warnings)
    if response.plans and response.plans[0].goodput is not None:
        parts.append(_capacity_line(response.plans[0]))
    parts.extend(
        f"suggestion: {s.num_gpus:,} GPUs, {s.tokens_per_s:,.0f} tokens/s: {s.reason}\n" for s in response.suggestions
    )
    return "".join(parts)


def compare_table(response: CompareResponse) -> str:
    """One row per compared layout (index 0 is the reference) with its step-time delta, then
    each layout's summary of what differs, its notes and the warnings."""
    etp = with_etp([e.plan for e in response.entries])
    headers = ("layout", *plan_headers(etp)[1:], "delta_s")
    rows = [[*plan_row(i, e.plan, etp), f"{e.step_time_delta_s:+.3f}"] for i, e in enumerate(response.entries)]
    parts = [table(headers, rows)]
    parts.extend(f"{e.summary}\n" for e in response.entries)
    for i, e in enumerate(response.entries):
        parts.extend(f"layout {i} note: {n}\n" for n in e.plan.notes)
    parts.extend(f"warning: {w}\n" for w in response.warnings)
    return "".join(parts)


def _capacity_line(plan: Plan) -> str:
    """Goodput (and time to train) of the best plan, on one line."""
    g = plan.goodput
    assert g is not None
    line = (
        f"best plan: checkpoint {g.checkpoint_bytes / 1e12:,.2f} TB every {g.checkpoint_interval_steps:,} steps, "
        f"goodput {g.fraction:.1%}"
    )
    t = plan.time_to_train
    if t is not None:
        cost = "" if t.cost_usd is None else f", {t.cost_usd:,.0f} USD"
        line += f"; {t.days:,.1f} days, {t.gpu_hours:,.0f} GPU-hours{cost}, {t.energy_mwh:,.0f} MWh"
    return line + "\n"


def evaluate_table(plan: Plan) -> str:
    """One-row table of an evaluated layout, then its time and memory breakdowns."""
    etp = with_etp([plan])
    parts = [table(plan_headers(etp)[1:], [plan_row(1, plan, etp)[1:]])]  # one layout: no rank
    times = plan.time_breakdown_s.model_dump()
    parts.append("time_s: " + "  ".join(f"{k}={v:.3f}" for k, v in times.items()) + "\n")
    mem = plan.memory_gib
    parts.append(
        f"memory_gib: weights={mem.weights:.1f}  gradients={mem.gradients:.1f}  "
        f"optimizer={mem.optimizer:.1f}  "
        f"activations={mem.activations:.1f}  buffers={mem.buffers:.1f}  "
        f"optimizer_step={mem.optimizer_step:.1f}  total={mem.total:.1f}  "
        f"capacity={mem.capacity:.1f}  headroom={mem.headroom:.1f}  usable={mem.usable:.1f}\n"
    )
    parts.append(f"tokens/s: {plan.tokens_per_s:,.0f}  model TFLOP/s per GPU: {plan.model_tflops_per_gpu:.1f}\n")
    if plan.tokens_per_s_per_gpu_range and plan.step_time_s_range:
        (t_lo, t_hi), (s_lo, s_hi) = plan.tokens_per_s_per_gpu_range, plan.step_time_s_range
        parts.append(f"80% range: tokens/s per GPU {t_lo:,.0f} - {t_hi:,.0f}  step_s {s_lo:.3f} - {s_hi:.3f}\n")
    parts.extend(f"note: {n}\n" for n in plan.notes)
    return "".join(parts)


# --------------------------------------------------------------------------- commands


def _write(text: str) -> None:
    write_output(text)


def _error(text: str) -> None:
    sys.stderr.write(f"pplan: {text}\n")


def _cmd_plan(args: argparse.Namespace) -> int:
    request = PlanRequest.model_validate(load_document(args.file))
    settings = Settings()
    request, warnings = apply_search_limits(request, settings)
    with space_memory_budget(settings.search_memory_mib * MIB):  # as /plan
        response = service.plan(request)
    if warnings:
        response = response.model_copy(update={"warnings": [*warnings, *response.warnings]})
    if args.format == "table":
        _write(plan_table(response))
    else:
        _write(_dump(response.model_dump(mode="json"), args.format))
    if response.status == "infeasible":
        _error(f"infeasible: {response.explanation or 'no layout satisfies the constraints'}")
        return EXIT_INFEASIBLE
    if not response.plans:
        _error(f"no plan: {response.explanation or 'none found within search.time_limit_s'}")
        return EXIT_NO_ANSWER
    return EXIT_OK


def _cmd_evaluate(args: argparse.Namespace) -> int:
    request = EvaluateRequest.model_validate(load_document(args.file))
    result = service.evaluate(request)
    if args.format == "table":
        _write(evaluate_table(result))
    else:
        _write(_dump(result.model_dump(mode="json"), args.format))
    return EXIT_OK


def _cmd_compare(args: argparse.Namespace) -> int:
    request = CompareRequest.model_validate(load_document(args.file))
    result = service.compare(request)
    if args.format == "table":
        _write(compare_table(result))
    else:
        _write(_dump(result.model_dump(mode="json"), args.format))
    return EXIT_OK


def _cmd_catalog(args: argparse.Namespace) -> int:
    if args.format == "table":
        _write(catalog_table(args.which))
    else:
        _write(_dump(catalog_items(catalog_entries(args.which)), args.format))
    return EXIT_OK


def _cmd_sweep(args: argparse.Namespace) -> int:
    return sweep_cli.command(args, load_document(args.file))


def _cmd_serve(args: argparse.Namespace) -> int:
    from api.server import serve  # only needed to serve

    try:
        settings = serve_settings(args.host, args.port, args.workers)
    except FlagError as exc:
        raise InputError(str(exc)) from None
    serve(settings)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pplan",
        description="Plan and score parallel layouts for large-model training.",
        epilog="exit codes: 0 ok, 1 output not written, 2 invalid input, 3 infeasible job, 4 no plan in the time limit (or no sweep point planned)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--format", "-f", choices=FORMATS, default="json", help="output format (default: json)")

    serve = sub.add_parser("serve", help="run the HTTP API (settings from PPLAN_* variables)")
    serve.add_argument("--host", help="bind address (default: PPLAN_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: PPLAN_PORT or 8000)")
    serve.add_argument("--workers", type=positive_int, help="worker processes (default: PPLAN_WORKERS or 1)")
    serve.set_defaults(handler=_cmd_serve)

    plan = sub.add_parser("plan", parents=[output], help="search ranked layouts (a POST /plan document)")
    plan.add_argument("file", metavar="FILE", help="request as JSON or YAML; - reads standard input")
    plan.set_defaults(handler=_cmd_plan)

    evaluate = sub.add_parser("evaluate", parents=[output], help="score one layout (a POST /evaluate document)")
    evaluate.add_argument("file", metavar="FILE", help="request as JSON or YAML; - reads standard input")
    evaluate.set_defaults(handler=_cmd_evaluate)

    sweep = sub.add_parser(
        "sweep", parents=[output], help="plan a job over a grid with a progress bar (a POST /sweeps document)"
    )
    sweep.add_argument("file", metavar="FILE", help="request as JSON or YAML; - reads standard input")
    sweep.add_argument(
        "--workers", type=sweep_workers, help=f"processes that plan points, 1-{MAX_SWEEP_WORKERS} (default: CPU count)"
    )
    sweep.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    sweep.set_defaults(handler=_cmd_sweep)
    compare = sub.add_parser(
        "compare", parents=[output], help="score a job under several layouts (a POST /compare document)"
    )
    compare.add_argument("file", metavar="FILE", help="request as JSON or YAML; - reads standard input")
    compare.set_defaults(handler=_cmd_compare)

    catalog = sub.add_parser("catalog", parents=[output], help="list a catalog")
    catalog.add_argument("which", choices=CATALOGS)
    catalog.set_defaults(handler=_cmd_catalog)
    add_topology_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pplan``; returns the exit code."""
    args = build_parser().parse_args(argv)
    source = getattr(args, "file", None) or ("PPLAN_* settings" if args.command == "serve" else args.command)
    if sys.stdout is None:  # started with standard output closed (``>&-``)
        _error("standard output is closed")
        return EXIT_OUTPUT
    try:
        code: int = args.handler(args)
    except OutputError as exc:  # a reader that left (``| head``), a full disk
        _error(f"could not write the output: {exc}")
        with contextlib.suppress(OSError, ValueError):  # a stream without a descriptor has none to mend
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return EXIT_OUTPUT
    except OSError as exc:  # the system refused a resource (open files, processes)
        _error(f"{source}: {exc.strerror or exc}")
        return EXIT_OUTPUT
    except InputError as exc:
        _error(str(exc))
        return EXIT_INVALID
    except ValidationError as exc:
        _error(settings_message(exc) if exc.title == Settings.__name__ else _validation_message(exc, source))
        return EXIT_INVALID
    except InvalidLayout as exc:
        first = exc.field.split(".")[0]
        under_config = args.command == "evaluate" and first != "config" and first not in JOB_SECTIONS
        field = f"config.{exc.field}" if under_config else exc.field  # as layout_error locates it
        _error(f"{source}: invalid layout: {field}: {exc.reason}")
        return EXIT_INVALID
    except PlannerError as exc:
        _error(f"{source}: {exc}")
        return EXIT_INVALID
    except RequestValidationError as exc:  # a server limit (apply_search_limits)
        item = validation_items(exc.errors())[0]
        _error(f"{source}: {'.'.join(str(p) for p in item['loc'][1:])}: {item['msg']}")
        return EXIT_INVALID
    except RecursionError:  # a safety net behind the document depth limit
        _error(f"{source}: the document is nested too deep")
        return EXIT_INVALID
    return code


if __name__ == "__main__":
    sys.exit(main())
