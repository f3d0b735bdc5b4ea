"""Sweeps: one /plan job planned at every point of a grid (GPU counts, cluster presets, batch
sizes, sequence lengths), and the Pareto front of the answers. The grid's points run through
``service.plan`` like any request; running them in parallel is the caller's business (the HTTP
service and the CLI use a process pool, ``api.sweeps``)."""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from optimizer.capacity.formulas import HOUR_S
from optimizer.errors import InvalidLayout
from optimizer.reference import current
from optimizer.results import Plan
from optimizer.search.fixed_values import check_named_values, framework_error
from optimizer.specs import MAX_NUM_GPUS, ClusterSpec, PlanRequest, SearchSpec
from optimizer.strict_model import Strict, error_reason
from optimizer.topology_spec import ClusterTopology

VARY_KEYS: tuple[str, ...] = ("num_gpus", "cluster", "global_batch_size", "seq_len")
"""The grid's axes, in the order points are enumerated (the last varies fastest)."""

PointStatus = Literal["pending", "done", "infeasible", "timed_out", "failed", "cancelled"]
SweepState = Literal["running", "done", "cancelled", "failed"]


GpuCount = Annotated[int, Field(ge=1, le=MAX_NUM_GPUS)]
BatchCount = Annotated[int, Field(ge=1, le=1 << 24)]
SeqCount = Annotated[int, Field(ge=1, le=4_194_304)]
"""Grid values of the counting axes, bounded as ``cluster.num_gpus``, ``training.global_batch_size``
and ``training.seq_len`` are (a bad one is a 422 at its index)."""


class SweepVary(Strict):
    """Values per axis; the points are the product of the axes given."""

    num_gpus: list[GpuCount] | None = Field(default=None, min_length=1, max_length=4096, description="GPU counts.")
    cluster: list[str] | None = Field(default=None, min_length=1, max_length=64, description="Cluster preset ids.")
    global_batch_size: list[BatchCount] | None = Field(
        default=None, min_length=1, max_length=4096, description="Global batch sizes (sequences per step)."
    )
    seq_len: list[SeqCount] | None = Field(
        default=None, min_length=1, max_length=4096, description="Sequence lengths (tokens)."
    )

    @model_validator(mode="after")
    def _check(self) -> SweepVary:
        given = [k for k in VARY_KEYS if getattr(self, k) is not None]
        if not given:
            raise ValueError(f"vary needs at least one of {', '.join(VARY_KEYS)}")
        for key in given:
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"vary.{key} repeats values")
        return self


MAX_SWEEP_NODE_ENTRIES = 131_072
"""Points x topology nodes a sweep may hold (each point's plan keeps its assignment, about 700
bytes a node in memory): 8 points on 16,384 nodes, 128 on 1,024."""


class SweepRequest(Strict):
    """``job``: a /plan request; ``vary``: the grid."""

    job: dict[str, Any] = Field(description="A POST /plan request body.")
    vary: SweepVary = Field(description="The grid: values per axis; points are their product.")

    def node_entries_problem(self) -> str | None:
        """Why the sweep would keep too many node assignments (``MAX_SWEEP_NODE_ENTRIES``), or None."""
        cluster = self.job.get("cluster") or {}
        topology = cluster.get("topology")
        nodes = topology.get("nodes") if isinstance(topology, dict) else None
        if not isinstance(nodes, list):
            return None
        gpus = max(self.vary.num_gpus) if self.vary.num_gpus else cluster.get("num_gpus")
        used = min(len(nodes), gpus) if isinstance(gpus, int) and gpus > 0 else len(nodes)  # one GPU a node at most
        total = self.num_points()
        if total * used <= MAX_SWEEP_NODE_ENTRIES:
            return None
        return (
            f"{total} points on up to {used:,} of the {len(nodes):,} nodes each: each point's plan keeps its node "
            f"assignment, and a sweep keeps at most {MAX_SWEEP_NODE_ENTRIES:,} (points x nodes)"
        )

    @field_validator("job")
    @classmethod
    def _sections(cls, job: dict[str, Any]) -> dict[str, Any]:
        """Each section the job gives is an object; its ``search`` is a valid one that asks for
        each point's best plan only (``top_k`` 1, no suggestions: what a sweep computes)."""
        for section in PlanRequest.model_fields:  # every section of a /plan body is an object
            if section in job and not isinstance(job[section], dict):
                raise ValueError(f"job.{section}: must be an object, not {type(job[section]).__name__}")
        search = job.get("search")
        if search is not None:
            try:
                SearchSpec.model_validate(search)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"job.search.{where}: {error_reason(first)}") from None
            for knob, only in (("top_k", 1), ("suggest", False)):
                if search.get(knob, only) != only:
                    raise ValueError(f"job.search.{knob}: a sweep plans each point's best plan only ({knob} {only})")
        return job

    @model_validator(mode="after")
    def _comparable(self) -> SweepRequest:
        """The points' budgets and prices mean the same thing at every point."""
        problem = budget_problem(self.job, self.vary) or price_problem(self.job, self.vary)
        if problem:
            raise ValueError(problem)
        return self

    def num_points(self) -> int:
        return math.prod(len(getattr(self.vary, k)) for k in VARY_KEYS if getattr(self.vary, k) is not None)


def budget_problem(job: dict[str, Any], vary: SweepVary) -> str | None:
    """A step budget over points whose steps hold different token counts (batch or sequence
    length varied, the batch not given in tokens): each point would train a different amount."""
    training = job.get("training") or {}
    if training.get("total_steps") is None:
        return None
    varied = vary.global_batch_size is not None or (vary.seq_len is not None and "global_batch_tokens" not in training)
    if not varied:
        return None
    return (
        "job.training.total_steps: a step holds a different number of tokens at each point of "
        "vary.global_batch_size / vary.seq_len, so the points would train different amounts; give the "
        "budget as training.total_tokens"
    )


def price_problem(job: dict[str, Any], vary: SweepVary) -> str | None:
    """One ``costs.price_per_gpu_hour_usd`` for points on different GPUs: it would bill them all
    alike (``costs.price_per_gpu_hour_usd_by_gpu`` prices each)."""
    costs = job.get("costs") or {}
    cluster = job.get("cluster") or {}
    if costs.get("price_per_gpu_hour_usd") is None or vary.cluster is None or cluster.get("gpu") is not None:
        return None
    presets = current().catalog.clusters
    gpus = {presets[c].gpu for c in vary.cluster if c in presets}
    by_gpu = costs.get("price_per_gpu_hour_usd_by_gpu") or {}
    if not isinstance(by_gpu, dict):
        return None  # not a map: every point's validation names it
    unpriced = sorted(gpus - set(by_gpu))
    if len(unpriced) <= 1:
        return None
    return (
        f"job.costs.price_per_gpu_hour_usd: one price would bill every GPU of vary.cluster alike "
        f"({', '.join(unpriced)}); give costs.price_per_gpu_hour_usd_by_gpu (USD per GPU-hour by GPU id), or "
        "leave the price out for the catalog's"
    )


class PointError(ValueError):
    """A point of the grid is not a valid /plan request; ``loc`` and ``errors`` say where
    (``point`` empty: a part of the job every point shares)."""

    def __init__(self, point: dict[str, Any], errors: list[ErrorDetails]) -> None:
        self.point = point
        self.errors = errors
        first = errors[0] if errors else None
        where = f"job.{'.'.join(str(p) for p in first['loc'])}: " if first and first["loc"] else ""
        reason = f"{where}{error_reason(first) if first else 'invalid'}"
        super().__init__(f"point {point}: {reason}" if point else reason)


def points(vary: SweepVary) -> list[dict[str, Any]]:
    """Every point of the grid, as ``{axis: value}`` for the axes given."""
    keys = [k for k in VARY_KEYS if getattr(vary, k) is not None]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(getattr(vary, k) for k in keys))]


def point_job(job: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    """``job`` with the point's values set: ``cluster`` replaces the preset (explicit cluster
    fields of the job still override it), ``global_batch_size`` replaces the batch, ``seq_len``
    keeps ``global_batch_tokens`` when the job gives the batch in tokens. Each point asks for its
    best plan only (top_k 1, no suggestions). The sections it changes are copied; the rest is
    shared with ``job``."""
    out = dict(job)
    cluster = out["cluster"] = dict(job.get("cluster") or {})
    training = out["training"] = dict(job.get("training") or {})
    if "cluster" in point:
        cluster["preset"] = point["cluster"]
    if "num_gpus" in point:
        cluster["num_gpus"] = point["num_gpus"]
    if "global_batch_size" in point:
        training["global_batch_size"] = point["global_batch_size"]
        training.pop("global_batch_tokens", None)
    if "seq_len" in point:
        training["seq_len"] = point["seq_len"]
        if "global_batch_tokens" in training:
            training.pop("global_batch_size", None)
    out["search"] = {**(job.get("search") or {}), "top_k": 1, "suggest": False}
    return out


def with_topology_validated(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` with its ``cluster.topology`` (the same for every point, and the bulk of a large
    request) validated once, as the model the points then share. Raises ``PointError`` when it
    is invalid."""
    cluster = job.get("cluster") or {}
    topology = cluster.get("topology")
    if not isinstance(topology, dict):
        return job
    try:
        validated = ClusterTopology.model_validate(topology)
    except ValidationError as exc:
        errors = [{**e, "loc": ("cluster", "topology", *e["loc"])} for e in exc.errors(include_url=False)]
        raise PointError({}, errors) from exc  # type: ignore[arg-type]
    return {**job, "cluster": {**cluster, "topology": validated}}


def point_requests(request: SweepRequest) -> list[tuple[dict[str, Any], PlanRequest]]:
    """Each point with its validated /plan request. Raises ``PointError`` for the first invalid one.
    What the search refuses at one point only (a pin no layout of its GPU count takes, a seq_len
    the named framework does not split, a precision its GPU lacks) is that point's answer:
    ``infeasible``, with the reason."""
    out = []
    job = with_topology_validated(request.job)
    for point in points(request.vary):
        try:
            out.append((point, PlanRequest.model_validate(point_job(job, point))))
        except ValidationError as exc:
            raise PointError(point, exc.errors(include_url=False)) from exc
    return out


def pin_invalid_at_every_point(requests: list[PlanRequest]) -> InvalidLayout | None:
    """A ``search.fix`` / ``search.allow`` value no layout can take at any point of the grid (what
    ``/plan`` refuses with a 422 before searching), else None: one that holds at some points only
    is those points' ``infeasible`` answer, as is any pin of a topology job that chooses its GPU count."""
    framework = [framework_error(req.job_spec()) for req in requests]
    if all(framework):  # the named framework runs the model at no point, whatever the GPU count
        return framework[0]
    first: InvalidLayout | None = None
    for req in requests:
        if req.cluster.num_gpus is None:  # a topology job that chooses its count: checked per count
            return None
        try:
            check_named_values(req.job_spec(), req.search)
        except InvalidLayout as exc:
            first = first or exc
        else:
            return None
    return first


def cluster_value_to_blame(request: SweepRequest, point: dict[str, Any]) -> bool:
    """Whether the point's ``vary.cluster`` value, not the job's own cluster fields, makes its
    cluster invalid: the preset is invalid with the job's cluster fields left out, or another
    known preset of the axis is valid with them. Judged on the cluster fields alone (errors of
    other sections, and the topology, validated once for the whole sweep, left out)."""
    fields = {k: v for k, v in (request.job.get("cluster") or {}).items() if k != "topology"}
    fields["num_gpus"] = point.get("num_gpus", fields.get("num_gpus")) or 8  # a topology's count: any
    if not _cluster_valid({"preset": point["cluster"], "num_gpus": fields["num_gpus"]}):
        return True
    known = current().catalog.clusters
    others = [c for c in request.vary.cluster or [] if c != point["cluster"] and c in known]
    return any(_cluster_valid({**fields, "preset": c}) for c in others)


def _cluster_valid(cluster: dict[str, Any]) -> bool:
    """Whether ``cluster`` raises no error of its own in a request (other sections' left out)."""
    try:
        ClusterSpec.model_validate(cluster)
    except ValidationError:
        return False
    return True


class PointResult(Strict):
    point: dict[str, Any]
    status: PointStatus
    plan: Plan | None = None
    explanation: str | None = Field(
        default=None, description="Why no plan: infeasible job, time limit run out (timed_out), or the error."
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What POST /plan warns about this point (e.g. a predicted MFU above the best published).",
    )


class ParetoPoint(Strict):
    """A non-dominated point: no other point is at least as good on every criterion and better on one."""

    index: int = Field(description="Position in results.")
    point: dict[str, Any]
    num_gpus: int
    tokens_per_s: float
    goodput_tokens_per_s: float = Field(description="tokens_per_s x goodput.fraction.")
    time_to_train_days: float | None = None
    cost_usd: float | None = None
    usd_per_million_tokens: float | None = Field(default=None, description="At the catalog (or given) price.")


class SweepStatus(Strict):
    id: str
    status: SweepState
    done: int = Field(description="Points finished (planned, infeasible, timed out, failed or cancelled).")
    total: int
    results: list[PointResult]
    warnings: list[str] = Field(
        default_factory=list, description="What applies to every point (a time limit clamped to the server's)."
    )
    pareto: list[ParetoPoint] = Field(
        description=(
            "Non-dominated points with goodput above 0 over speed (time_to_train_days, shorter; without a token budget "
            "goodput_tokens_per_s, more) and cost (cost_usd, or usd_per_million_tokens without a budget; the GPU "
            "count stands in when some point has no price), fastest first."
        )
    )


def plan_gpus(plan: Plan) -> int:
    """The GPUs a point's plan runs on (``tp x pp x dp x cp``)."""
    c = plan.config
    return c.tp * c.pp * (c.dp or 1) * c.cp


def _pareto_entry(index: int, result: PointResult, price: float | None) -> ParetoPoint:
    plan = result.plan
    assert plan is not None and plan.goodput is not None
    n = plan_gpus(plan)
    ttt = plan.time_to_train
    rate = plan.goodput.tokens_per_s
    per_million = None if price is None or rate <= 0 else price * n / HOUR_S / rate * 1e6
    return ParetoPoint(
        index=index,
        point=result.point,
        num_gpus=n,
        tokens_per_s=plan.tokens_per_s,
        goodput_tokens_per_s=rate,
        time_to_train_days=ttt.days if ttt else None,
        cost_usd=ttt.cost_usd if ttt else None,
        usd_per_million_tokens=per_million,
    )


def pareto_front(results: list[PointResult], prices: list[float | None]) -> list[ParetoPoint]:
    """The non-dominated points among the planned ones (``prices``: per result, USD per GPU-hour)."""
    entries = [_pareto_entry(i, r, prices[i]) for i, r in enumerate(results) if r.status == "done" and r.plan]
    entries = [e for e in entries if e.goodput_tokens_per_s > 0]  # goodput 0 (its note says why) trains nothing
    if not entries:
        return []
    with_days = all(e.time_to_train_days is not None for e in entries)
    cost_key = "cost_usd" if all(e.cost_usd is not None for e in entries) else "usd_per_million_tokens"
    with_cost = all(getattr(e, cost_key) is not None for e in entries)

    def criteria(e: ParetoPoint) -> tuple[float, float]:
        speed = e.time_to_train_days if with_days else -e.goodput_tokens_per_s
        return (speed, getattr(e, cost_key) if with_cost else e.num_gpus)  # type: ignore[return-value]

    keys = [criteria(e) for e in entries]

    def dominated(k: tuple[float, ...]) -> bool:
        return any(all(a <= b for a, b in zip(o, k, strict=True)) and o != k for o in keys)

    front = [(k, e) for e, k in zip(entries, keys, strict=True) if not dominated(k)]
    return [e for _, e in sorted(front, key=lambda ke: ke[0])]
