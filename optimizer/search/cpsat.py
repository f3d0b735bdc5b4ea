"""CP-SAT model: pick a layout among the surviving candidates jointly with its layer split.

Variables: one boolean per candidate (layout + rank order from the exact enumeration) and one
integer per pipeline stage (its layer count). Constraints: exactly one candidate; the stage
counts sum to the model's layers; each stage's count is restricted to values whose memory fits
(the per-stage memory limit); element constraints read the stage's time, exposed
data-parallel time and optimizer time from tables. Objective: ``steady_coefficient x slowest
stage + slowest DP + slowest optimizer + pipeline send/recv``, the composition ``estimate``
uses. The tables come from ``optimizer.search.split_tables.split_tables`` (the cost model's own
``stage_terms``), scaled to integers per request so the best known step time is 10^7 units;
every answer is re-scored with the float cost model afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from ortools.sat.python import cp_model

from optimizer.cost.estimate import Estimate
from optimizer.search.chunk_kinds import KindPeriod, chunk_split, kind_period
from optimizer.search.split_tables import SplitTables

OBJECTIVE_UNITS = 10_000_000
"""The best known step time maps to this many objective units (per-request scale)."""


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


class _CpModel(cp_model.CpModel):
    """``CpModel`` without the deprecated CamelCase aliases it attaches to every new instance
    (about as long as building one of these small models; this module uses snake_case only)."""

    def _add_pre_pep8_methods(self) -> None:
        pass


class SplitModel:
    """One CP-SAT model over the candidates; ``solve`` can be called repeatedly with exclusions."""

    def __init__(self, candidates: list[Candidate], scale_ref_s: float, num_workers: int = 1) -> None:
        self.candidates = candidates
        self.scale = OBJECTIVE_UNITS / max(scale_ref_s, 1e-9)
        self.model = _CpModel()
        self.num_workers = num_workers
        self.pick: list[cp_model.IntVar] = []
        self.counts: list[list[cp_model.IntVar]] = []
        self.chunk_level: set[int] = set()
        """Candidates whose ``counts`` are per chunk (schedule order) rather than per stage."""
        self._build()

    def _build(self) -> None:
        m = self.model
        objective = []
        horizon = 0
        for cand in self.candidates:
            tb = cand.tables
            worst = tb.steady_coefficient * max(max(r) for r in tb.time_s) + max(max(r) for r in tb.dp_s)
            worst += max(max(r) for r in tb.optimizer_s) + tb.pp_comm_s
            for rows in (tb.by_start, tb.by_mix):
                if not rows:
                    continue
                entries = [e for row in rows for e in row]
                worst = max(worst, tb.steady_coefficient * max(e[2] for e in entries) + max(e[3] for e in entries)
                            + max(e[4] for e in entries) + tb.pp_comm_s)  # fmt: skip
            horizon = max(horizon, self._units(worst) + 1)
        for i, cand in enumerate(self.candidates):
            tb = cand.tables
            x = m.new_bool_var(f"pick_{i}")
            self.pick.append(x)
            cap_bytes = cand.estimate.usable_bytes  # the candidate's capacity is its estimate's
            slow = m.new_int_var(0, horizon, f"slow_{i}")
            dp = m.new_int_var(0, horizon, f"dp_{i}")
            opt = m.new_int_var(0, horizon, f"opt_{i}")
            if tb.by_start is not None:
                counts = self._stages_by_start(i, cand, x, cap_bytes, slow, dp, opt, horizon)
            elif tb.by_mix is not None:
                counts = self._chunks_by_mix(i, cand, x, cap_bytes, slow, dp, opt, horizon)
                self.chunk_level.add(i)
            else:
                counts = self._stages_by_count(i, cand, x, cap_bytes, slow, dp, opt, horizon)
            for var in (slow, dp, opt):
                m.add(var == 0).only_enforce_if(x.Not())
            self.counts.append(counts)
            objective += [slow, dp, opt, self._units(tb.pp_comm_s) * x]
        m.add_exactly_one(self.pick)
        self.objective = sum(objective)
        m.minimize(self.objective)
        # Hint: the first candidate (the best exact uniform-split estimate) with its own split.
        if self.candidates:
            for i, x in enumerate(self.pick):
                m.add_hint(x, i == 0)
            first = self.candidates[0].estimate.layout
            if 0 in self.chunk_level:
                for c, n in zip(self.counts[0], first.stage_layers, strict=True):
                    m.add_hint(c, n)
            else:
                for s, c in enumerate(self.counts[0]):
                    m.add_hint(c, sum(first.stage_layers[j] for j in range(s, len(first.stage_layers), first.pp)))

    def _stages_by_count(
        self, i: int, cand: Candidate, x: cp_model.IntVar, cap_bytes: float,
        slow: cp_model.IntVar, dp: cp_model.IntVar, opt: cp_model.IntVar, horizon: int,
    ) -> list[cp_model.IntVar]:  # fmt: skip
        """Stages whose terms depend only on how many layers they hold (one layer kind): one
        integer per stage, element constraints into the per-count tables."""
        m = self.model
        tb = cand.tables
        lay = cand.estimate.layout
        counts = []
        allowed_counts: list[list[int]] = []
        for s in range(lay.pp):
            # One integer per stage: the tables depend only on how many layers a stage holds
            # (per-chunk counts would only add symmetric solutions); chunks split it evenly.
            allowed = [
                n
                for j, n in enumerate(range(tb.lo, tb.hi + 1))
                if tb.memory_bytes[s][j] <= cap_bytes  # per-stage memory limit, exact float test
            ]
            if lay.pp == 1:
                allowed = [cand.num_layers] if allowed else []
            allowed_counts.append(allowed)
            n = m.new_int_var_from_domain(cp_model.Domain.FromValues(allowed or [tb.lo]), f"n_{i}_{s}")
            if not allowed:
                m.add_bool_or([x.Not()])  # this candidate cannot fit at all within the tables
            counts.append(n)
            idx = m.new_int_var(0, tb.hi - tb.lo, f"idx_{i}_{s}")
            m.add(idx == n - tb.lo)
            for name, table, var, weight in (
                ("t", tb.time_s[s], slow, tb.steady_coefficient),
                ("d", tb.dp_s[s], dp, 1.0),
                ("o", tb.optimizer_s[s], opt, 1.0),
            ):
                val = m.new_int_var(0, horizon, f"{name}_{i}_{s}")
                m.add_element(idx, [self._units(weight * v) for v in table], val)
                m.add(var >= val).only_enforce_if(x)
        m.add(sum(counts) == cand.num_layers).only_enforce_if(x)
        # Symmetry: stages with the same time, data-parallel and optimizer rows whose allowed
        # counts are down-closed with the earlier stage's no wider (activation memory only
        # falls along the pipeline) can swap counts without changing feasibility or the
        # objective, so an earlier one may be required to hold no more layers.
        for s in range(lay.pp - 1):
            a, b = allowed_counts[s], allowed_counts[s + 1]
            if (
                a and b and a == b[: len(a)] and a == list(range(a[0], a[-1] + 1)) and a[0] == b[0]
                and b == list(range(b[0], b[-1] + 1))
                and tb.time_s[s] == tb.time_s[s + 1] and tb.dp_s[s] == tb.dp_s[s + 1]
                and tb.optimizer_s[s] == tb.optimizer_s[s + 1]
            ):  # fmt: skip
                m.add(counts[s] <= counts[s + 1])
        return counts

    def _stages_by_start(
        self, i: int, cand: Candidate, x: cp_model.IntVar, cap_bytes: float,
        slow: cp_model.IntVar, dp: cp_model.IntVar, opt: cp_model.IntVar, horizon: int,
    ) -> list[cp_model.IntVar]:  # fmt: skip
        """Stages of a one-chunk layout of a model with several layer kinds: each stage's terms
        depend on its first layer (the layers of the stages before it) as well as on its count;
        a table constraint over (first layer, count, time, dp, optimizer) per stage, with the
        (first layer, count) pairs whose memory does not fit left out."""
        m = self.model
        tb = cand.tables
        assert tb.by_start is not None
        counts: list[cp_model.IntVar] = []
        start: cp_model.LinearExpr | int = 0
        for s, row in enumerate(tb.by_start):
            fitting = [e for e in row if e[5] <= cap_bytes]  # per-stage memory limit, exact float test
            t, d, o = (m.new_int_var(0, horizon, f"{name}_{i}_{s}") for name in ("t", "d", "o"))
            terms = [
                (e[1], self._units(tb.steady_coefficient * e[2]), self._units(e[3]), self._units(e[4])) for e in fitting
            ]
            by_count = {term[0]: term for term in terms}
            if len({e[1] for e in row}) == len({e[1:] for e in row}):
                # the stage's terms do not depend on where it starts: a table over its count alone
                n = m.new_int_var_from_domain(cp_model.Domain.FromValues(sorted(by_count) or [tb.lo]), f"n_{i}_{s}")
                if by_count:
                    m.add_allowed_assignments([n, t, d, o], sorted(by_count.values()))
            else:
                n = m.new_int_var(tb.lo, tb.hi, f"n_{i}_{s}")
                first = m.new_int_var(0, cand.num_layers, f"first_{i}_{s}")
                m.add(first == start).only_enforce_if(x)
                tuples = [(e[0], *term) for e, term in zip(fitting, terms, strict=True)]
                m.add_allowed_assignments([first, n, t, d, o], tuples)
            if not fitting:
                m.add_bool_or([x.Not()])  # this stage cannot fit anywhere
            for var, val in ((slow, t), (dp, d), (opt, o)):
                m.add(var >= val).only_enforce_if(x)
            counts.append(n)
            start = start + n
        m.add(sum(counts) == cand.num_layers).only_enforce_if(x)
        return counts

    def _chunks_by_mix(
        self, i: int, cand: Candidate, x: cp_model.IntVar, cap_bytes: float,
        slow: cp_model.IntVar, dp: cp_model.IntVar, opt: cp_model.IntVar, horizon: int,
    ) -> list[cp_model.IntVar]:  # fmt: skip
        """Interleaved stages of a model with several layer kinds: one integer per chunk (schedule
        order ``v * pp + s``, consecutive in the model); each chunk's layers of each kind follow from
        its first layer and count (constants where every start gives one mix, the repeat of
        ``kind_period`` where the kinds repeat, else a table over the model's kind prefix sums), a
        stage's totals are its chunks' sums, and its terms come from a table over (layers, layers
        of each kind)."""
        m = self.model
        tb = cand.tables
        assert tb.by_mix is not None
        lay = cand.estimate.layout
        pp, vpp, layers = lay.pp, lay.vpp, cand.num_layers
        kinds = len(tb.kind_prefix)
        most = tb.hi - (vpp - 1)  # a chunk holds at most its stage's layers less one per other chunk
        windows = [
            (f, n, *(tb.kind_prefix[k][f + n] - tb.kind_prefix[k][f] for k in range(kinds - 1)))
            for f in range(layers) for n in range(1, most + 1) if f + n <= layers
        ]  # fmt: skip
        period = kind_period(tb.kind_prefix)
        chunks, mix, last_table = self._chunk_vars(i, cand, x, most, windows, period)
        # Symmetry: a stage's chunks after ``last_table`` can trade layer counts without changing
        # any stage's totals (the chunks between them have fixed kind mixes too), so their counts
        # are required to fall along the schedule.
        for s in range(pp):
            tail = [v * pp + s for v in range(vpp) if v * pp + s > last_table]
            for a, b in pairwise(tail):
                m.add(chunks[a] >= chunks[b])
        m.add(sum(chunks) == layers).only_enforce_if(x)
        self._stage_mix_tables(i, cand, x, cap_bytes, (slow, dp, opt), horizon, chunks, mix)
        return chunks

    def _chunk_vars(
        self, i: int, cand: Candidate, x: cp_model.IntVar, most: int,
        windows: list[tuple[int, ...]], period: KindPeriod | None,
    ) -> tuple[list[cp_model.IntVar], list[list[cp_model.LinearExprT]], int]:  # fmt: skip
        """``_chunks_by_mix``'s chunk counts, their kind mixes, and the last start-dependent chunk."""
        m = self.model
        tb = cand.tables
        lay = cand.estimate.layout
        pp, vpp, layers = lay.pp, lay.vpp, cand.num_layers
        kinds = len(tb.kind_prefix)
        chunks: list[cp_model.IntVar] = []
        mix: list[list[cp_model.LinearExprT]] = []
        start: cp_model.LinearExpr | int = 0
        phase: cp_model.IntVar | None = None  # where the pattern stands at the chunk's first layer
        n_chunks = pp * vpp
        last_table = -1  # the last chunk whose kind mix depends on where it starts
        for j in range(n_chunks):
            c = m.new_int_var(1, most, f"c_{i}_{j}")
            # every chunk holds at least one layer: chunk j starts at layer j or later and leaves
            # one layer for each chunk after it
            reach = [w for w in windows if j <= w[0] and w[0] + w[1] <= layers - (n_chunks - 1 - j)]
            if len({w[2:] for w in reach}) == 1:
                # the same kind mix wherever the chunk starts (DeepSeek's chunks past its first
                # dense layers hold MoE layers only): constants instead of a table
                ks: list[cp_model.LinearExprT] = list(reach[0][2:])
                phase = None
            elif period is not None and j >= period.offset:
                # past the first irregular layers the kinds repeat: the chunk's mix is its whole
                # periods' plus a small table over (phase, remainder)
                if phase is None:
                    phase = m.new_int_var(0, period.length - 1, f"phase_{i}_{j}")
                    whole = m.new_int_var(0, layers, f"q_{i}_{j}")
                    m.add(start - period.offset == period.length * whole + phase).only_enforce_if(x)
                ks, phase = self._periodic_mix(i, j, c, phase, most, period)
                last_table = j
            else:
                first = m.new_int_var(0, layers, f"first_{i}_{j}")
                m.add(first == start).only_enforce_if(x)
                ks = [m.new_int_var(0, most, f"k_{i}_{j}_{k}") for k in range(kinds - 1)]
                m.add_allowed_assignments([first, c, *ks], reach)
                last_table = j
                phase = None
            chunks.append(c)
            mix.append(ks)
            start = start + c
        return chunks, mix, last_table

    def _stage_mix_tables(
        self, i: int, cand: Candidate, x: cp_model.IntVar, cap_bytes: float,
        stage_terms: tuple[cp_model.IntVar, cp_model.IntVar, cp_model.IntVar], horizon: int,
        chunks: list[cp_model.IntVar], mix: list[list[cp_model.LinearExprT]],
    ) -> None:  # fmt: skip
        """``_chunks_by_mix``'s stage totals (its chunks' sums) and the table of their terms into
        ``stage_terms`` (the candidate's slowest-stage, data-parallel and optimizer variables)."""
        m = self.model
        tb = cand.tables
        assert tb.by_mix is not None
        lay = cand.estimate.layout
        pp, vpp, layers = lay.pp, lay.vpp, cand.num_layers
        kinds = len(tb.kind_prefix)
        slow, dp, opt = stage_terms
        stage_vars: list[tuple[cp_model.IntVar, list[cp_model.IntVar]]] = []
        for s, row in enumerate(tb.by_mix):
            n = m.new_int_var(tb.lo, tb.hi, f"n_{i}_{s}")
            m.add(n == sum(chunks[v * pp + s] for v in range(vpp)))
            totals = [m.new_int_var(0, layers, f"kt_{i}_{s}_{k}") for k in range(kinds - 1)]
            for k, var in enumerate(totals):
                m.add(var == sum(mix[v * pp + s][k] for v in range(vpp)))
            t, d, o = (m.new_int_var(0, horizon, f"{name}_{i}_{s}") for name in ("t", "d", "o"))
            tuples = [
                (e[0], *e[1][: kinds - 1], self._units(tb.steady_coefficient * e[2]), self._units(e[3]),
                 self._units(e[4]))
                for e in row if e[5] <= cap_bytes  # per-stage memory limit, exact float test
            ]  # fmt: skip
            if tuples:
                m.add_allowed_assignments([n, *totals, t, d, o], tuples)
            else:
                m.add_bool_or([x.Not()])  # this stage cannot fit with any mix
            stage_vars.append((n, totals))
            for var, val in ((slow, t), (dp, d), (opt, o)):
                m.add(var >= val).only_enforce_if(x)
        # Redundant: the chunks cover the model once, so the stages' layer counts and their layers
        # of each kind add up to the model's. CP-SAT does not derive these sums through the chunk
        # tables; stated, they let it rule out most splits at the stage level. With MoE on every
        # second layer (every chunk's mix depends on where it starts) and window tables it proved
        # none of 80 such models within 1 s without them, and about two thirds with them.
        m.add(sum(n for n, _ in stage_vars) == layers).only_enforce_if(x)
        for k in range(kinds - 1):
            m.add(sum(totals[k] for _, totals in stage_vars) == tb.kind_prefix[k][-1]).only_enforce_if(x)

    def _periodic_mix(
        self, i: int, j: int, c: cp_model.IntVar, phase: cp_model.IntVar, most: int, period: KindPeriod
    ) -> tuple[list[cp_model.LinearExprT], cp_model.IntVar]:
        """Chunk ``j``'s layers of each kind (but the last) where the kinds repeat every
        ``period.length`` layers: ``c = length * whole + rest``, and the kind counts are ``whole``
        periods' plus those of ``rest`` layers from ``phase`` on (a table of ``length**2`` rows).
        Returns them and the phase the next chunk starts at.

        Linear in the chunk's count, where a table over (first layer, count) is not: with MoE on
        every second layer CP-SAT proves these models in milliseconds, where with the window
        tables it left a third of them open at 1 s."""
        m = self.model
        f = period.length
        whole = m.new_int_var(0, most // f, f"whole_{i}_{j}")
        rest = m.new_int_var(0, f - 1, f"rest_{i}_{j}")
        m.add(c == f * whole + rest)
        nxt = m.new_int_var(0, f - 1, f"phase_{i}_{j + 1}")
        extra = [m.new_int_var(0, f, f"extra_{i}_{j}_{k}") for k in range(len(period.per_period))]
        m.add_allowed_assignments([phase, rest, nxt, *extra], period.rest_table)
        ks: list[cp_model.LinearExprT] = []
        for k, per in enumerate(period.per_period):
            kv = m.new_int_var(0, most, f"k_{i}_{j}_{k}")
            m.add(kv == per * whole + extra[k])
            ks.append(kv)
        return ks, nxt

    def _units(self, seconds: float) -> int:
        return round(seconds * self.scale)

    def solve(
        self, excluded: list[int], time_limit_s: float, at_most_s: float | None = None, work_limit: float | None = None
    ) -> SolveResult:
        """Best choice (``excluded`` candidates left out). ``at_most_s``: only answers whose objective
        is at most this (INFEASIBLE when there is none), which prunes far better than the bare
        optimisation; the bound is widened by 1e-5 of the scale reference for the rounding.
        ``work_limit``: CP-SAT's deterministic-time limit (load-independent), besides the wall time."""
        for i in excluded:
            self.model.add(self.pick[i] == 0)
        if at_most_s is not None and at_most_s < float("inf"):
            self.model.add(self.objective <= self._units(at_most_s) + OBJECTIVE_UNITS // 100_000)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
        if work_limit is not None:
            solver.parameters.max_deterministic_time = work_limit
        solver.parameters.num_workers = self.num_workers
        solver.parameters.random_seed = 0
        solver.parameters.interleave_search = False
        solver.parameters.linearization_level = 0  # measured fastest on these small table models
        # Presolve costs more than it saves on the per-stage table models, and saves 10-30x on the
        # chunk-level ones (DeepSeek-V3 with 8 stages of 4 chunks: 1.5 s without, 0.06 s with).
        solver.parameters.cp_model_presolve = bool(self.chunk_level)
        status = solver.solve(self.model)
        name = solver.status_name(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return SolveResult(None, name, None)
        idx = next(i for i, x in enumerate(self.pick) if solver.value(x))
        values = [int(solver.value(c)) for c in self.counts[idx]]
        counts = (
            tuple(values) if idx in self.chunk_level else chunk_split(values, self.candidates[idx].estimate.layout.vpp)
        )
        return SolveResult(
            Choice(idx, counts, solver.objective_value / self.scale), name, solver.best_objective_bound / self.scale
        )
