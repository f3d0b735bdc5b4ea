"""Plan quality: how far the planner's best plan is from the layout experts published.

For every calibration row (``/work/shared/calibration/published_runs.json``, mapped by
``benchmarks/calibration_rows.py``) whose framework is known, plan the same job (model, batch,
GPUs, the row's stack knobs) with ``training.framework`` set to that framework, and compare the
expert layout's predicted step time (the row's stated layout, its unstated knobs at their best
fitting value, as ``benchmarks/validation.py`` scores it) with the planner's best. A ratio near 1
means the planner agrees with the experts; a large ratio is a gain the planner claims, and the
report names the cost-model term (time breakdown category) it comes from. A second ratio plans
with the expert's recompute pinned (``search.fix.recompute``, in the framework's name for it):
how much of the claim is the layout and how much the recompute technique (many published runs
predate selective recompute and ran full recompute).

    .venv/bin/python benchmarks/plan_quality.py            # table + summary, writes docs/plan_quality.md
    .venv/bin/python benchmarks/plan_quality.py --rows 10  # first 10 rows only (quick look)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.calibration_rows import MappedRow, is_torchtitan, map_all, names_deepspeed  # noqa: E402
from optimizer.errors import InvalidLayout  # noqa: E402
from optimizer.frameworks import profile  # noqa: E402
from optimizer.results import Plan  # noqa: E402
from optimizer.service import evaluate, plan  # noqa: E402
from optimizer.specs import LayoutFix, PlanRequest  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "plan_quality.md"
CLOSE = 1.05
LARGE = 1.15


def framework_of(row: dict[str, Any]) -> str | None:
    """The row's framework, from its id, source and notes (None: not known)."""
    if is_torchtitan(row):
        return "torchtitan"
    if names_deepspeed(row):
        return "deepspeed"
    text = f"{row['id']} {json.dumps(row.get('source', {}))}".lower()
    if "nemo" in text or "bridge" in text:
        return "megatron-bridge"
    if "megatron" in text:
        return "megatron-lm"
    return None


def expert_plan(mr: MappedRow) -> Plan | None:
    """The stated layout at its best fitting choice of the knobs the source left out."""
    best = None
    for layout in mr.layouts():
        try:
            p = evaluate(mr.request(layout))
        except (InvalidLayout, ValueError):
            continue
        if p.fits_memory and (best is None or p.step_time_s < best.step_time_s):
            best = p
    return best


@dataclass(frozen=True)
class Result:
    id: str
    framework: str
    expert: Plan
    best: Plan | None
    status: str
    seconds: float
    same_recompute: Plan | None = None
    """The planner's best with the expert's recompute pinned (None: the framework has no name for it)."""
    job_key: tuple[Any, ...] = ()
    """What makes two rows the same job: model, GPU type and count, precision, sequence, batch."""
    measured_tokens_per_s_per_gpu: float = 0.0
    year: int = 0
    """The year of the row's source: its stack's era (``CURRENT_STACKS``)."""
    moe: bool = False
    flagged: bool = False
    """The planner's answer warns that its best plan's MFU is above the best published."""

    @property
    def ratio(self) -> float | None:
        return None if self.best is None else self.expert.step_time_s / self.best.step_time_s

    @property
    def layout_ratio(self) -> float | None:
        p = self.same_recompute
        return None if p is None else self.expert.step_time_s / p.step_time_s

    def gain_term(self) -> str:
        """The breakdown category whose seconds drop most from the expert layout to the plan."""
        if self.best is None:
            return ""
        e, b = self.expert.time_breakdown_s.model_dump(), self.best.time_breakdown_s.model_dump()
        deltas = {k: e[k] - b[k] for k in e}
        top = sorted(deltas.items(), key=lambda kv: -kv[1])[:2]
        return ", ".join(f"{k} -{v:.3f} s" for k, v in top if v > 0)


def describe(p: Plan) -> str:
    c = p.config
    return (f"TP{c.tp} PP{c.pp} DP{c.dp} CP{c.cp} EP{c.ep} VPP{c.vpp} mbs{c.micro_batch_size} "
            f"Z{c.zero_stage} {c.recompute}")  # fmt: skip


def run(limit: int | None) -> list[Result]:
    mapped, _ = map_all()
    out = []
    for mr in mapped[:limit] if limit else mapped:
        fw = framework_of(mr.row)
        if fw is None:
            continue
        expert = expert_plan(mr)
        if expert is None:
            continue
        job = mr.job
        training = job.training.model_copy(update={"framework": fw})
        t0 = time.perf_counter()
        req = PlanRequest(model=job.model, training=training, cluster=job.cluster,
                          search={"top_k": 1, "time_limit_s": 20})  # fmt: skip
        resp = plan(req)
        best = resp.plans[0] if resp.plans else None
        seconds = time.perf_counter() - t0
        prof = profile(fw)
        own = prof.own_recompute(expert.config.recompute)
        if own is None and prof.costed_recompute(expert.config.recompute) is not None:
            own = expert.config.recompute  # the calibration's ``selective``: the framework's selective
        pinned = None
        if own is not None:
            fixed = req.model_copy(update={"search": req.search.model_copy(update={"fix": LayoutFix(recompute=own)})})
            pinned_resp = plan(fixed)
            pinned = pinned_resp.plans[0] if pinned_resp.plans else None
        flagged = any("above the best published" in w for w in resp.warnings)
        out.append(Result(mr.id, fw, expert, best, resp.status, seconds, pinned, job_key(mr),
                          mr.measured_tokens_per_s_per_gpu, source_year(mr.row), job.model.moe is not None,
                          flagged))  # fmt: skip
    return out


CURRENT_STACKS = 2023
"""Sources from this year on ran stacks with what the profiles offer (selective recompute,
sequence parallelism, the distributed optimizer, FlashAttention); earlier ones did not, so the
planner's layouts there use techniques their experts could not."""


def source_year(row: dict[str, Any]) -> int:
    m = re.search(r"(19|20)\d\d", str(row.get("source", {}).get("date") or ""))
    return int(m.group(0)) if m else 0


def job_key(mr: MappedRow) -> tuple[Any, ...]:
    """Rows with equal keys publish layouts of one job: the same model, GPUs, precision, sequence
    length and global batch."""
    row, t = mr.row, mr.job.training
    return (row["model"]["name"], row["hardware"]["gpu"], row["num_gpus"], t.precision, t.seq_len,
            t.global_batch_size)  # fmt: skip


def fastest_measured(results: list[Result]) -> dict[tuple[Any, ...], float]:
    """The fastest measured tokens/s a GPU of each job among ``results``."""
    top: dict[tuple[Any, ...], float] = {}
    for r in results:
        top[r.job_key] = max(top.get(r.job_key, 0.0), r.measured_tokens_per_s_per_gpu)
    return top


def best_published(results: list[Result]) -> list[Result]:
    """The rows whose layout ran fastest (measured, within 0.5%) of all the layouts published for
    their job: the layout the source recommends, not an ablation it measured as slower."""
    top = fastest_measured(results)
    return [r for r in results if r.measured_tokens_per_s_per_gpu >= 0.995 * top[r.job_key]]


def shares(results: list[Result]) -> tuple[int, int, int]:
    """(rows rated, expert layout within 5% of the optimum, planner claims above 15%)."""
    rated = [r.ratio for r in results if r.ratio is not None]
    return len(rated), sum(x <= CLOSE for x in rated), sum(x > LARGE for x in rated)


def _era_line(rated: list[Result]) -> str:
    """The shares over rows from current stacks (``CURRENT_STACKS``), plain and recompute pinned."""
    now = [r for r in rated if r.year >= CURRENT_STACKS]
    n, close, large = shares(now)
    pinned = [r.layout_ratio for r in now if r.layout_ratio is not None]
    p_close, p_large = sum(x <= CLOSE for x in pinned), sum(x > LARGE for x in pinned)
    return (
        f"Rows from {CURRENT_STACKS} on ({n}; earlier stacks lacked selective recompute, sequence parallelism "
        f"and the distributed optimizer the planner uses): within 5% {close} ({100 * close / max(n, 1):.0f}%), "
        f"claims above 15% {large} ({100 * large / max(n, 1):.0f}%); with the expert's recompute pinned "
        f"({len(pinned)} rows) {p_close} ({100 * p_close / max(len(pinned), 1):.0f}%) and {p_large} "
        f"({100 * p_large / max(len(pinned), 1):.0f}%)."
    )


def _kind_line(rated: list[Result], moe: bool) -> str:
    """Claims over the expert layouts and over the fastest measured layout of each job, for dense
    or MoE rows, and how many of the planner's answers carry the MFU warning."""
    rows = [r for r in rated if r.moe == moe and r.best is not None]
    if not rows:
        return ""
    claims = sorted(r.ratio for r in rows if r.ratio is not None)
    top = fastest_measured(rows)
    promised = sorted(r.best.tokens_per_s_per_gpu / top[r.job_key] for r in rows if r.best is not None)
    flagged = sum(r.flagged for r in rows)
    return (
        f"{'MoE' if moe else 'Dense'} rows ({len(rows)}): the planner claims a median {statistics.median(claims):.2f}x "
        f"over the expert layout (largest {claims[-1]:.2f}x); its best plan's predicted throughput over the fastest "
        f"layout measured for the job is a median {statistics.median(promised):.2f}x (largest {promised[-1]:.2f}x); "
        f"{flagged} of {len(rows)} answers warn that the best plan's MFU is above the best published (for the "
        "GPU, or for an MoE model's shape; in-sample here: each job's own runs are in those tables)."
    )


def render(results: list[Result]) -> str:
    rated = [r for r in results if r.ratio is not None]
    n, close, large = shares(results)
    jobs = best_published(results)
    j_n, j_close, j_large = shares(jobs)
    pinned = [r for r in rated if r.layout_ratio is not None]
    p_close = sum(r.layout_ratio <= CLOSE for r in pinned)  # type: ignore[operator]
    p_large = sum(r.layout_ratio > LARGE for r in pinned)  # type: ignore[operator]
    terms: dict[str, int] = {}
    for r in rated:
        if r.ratio > LARGE:  # type: ignore[operator]
            term = r.gain_term().split(" ")[0] or "-"
            terms[term] = terms.get(term, 0) + 1
    lines = [
        "# Plan quality against published layouts",
        "",
        "Generated by `benchmarks/plan_quality.py`: every calibration row whose framework is known, planned with",
        "`training.framework` set to it (the row's stack knobs kept); ratio = the expert layout's predicted step",
        "time over the planner's best (1.00: the planner agrees; above 1: the gain the planner claims).",
        "",
        f"Rows: {n}. Expert layout within 5% of the optimum: {close} ({100 * close / max(n, 1):.0f}%, target >= 60%). "
        f"Planner claims more than 15%: {large} ({100 * large / max(n, 1):.0f}%, target <= 10%).",
        "",
        f"With the expert's recompute pinned ({len(pinned)} rows): within 5% {p_close} "
        f"({100 * p_close / max(len(pinned), 1):.0f}%), claims above 15% {p_large} "
        f"({100 * p_large / max(len(pinned), 1):.0f}%).",
        "",
        f"Only the fastest published layout of each job ({j_n} rows; {n - j_n} rows are layouts their source "
        f"measured as slower than another it published for the same job: ablations such as ZeRO-3 against "
        f"3D parallelism, or CP and schedule sweeps at a fixed batch): within 5% {j_close} "
        f"({100 * j_close / max(j_n, 1):.0f}%), claims above 15% {j_large} ({100 * j_large / max(j_n, 1):.0f}%).",
        "",
        _era_line(rated),
        "",
        _kind_line(rated, moe=False),
        "",
        _kind_line(rated, moe=True),
        "",
        "Claims above 15%, by the breakdown term that falls most: "
        + ", ".join(f"{k} {v}" for k, v in sorted(terms.items(), key=lambda kv: -kv[1]))
        + ".",
        "",
        "Rows marked `*` are their job's fastest published layout.",
        "",
        "| row | framework | expert layout | planner's best | ratio | same recompute | gain from (breakdown deltas) |",
        "|---|---|---|---|---:|---:|---|",
    ]
    fastest = {id(r) for r in jobs}
    for r in results:
        best = describe(r.best) if r.best else f"none ({r.status})"
        mark = "*" if id(r) in fastest else ""
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        term = r.gain_term() if r.ratio is not None and r.ratio > CLOSE else ""
        same = f"{r.layout_ratio:.3f}" if r.layout_ratio is not None else "-"
        lines.append(f"| {r.id}{mark} | {r.framework} | {describe(r.expert)} | {best} | {ratio} | {same} | {term} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="only the first N mapped rows")
    ap.add_argument("--markdown", type=Path, default=DOC)
    args = ap.parse_args(argv)
    results = run(args.rows)
    text = render(results)
    print(text)
    if args.rows is None:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
