"""CP-SAT model: pick a layout among the surviving candidates jointly with its layer split.

Variables: one boolean per candidate (layout + rank order from the exact enumeration), and for
pipelined candidates an integer layer count per pipeline chunk. Constraints: exactly one
candidate; the chunk counts sum to the model's layers; per-stage memory (static bytes per layer +
in-flight activations per layer + the stage's constants) within capacity; the slowest-stage
time bounds every stage. Objective: ``steady_coefficient * slowest stage + other time``.
All coefficients come from ``optimizer.cost.estimate.split_tables`` (the cost model), scaled to
integers per request; every answer is re-scored with the float cost model afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from optimizer.cost.estimate import Estimate, SplitTables

OBJECTIVE_UNITS = 1_000_000
"""The best known step time maps to this many objective units (per-request scale)."""
MEMORY_UNIT_BYTES = 2**20  # MiB


@dataclass(frozen=True)
class Candidate:
    estimate: Estimate
    tables: SplitTables
    capacity_bytes: float
    num_layers: int


@dataclass(frozen=True)
class Choice:
    index: int
    stage_layers: tuple[int, ...]
    objective_s: float


@dataclass(frozen=True)
class SolveResult:
    choice: Choice | None
    status: str
    bound_s: float | None


class SplitModel:
    """One CP-SAT model over the candidates; ``solve`` can be called repeatedly with exclusions."""

    def __init__(self, candidates: list[Candidate], scale_ref_s: float, num_workers: int = 1) -> None:
        self.candidates = candidates
        self.scale = OBJECTIVE_UNITS / max(scale_ref_s, 1e-9)
        self.model = cp_model.CpModel()
        self.num_workers = num_workers
        self.pick: list[cp_model.IntVar] = []
        self.counts: list[list[cp_model.IntVar]] = []
        self._build()

    def _build(self) -> None:
        m = self.model
        objective = []
        for i, cand in enumerate(self.candidates):
            lay = cand.estimate.layout
            tb = cand.tables
            x = m.new_bool_var(f"pick_{i}")
            self.pick.append(x)
            chunks = len(lay.stage_layers)
            if lay.pp == 1:
                counts = [m.new_constant(lay.stage_layers[0])]
            else:
                counts = [m.new_int_var(1, cand.num_layers, f"n_{i}_{j}") for j in range(chunks)]
                m.add(sum(counts) == cand.num_layers)
            self.counts.append(counts)
            t_unit = round(tb.steady_coefficient * tb.layer_time_s * self.scale)
            slow = m.new_int_var(0, 10 * OBJECTIVE_UNITS * max(1, cand.num_layers), f"slow_{i}")
            cap = int((cand.capacity_bytes - cand.estimate.headroom_bytes) // MEMORY_UNIT_BYTES)
            for s in range(lay.pp):
                mine = [counts[j] for j in range(chunks) if j % lay.pp == s]
                const_t = round(tb.steady_coefficient * tb.stage_const_time_s[s] * self.scale)
                m.add(slow >= t_unit * sum(mine) + const_t).only_enforce_if(x)
                per_layer_b = round((tb.layer_static_bytes + tb.in_flight[s] * tb.layer_act_bytes) / MEMORY_UNIT_BYTES)
                const_b = round(tb.stage_const_bytes[s] / MEMORY_UNIT_BYTES)
                m.add(per_layer_b * sum(mine) + const_b <= cap).only_enforce_if(x)
            m.add(slow == 0).only_enforce_if(x.Not())
            objective.append(slow)
            objective.append(round(tb.other_time_s * self.scale) * x)
        m.add_exactly_one(self.pick)
        m.minimize(sum(objective))

    def solve(self, excluded: list[int], time_limit_s: float) -> SolveResult:
        for i in excluded:
            self.model.add(self.pick[i] == 0)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
        solver.parameters.num_workers = self.num_workers
        solver.parameters.random_seed = 0
        solver.parameters.interleave_search = False
        status = solver.solve(self.model)
        name = solver.status_name(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return SolveResult(None, name, None)
        idx = next(i for i, x in enumerate(self.pick) if solver.value(x))
        counts = tuple(int(solver.value(c)) for c in self.counts[idx])
        return SolveResult(
            Choice(idx, counts, solver.objective_value / self.scale), name, solver.best_objective_bound / self.scale
        )
