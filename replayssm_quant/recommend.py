"""Precision recommendation: the cheapest config that passes the criteria of a budget.

Evidence comes from result folders (:mod:`replayssm_quant.results`): teacher-forced drift
and, when present, paired task accuracy against the FP32 reference. Cost is the state traffic
of one decode step from the cost model (:func:`replayssm_quant.precision.step_bytes`) for the
model's own SSM shape, or the measured step time from a kernel benchmark CSV, because the
cheapest config in bytes is not always the fastest kernel.

The budget compiles into the check language of :mod:`replayssm_quant.results.criteria`; every
check is evaluated per config into an :class:`~replayssm_quant.results.criteria.Outcome` that
knows its value, its limit and by how much it misses (``excess``: 0 at the limit, 1 at twice
the allowance), so a rejection names the metric, and "closest" has a meaning when nothing
qualifies: the config whose worst check misses by the least. A config whose task evidence
is too thin to decide a check (:mod:`replayssm_quant.results.evidence`) is *undecided*: it is
never picked, and when every config is rejected or undecided the exit code is 3. Rendering
lives in :mod:`replayssm_quant.report`.

With a benchmark that times a precision split at several window lengths (``python -m
benchmarks.decode --L 8 16 32 64``), each split's L is chosen from the measured times too
(:func:`choose_windows`): the fastest L whose own accuracy results pass, since a longer window
changes the numerics (fewer checkpoint roundings, longer reads of one read copy) and the
evidence at one L says nothing certain about another.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .precision import (
    PRESETS,
    SHAPES,
    WINDOW_LENGTHS,
    ModelShape,
    PrecisionConfig,
    best_window_by_bytes,
    parse_config,
    resolve_shape,
    step_bytes,
    window_bytes,
    window_family,
    window_name,
    window_optimum,
)
from .results import (
    DEFAULT_BUDGET,
    Benchmark,
    BenchmarkRow,
    Budget,
    Criteria,
    DriftResults,
    InputError,
    ModelResults,
    Outcome,
    judge,
    load_benchmark,
)
from .results.criteria import failed, lookup
from .results.evidence import decide

__all__ = [
    "DEFAULT_BUDGET",
    "EXIT_BAD_INPUT",
    "EXIT_NONE_QUALIFIES",
    "Benchmark",
    "BenchmarkRow",
    "Budget",
    "Candidate",
    "Cost",
    "InputError",
    "Recommendation",
    "WindowChoice",
    "choose_windows",
    "load_benchmark",
    "recommend",
    "window_length_table",
    "vllm_additional_config",
    "vllm_serve_command",
]

EXIT_BAD_INPUT = 2
EXIT_NONE_QUALIFIES = 3


# ---------------------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class Cost:
    """What one config costs per decode step of one SSM layer and one sequence.

    ``value`` is the ranking key in the basis's unit (bytes or microseconds); None when unknown
    (``note`` says why).
    """

    basis: str
    value: float | None
    bytes_per_step: float
    traffic_vs_fp32: float
    state_bytes: float
    window_us: float | None = None
    speedup_vs_conv_fp32: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _dims(s: ModelShape) -> tuple:
    return (s.kind, s.heads, s.head_dim, s.d_state, s.groups)


def _bench_shape(bench: Benchmark, shape: ModelShape, explicit: str | None) -> str:
    if explicit is not None:
        name = resolve_shape(explicit).name if explicit.lower() not in bench.shapes else explicit
        if name not in bench.shapes:
            raise InputError(f"{bench.path}: no rows for shape {name!r} (it has "
                             f"{', '.join(bench.shapes)})")
        return name
    if shape.name in bench.shapes:
        return shape.name
    for name in bench.shapes:
        if name in SHAPES and _dims(SHAPES[name]) == _dims(shape):
            return name
    raise InputError(f"{bench.path}: none of its shapes ({', '.join(bench.shapes)}) has the "
                     f"model's SSM shape ({shape.kind}, {shape.heads} heads x {shape.head_dim} "
                     f"x {shape.d_state}, {shape.groups} groups); pass --shape NAME to rank by "
                     "one of them")


def window_length_table(shape: ModelShape, lengths=WINDOW_LENGTHS,
                        bench: Benchmark | None = None, bench_shape: str | None = None
                        ) -> list[dict]:
    """One row per windowed preset: the cost model's window-average bytes per step at each L
    of ``lengths`` (ring reads grow with L, the flush's writes spread over L), the L of them
    with the fewest bytes and the real-valued optimum; with ``bench``, per measured batch the
    time per step at each L measured and the fastest L (``measured``), from the rows of
    ``bench_shape`` (default: the rows with ``shape``'s dimensions)."""
    lengths = tuple(sorted(set(lengths)))
    if not lengths or min(lengths) < 2:
        raise InputError(f"window lengths must be >= 2, got {', '.join(map(str, lengths))}")
    bshape = _bench_shape(bench, shape, bench_shape) if bench is not None else None
    base = step_bytes(PRESETS["fp32"], shape).window_average
    rows = []
    for cfg in PRESETS.values():
        if cfg.L == 1:
            continue
        wb = window_bytes(cfg, shape, lengths)
        row = {"name": cfg.label, "family": window_family(cfg), "shape": shape.name,
               "preset_L": cfg.L,
               "bytes_per_step": {L: b.window_average for L, b in wb.items()},
               "traffic_vs_fp32": {L: b.window_average / base for L, b in wb.items()},
               "bytes_best_L": best_window_by_bytes(cfg, shape, lengths),
               "bytes_optimum_L": window_optimum(cfg, shape)}
        if bench is not None:
            row["bench_shape"] = bshape
            row["measured"] = {}
            for batch in bench.batches(bshape):
                wins = bench.windows(bshape, batch, cfg)
                if not wins:
                    continue
                best = bench.best_window(bshape, batch, cfg)
                row["measured"][batch] = {
                    "window_us": {L: r.window_us for L, r in wins.items()},
                    "speedup_vs_conv_fp32": {L: r.speedup_vs_conv_fp32 for L, r in wins.items()},
                    "best_L": best.config.L if best is not None else None}
        rows.append(row)
    return rows


@dataclass
class WindowChoice:
    """The window length chosen for one precision split from measured times: the fastest
    measured L whose accuracy checks pass. ``times_us``: measured µs per step by L;
    ``verdicts``: the candidate verdict by L where results exist; ``notes``: where the
    measured times and the accuracy evidence do not cover the same L."""

    name: str
    family: str
    times_us: dict[int, float]
    verdicts: dict[int, str]
    fastest_measured: int | None
    chosen: int | None
    notes: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def choose_windows(candidates: list[Candidate], bench: Benchmark, bench_shape: str,
                   batch: int) -> list[WindowChoice]:
    """Per precision split among ``candidates`` with a window, the fastest L measured at
    (``bench_shape``, ``batch``) whose candidate qualifies. An L with a time but no results,
    or results but no time, is named in the notes and never chosen: the accuracy at an L
    that was not run is not inferred from another L."""
    families: dict[str, list[Candidate]] = {}
    for c in candidates:
        if c.config.L > 1:
            families.setdefault(window_family(c.config), []).append(c)
    out = []
    for fam, cands in families.items():
        wins = bench.windows(bench_shape, batch, cands[0].config)
        times = {L: r.window_us for L, r in wins.items() if math.isfinite(r.window_us)}
        verdicts = dict(sorted((c.config.L, c.verdict) for c in cands))
        fastest = min(times, key=lambda L: (times[L], L)) if times else None
        passing = [L for L, v in verdicts.items() if v == "qualifies" and L in times]
        chosen = min(passing, key=lambda L: (times[L], L)) if passing else None
        notes = []
        evid = ", ".join(f"L={L}" for L in verdicts)
        if not times:
            notes.append(f"no window measured for {bench_shape} at batch {batch}")
        elif len(times) == 1:
            notes.append(f"only L={fastest} timed: no other length to compare")
        elif fastest not in verdicts:
            notes.append(f"fastest measured L={fastest} ({times[fastest]:,.1f} µs) has no "
                         f"accuracy results (evidence only at {evid}); not chosen")
        elif verdicts[fastest] != "qualifies":
            notes.append(f"fastest measured L={fastest} ({times[fastest]:,.1f} µs) is "
                         f"{verdicts[fastest]}")
        unmeasured = [L for L in verdicts if L not in times]
        if unmeasured and times:
            notes.append("accuracy results but no measured time at "
                         + ", ".join(f"L={L}" for L in unmeasured))
        if times and chosen is None:
            notes.append("no measured L passes the budget")
        out.append(WindowChoice(window_name(cands[0].config), fam, times, verdicts, fastest,
                                chosen, notes))
    return out


# ---------------------------------------------------------------------------------------- result
@dataclass
class Candidate:
    """One config with its cost and the outcomes of the budget's checks."""

    name: str
    config: PrecisionConfig
    cost: Cost
    checks: list[Outcome]

    @property
    def qualifies(self) -> bool:
        return self.cost.value is not None and all(c.ok for c in self.checks)

    @property
    def undecided(self) -> bool:
        """Nothing rejects it, but some task check could not be decided."""
        return (self.cost.value is not None and any(c.undecided for c in self.checks)
                and all(c.ok or c.undecided for c in self.checks))

    @property
    def verdict(self) -> str:
        return "qualifies" if self.qualifies else "undecided" if self.undecided else "rejected"

    @property
    def worst_excess(self) -> float:
        """The largest normalised excess over the checks (-inf with no checks)."""
        return max((c.excess for c in self.checks), default=-math.inf)

    @property
    def failures(self) -> list[Outcome]:
        return [c for c in self.checks if not c.ok]

    def reasons(self) -> list[str]:
        out = [c.describe() for c in self.failures]
        if self.cost.value is None:
            out.append(self.cost.note or "cost unknown")
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "config": str(self.config), "qualifies": self.qualifies,
                "verdict": self.verdict, "worst_excess": self.worst_excess, "cost": self.cost.to_dict(),
                "checks": [c.to_dict() for c in self.checks], "rejected_because": self.reasons()}


def vllm_additional_config(config: str | PrecisionConfig) -> str:
    """The JSON for ``vllm serve --additional-config`` that selects ``config``."""
    return json.dumps({"replayssm_quant": str(config)})


def vllm_serve_command(model: str, config: str | PrecisionConfig, kind: str | None = None) -> str:
    """A ``vllm serve`` line for the plugin (docs/vllm.md): ReplaySSM configs also need
    ``--use-replayssm`` with their L, Mamba-2 models (``kind`` ``mamba2``, e.g. Nemotron-H)
    vLLM's Triton Mamba backend, and the plugin refuses prefix caching."""
    cfg = parse_config(config)
    flags = ["VLLM_USE_V2_MODEL_RUNNER=0 vllm serve", model]
    if cfg.L > 1:
        flags += ["--use-replayssm", f"--replayssm-buffer-len {cfg.L}"]
    if kind == "mamba2":
        flags.append("--mamba-backend triton")
    flags += ["--no-enable-prefix-caching", f"--additional-config '{vllm_additional_config(config)}'"]
    return " ".join(flags)


@dataclass
class Recommendation:
    """The pick (or None), the closest config when nothing qualifies, and every candidate in
    cost order with the reasons it was or was not chosen."""

    model: str
    budget: Budget
    shape: ModelShape
    cost_basis: str
    candidates: list[Candidate]
    chosen: Candidate | None
    closest: Candidate | None
    evidence: dict
    not_checked: list[str]
    windows: list[WindowChoice] = field(default_factory=list)  # with a benchmark: L per split

    @property
    def exit_code(self) -> int:
        return 0 if self.chosen is not None else EXIT_NONE_QUALIFIES

    @property
    def status(self) -> str:
        """ok (a pick), undecided (no pick, and some config's task evidence could not decide)
        or none_qualifies."""
        if self.chosen is not None:
            return "ok"
        return "undecided" if self.undecided else "none_qualifies"

    @property
    def undecided(self) -> list[Candidate]:
        """Configs left out because their task evidence cannot decide a check."""
        return [c for c in self.candidates if c.undecided]

    @property
    def serve_command(self) -> str | None:
        if self.chosen is None:
            return None
        return vllm_serve_command(self.model, self.chosen.config, self.shape.kind)

    @property
    def rejected_cheaper(self) -> list[Candidate]:
        """Candidates ranked before the pick (all of them, when nothing qualifies)."""
        out = []
        for c in self.candidates:
            if c is self.chosen:
                break
            out.append(c)
        return out

    def to_dict(self) -> dict:
        pick = self.chosen
        return _json_safe({
            "schema_version": 1,
            "model": self.model,
            "status": self.status,
            "name": pick.name if pick else None,
            "config": str(pick.config) if pick else None,
            "vllm_additional_config": vllm_additional_config(pick.config) if pick else None,
            "vllm_serve": self.serve_command,
            "closest": ({"name": self.closest.name, "config": str(self.closest.config),
                         "worst_excess": self.closest.worst_excess,
                         "rejected_because": self.closest.reasons()}
                        if pick is None and self.closest is not None else None),
            "cost_basis": self.cost_basis,
            "cost_unit": _UNITS[self.cost_basis],
            "shape": asdict(self.shape),
            "budget": self.budget.to_dict(),
            "evidence": self.evidence,
            "not_checked": self.not_checked,
            "undecided": [{"name": c.name, "config": str(c.config), "reasons": c.reasons()}
                          for c in self.undecided],
            "rejected_cheaper": [{"name": c.name, "config": str(c.config), "reasons": c.reasons()}
                                 for c in (self.rejected_cheaper if pick else [])],
            "candidates": [c.to_dict() for c in self.candidates],
            "window_lengths": [w.to_dict() for w in self.windows],
        })

    def write(self, out: str | Path, markdown: str) -> dict[str, Path]:
        """``recommendation.json`` and ``recommendation.md`` in ``out``; the Markdown is
        rendered by the caller (:func:`replayssm_quant.report.recommendation_markdown`)."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        files = {"json": d / "recommendation.json", "markdown": d / "recommendation.md"}
        files["json"].write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        files["markdown"].write_text(markdown)
        return files


_UNITS = {"bytes": "state bytes moved per decode step (one SSM layer, one sequence)",
          "time": "measured microseconds per decode step (window average)",
          "memory": "state bytes held per sequence (one SSM layer)"}


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# ---------------------------------------------------------------------------------------- core
def _drift_outcomes(results: ModelResults, drift: DriftResults, key: PrecisionConfig,
                    criteria: Criteria, bucket: str, cross: list = ()) -> list[Outcome]:
    dc = drift.config(key)
    scope = "all positions" if bucket == "all" else bucket
    if dc is None:
        return [failed("drift", scope, "no drift result for this config")]
    out: list[Outcome] = []
    for issue in drift.config_issues(key):
        out.append(failed("drift", scope, f"{issue.kind} result: {issue.message}", issue.kind))
    for issue in cross:
        out.append(failed("results", "drift and tasks", f"{issue.kind}: {issue.message}",
                          issue.kind))
    stats = dc.stats(bucket)
    if stats is None:
        return out + [failed("drift", scope, f"no drift statistics for bucket {bucket}")]
    for check in criteria.checks:
        if check.source != "drift":
            continue
        value, problem = lookup(results, check, key, bucket)
        if problem is not None:
            raise InputError(f"{drift.path}: drift statistics have no {check.metric!r}; "
                             f"kl_stat must be one of "
                             f"{', '.join(k for k in stats.values if k.startswith('kl_'))}")
        out.append(judge(check, value, scope=scope))
    return out


def _task_outcomes(results: ModelResults, key: PrecisionConfig,
                   criteria: Criteria) -> list[Outcome]:
    tasks = results.tasks
    assert tasks is not None
    out: list[Outcome] = []
    for check in criteria.checks:
        if check.source != "tasks":
            continue
        (task,) = check.tasks
        if tasks.is_reference(key):
            out.append(decide(judge(check, 0.0, scope=task, by_definition=True), tasks,
                              check.metric, key, task, criteria.evidence))
            continue
        row = tasks.row(task, key)
        if row is None:
            out.append(failed(check.shown, task, "no result for this config on this task"))
            continue
        for issue in tasks.row_issues(task, key):
            out.append(failed(check.shown, task, f"{issue.kind} result: {issue.message}",
                              issue.kind))
        value, _ = lookup(results, check, key, task)
        out.append(decide(judge(check, value, scope=task), tasks, check.metric, key, task,
                          criteria.evidence))
    return out


def recommend(
    results: ModelResults,
    budget: Budget = DEFAULT_BUDGET,
    *,
    shape: str | ModelShape | None = None,
    bench: Benchmark | None = None,
    batch: int | None = None,
    cost_basis: str = "auto",
) -> Recommendation:
    """Rank every config in ``results`` by cost and pick the cheapest inside ``budget``.

    ``shape``: the SSM layer shape for the byte counts (default: the one the results record).
    ``bench`` + ``batch``: rank by measured step time at that batch (default: the largest
    batch measured), and choose each split's window length (``Recommendation.windows``).
    ``cost_basis``: ``auto`` (time with a benchmark, else bytes), ``bytes``,
    ``time`` or ``memory`` (state held per sequence).
    Raises :class:`InputError` for input it cannot use.
    """
    if cost_basis not in ("auto", "bytes", "time", "memory"):
        raise InputError(f"cost basis must be auto, bytes, time or memory, got {cost_basis!r}")
    basis = ("time" if bench is not None else "bytes") if cost_basis == "auto" else cost_basis
    if basis == "time" and bench is None:
        raise InputError("ranking by time needs a benchmark CSV (--bench)")
    if isinstance(shape, ModelShape):
        layer = shape
    elif shape is not None:
        try:
            layer = resolve_shape(shape)
        except ValueError as e:
            raise InputError(str(e)) from None
    elif results.shape is not None:
        layer = results.shape
    else:
        raise InputError(f"the results for {results.model!r} record no SSM shape; pass --shape "
                         f"NAME ({', '.join(SHAPES)})")
    criteria = budget.criteria(results.tasks.tasks if results.tasks else ())
    if results.drift is None and criteria.require_drift:
        raise InputError(f"no drift results for {results.model!r}; the budget requires them "
                         "(set require_drift: false to recommend from task results alone)")

    evidence: dict[str, Any] = {
        "drift": str(results.drift.path) if results.drift else None,
        "tasks": str(results.tasks.path) if results.tasks else None,
        "tasks_reference": str(results.tasks.reference) if results.tasks else None,
        "task_names": results.tasks.tasks if results.tasks else [],
        "shape_source": ("--shape" if shape is not None else "results"),
    }
    not_checked: list[str] = []
    bucket = None
    if results.drift is not None:
        bucket = results.drift.resolve_bucket(budget.bucket)
        if bucket is None:
            raise InputError(f"budget bucket {budget.bucket!r} is not in the drift results "
                             f"(buckets: last, all, "
                             f"{', '.join(b.bucket for b in results.drift.buckets)})")
        evidence["drift_bucket"] = bucket
        evidence["drift_data"] = results.drift.data
        evidence["drift_tokens"] = results.drift.tokens
    else:
        not_checked.append("drift (no drift results)")
    if results.tasks is None:
        not_checked.append("task accuracy (no task results)")

    bench_shape = None
    if bench is not None:
        bench_shape = _bench_shape(bench, layer, shape if isinstance(shape, str) else None)
        batches = bench.batches(bench_shape)
        if batch is None:
            batch = batches[-1]
        elif batch not in batches:
            raise InputError(f"{bench.path}: batch {batch} not measured for {bench_shape} "
                             f"(batches: {', '.join(map(str, batches))})")
        evidence["bench"] = {"path": str(bench.path), "shape": bench_shape, "batch": batch}

    base = step_bytes(PRESETS["fp32"], layer).window_average
    candidates: list[Candidate] = []
    for key in results.configs():
        sb = step_bytes(key, layer)
        row = bench.lookup(bench_shape, batch, key) if bench is not None else None
        window = row.window_us if row is not None else None
        speed = row.speedup_vs_conv_fp32 if row is not None else None
        note = ""
        if basis == "bytes":
            value: float | None = sb.window_average
        elif basis == "memory":
            value = sb.state_bytes
        else:
            value = window if window is not None and math.isfinite(window) else None
            if value is None:
                note = (f"no measured step time for {bench_shape} at batch {batch}"
                        if row is None else "measured step time is NaN")
        cost = Cost(basis, value, sb.window_average, sb.window_average / base, sb.state_bytes,
                    window, speed, note)
        outcomes: list[Outcome] = []
        if results.drift is not None:
            cross = [i for i in results.cross_issues if i.config == key]
            outcomes += _drift_outcomes(results, results.drift, key, criteria, bucket, cross)
        if results.tasks is not None:
            outcomes += _task_outcomes(results, key, criteria)
        elif criteria.require_tasks:
            outcomes.append(failed("task accuracy", "all tasks",
                                   "no task results (required by the budget)"))
        candidates.append(Candidate(results.label(key), key, cost, outcomes))
    if not candidates:
        raise InputError(f"no configs in the results for {results.model!r}")

    def rank(c: Candidate) -> tuple:
        return (c.cost.value is None, c.cost.value if c.cost.value is not None else 0.0,
                c.worst_excess, c.name)

    candidates.sort(key=rank)
    chosen = next((c for c in candidates if c.qualifies), None)
    closest = None
    if chosen is None:
        closest = min(candidates, key=lambda c: (c.worst_excess, c.cost.value is None,
                                                 c.cost.value or 0.0, c.name))
    windows = choose_windows(candidates, bench, bench_shape, batch) if bench is not None else []
    return Recommendation(results.model, budget, layer, basis, candidates, chosen, closest,
                          evidence, not_checked, windows)
