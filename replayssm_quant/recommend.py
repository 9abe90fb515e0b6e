"""Precision recommendation: the cheapest config whose measured accuracy stays inside a budget.

Evidence comes from result folders (:mod:`replayssm_quant.evals.results`): teacher-forced drift
and, when present, paired task accuracy against the FP32 reference. Cost is the state traffic
of one decode step from the cost model (:func:`replayssm_quant.precision.step_bytes`) for the
model's own SSM shape, or the measured step time from a kernel benchmark CSV, because the
cheapest config in bytes is not always the fastest kernel.

Every budget limit is checked per config and turned into a :class:`Check` that knows its value,
its limit and by how much it misses (``excess``: 0 at the limit, 1 at twice the allowance), so
a rejection names the metric, and "closest" has a meaning when nothing qualifies: the config
whose worst check misses by the least.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .evals.results import DriftResults, ModelResults, config_key
from .precision import PRESETS, SHAPES, ModelShape, parse_config, resolve_shape, step_bytes

__all__ = [
    "DEFAULT_BUDGET",
    "EXIT_BAD_INPUT",
    "EXIT_NONE_QUALIFIES",
    "Benchmark",
    "BenchmarkRow",
    "Budget",
    "Candidate",
    "Check",
    "Cost",
    "InputError",
    "Recommendation",
    "load_benchmark",
    "recommend",
    "vllm_additional_config",
    "vllm_serve_command",
]

EXIT_BAD_INPUT = 2
EXIT_NONE_QUALIFIES = 3


class InputError(ValueError):
    """Input the recommender cannot use (budget, benchmark, shape): the CLI exits 2."""


# ---------------------------------------------------------------------------------------- budget
@dataclass(frozen=True)
class Budget:
    """The accuracy a config must keep to be recommended. ``None`` switches a limit off.

    max_kl: upper limit of the drift statistic ``kl_stat`` (nats) in ``bucket``.
    kl_stat: which drift statistic: ``kl_mean`` (default), ``kl_ci_hi`` (upper 95% bound),
        ``kl_median``, ``kl_p90``, ``kl_p99``, ``kl_max``.
    bucket: the position bucket the drift limits apply to: ``last`` (the longest positions,
        where a drifting state has had the most time to go wrong), ``all``, or a label such as
        ``[1024,2047)``.
    min_same_top1: lower limit of the top-1 agreement with the reference in ``bucket``.
    max_ppl_ratio: upper limit of the perplexity ratio in ``bucket`` (off by default).
    max_accuracy_drop: upper limit, in accuracy points, of the upper 95% bound of the paired
        accuracy drop against the reference, for every task.
    task_max_accuracy_drop: per-task overrides of ``max_accuracy_drop``.
    require_drift / require_tasks: reject every config when that evidence is absent (task
        evaluations need a GPU and hours, so by default a drift-only recommendation is made
        and says that tasks were not checked).
    """

    max_kl: float | None = 0.01
    kl_stat: str = "kl_mean"
    bucket: str = "last"
    min_same_top1: float | None = 0.99
    max_ppl_ratio: float | None = None
    max_accuracy_drop: float | None = 1.0
    task_max_accuracy_drop: Mapping[str, float | None] = field(default_factory=dict)
    require_drift: bool = True
    require_tasks: bool = False

    def __post_init__(self) -> None:
        for name in ("max_kl", "min_same_top1", "max_ppl_ratio", "max_accuracy_drop"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v)):
                raise InputError(f"budget {name} must be a finite number or null, got {v!r}")
        if self.max_kl is not None and self.max_kl < 0:
            raise InputError(f"budget max_kl must be >= 0, got {self.max_kl}")
        if self.min_same_top1 is not None and not 0 <= self.min_same_top1 <= 1:
            raise InputError("budget min_same_top1 is a fraction in [0, 1] (0.99 = 99%), got "
                             f"{self.min_same_top1}")
        if not isinstance(self.kl_stat, str) or not self.kl_stat.startswith("kl_"):
            raise InputError(f"budget kl_stat must name a KL statistic (kl_mean, kl_ci_hi, "
                             f"kl_median, kl_p90, kl_p99, kl_max), got {self.kl_stat!r}")
        if not isinstance(self.bucket, str) or not self.bucket.strip():
            raise InputError("budget bucket must be 'last', 'all' or a bucket label")
        if not isinstance(self.task_max_accuracy_drop, Mapping):
            raise InputError("budget task_max_accuracy_drop must map task names to points")
        for task, v in self.task_max_accuracy_drop.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InputError(f"budget task_max_accuracy_drop[{task!r}] must be a number "
                                 f"or null, got {v!r}")
        for name in ("require_drift", "require_tasks"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"budget {name} must be true or false")

    def drop_limit(self, task: str) -> float | None:
        return self.task_max_accuracy_drop.get(task, self.max_accuracy_drop)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["task_max_accuracy_drop"] = dict(self.task_max_accuracy_drop)
        return d

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], base: Budget | None = None) -> Budget:
        """A budget from a mapping (the YAML file), on top of ``base`` (default: the defaults).
        Unknown keys are errors, so a typo cannot silently leave a limit at its default."""
        if "budget" in data and len(data) == 1 and isinstance(data["budget"], Mapping):
            data = data["budget"]
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown budget key(s) {', '.join(map(repr, unknown))}; keys: "
                             f"{', '.join(sorted(known))}")
        return replace(base or cls(), **dict(data))

    @classmethod
    def from_yaml(cls, path: str | Path, base: Budget | None = None) -> Budget:
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as e:
            raise InputError(f"{p}: cannot read the budget: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise InputError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise InputError(f"{p}: a budget file is a mapping of budget keys")
        try:
            return cls.from_mapping(data, base)
        except InputError as e:
            raise InputError(f"{p}: {e}") from None


DEFAULT_BUDGET = Budget()


# ---------------------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class Check:
    """One budget limit applied to one config.

    ``excess`` is how far the value is beyond its allowance, normalised so limits of different
    metrics compare: for an upper limit ``value / limit - 1``; for top-1 agreement the
    disagreement against the allowed disagreement, ``(1 - value) / (1 - limit) - 1``. Zero at
    the limit, negative inside it, infinite when the value is missing or NaN.
    """

    metric: str
    scope: str
    value: float | None
    limit: float | None
    op: str  # "<=" or ">="
    ok: bool
    excess: float
    note: str = ""

    def describe(self) -> str:
        """E.g. ``kl_mean in [256,511) = 0.034 > 0.01 (3.4x the allowance)``."""
        if self.value is None or self.limit is None or not math.isfinite(self.value):
            return f"{self.metric} in {self.scope}: {self.note or 'no value'}"
        bad = {"<=": ">", ">=": "<"}[self.op]
        rel = self.op if self.ok else bad
        text = f"{self.metric} in {self.scope} = {_g(self.value)} {rel} {_g(self.limit)}"
        if not self.ok and math.isfinite(self.excess):
            text += (f" ({100 * self.excess:.1f}% over)" if self.excess < 1 else
                     f" ({self.excess + 1:.3g}x the allowance)")
        if self.note:
            text += f" [{self.note}]"
        return text

    def to_dict(self) -> dict:
        return {"metric": self.metric, "scope": self.scope, "value": self.value,
                "limit": self.limit, "op": self.op, "ok": self.ok, "excess": self.excess,
                "note": self.note, "text": self.describe()}


def _g(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.3e}"


def _upper(metric: str, scope: str, value: float | None, limit: float, note: str = "",
           scale: float | None = None) -> Check:
    if value is None or not math.isfinite(value):
        return Check(metric, scope, value, limit, "<=", False, math.inf,
                     note or ("missing" if value is None else "NaN"))
    ok = value <= limit
    s = scale if scale is not None else limit
    excess = value / s - 1 if s > 0 else (0.0 if value <= limit else math.inf)
    return Check(metric, scope, value, limit, "<=", ok, excess, note)


def _lower_rate(metric: str, scope: str, value: float | None, limit: float) -> Check:
    if value is None or not math.isfinite(value):
        return Check(metric, scope, value, limit, ">=", False, math.inf,
                     "missing" if value is None else "NaN")
    ok = value >= limit
    allowed = 1 - limit
    excess = (1 - value) / allowed - 1 if allowed > 0 else (-1.0 if ok else math.inf)
    return Check(metric, scope, value, limit, ">=", ok, excess)


def _fail(metric: str, scope: str, note: str) -> Check:
    return Check(metric, scope, None, None, "<=", False, math.inf, note)


# ---------------------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class BenchmarkRow:
    shape: str
    batch: int
    name: str
    config: str | None  # canonical string; None for a peer kernel that is not a config
    window_us: float
    nonflush_us: float | None
    flush_us: float | None
    speedup_vs_conv_fp32: float | None
    bw_frac_window: float | None


@dataclass(frozen=True)
class Benchmark:
    """A kernel benchmark CSV (``benchmarks/decode.py``): time per decode step per
    (shape, batch, config)."""

    path: Path
    rows: tuple[BenchmarkRow, ...]

    @property
    def shapes(self) -> list[str]:
        return list(dict.fromkeys(r.shape for r in self.rows))

    def batches(self, shape: str) -> list[int]:
        return sorted({r.batch for r in self.rows if r.shape == shape})

    def lookup(self, shape: str, batch: int, config: str) -> BenchmarkRow | None:
        ck = config_key(config)
        for r in self.rows:
            if r.shape == shape and r.batch == batch and r.config == ck:
                return r
        return None

    def peers(self, shape: str, batch: int) -> list[BenchmarkRow]:
        return [r for r in self.rows if r.shape == shape and r.batch == batch and r.config is None]


_BENCH_REQUIRED = ("shape", "batch", "config_string", "window_us")


def load_benchmark(path: str | Path) -> Benchmark:
    """Read and validate a ``decode.csv``; rows whose ``config_string`` is not a precision
    config (peer kernels such as FLA's) are kept as peers."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"{p}: cannot read the benchmark: {e.strerror or e}") from None
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    missing = [c for c in _BENCH_REQUIRED if c not in cols]
    if missing:
        raise InputError(f"{p}: benchmark CSV lacks column(s) {', '.join(missing)} "
                         f"(has {', '.join(cols) or 'none'})")
    rows: list[BenchmarkRow] = []
    problems: list[str] = []
    seen: set[tuple[str, int, str]] = set()

    def opt(row: dict, key: str) -> float | None:
        v = (row.get(key) or "").strip()
        try:
            return float(v) if v else None
        except ValueError:
            problems.append(f"{p}: line {reader.line_num}: {key} {v!r} is not a number")
            return None

    for row in reader:
        try:
            batch = int(row["batch"])
            window = float(row["window_us"])
        except (TypeError, ValueError):
            problems.append(f"{p}: line {reader.line_num}: batch/window_us are not numbers")
            continue
        try:
            ck: str | None = str(parse_config(row["config_string"]))
        except ValueError:
            ck = None
        name = (row.get("config") or row["config_string"]).strip()
        key = (row["shape"], batch, ck or name)
        if key in seen:
            problems.append(f"{p}: line {reader.line_num}: ({row['shape']}, batch {batch}, "
                            f"{ck or name}) measured twice")
            continue
        seen.add(key)
        rows.append(BenchmarkRow(row["shape"], batch, name, ck, window, opt(row, "nonflush_us"),
                                 opt(row, "flush_us"), opt(row, "speedup_vs_conv_fp32"),
                                 opt(row, "bw_frac_window")))
    if problems:
        raise InputError("\n".join(problems))
    if not rows:
        raise InputError(f"{p}: the benchmark CSV has no rows")
    return Benchmark(p, tuple(rows))


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


# ---------------------------------------------------------------------------------------- result
@dataclass
class Candidate:
    """One config with its cost and its budget checks."""

    name: str
    config: str
    cost: Cost
    checks: list[Check]

    @property
    def qualifies(self) -> bool:
        return self.cost.value is not None and all(c.ok for c in self.checks)

    @property
    def worst_excess(self) -> float:
        """The largest normalised excess over the checks (-inf with no checks)."""
        return max((c.excess for c in self.checks), default=-math.inf)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def reasons(self) -> list[str]:
        out = [c.describe() for c in self.failures]
        if self.cost.value is None:
            out.append(self.cost.note or "cost unknown")
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "config": self.config, "qualifies": self.qualifies,
                "worst_excess": self.worst_excess, "cost": self.cost.to_dict(),
                "checks": [c.to_dict() for c in self.checks], "rejected_because": self.reasons()}


def vllm_additional_config(config: str) -> str:
    """The JSON for ``vllm serve --additional-config`` that selects ``config``."""
    return json.dumps({"replayssm_quant": config})


def vllm_serve_command(model: str, config: str) -> str:
    """A ``vllm serve`` line for the plugin (docs/vllm.md): ReplaySSM configs also need
    ``--use-replayssm`` with their L, and the plugin refuses prefix caching."""
    from .precision import parse_config

    cfg = parse_config(config)
    flags = ["VLLM_USE_V2_MODEL_RUNNER=0 vllm serve", model]
    if cfg.L > 1:
        flags += ["--use-replayssm", f"--replayssm-buffer-len {cfg.L}"]
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

    @property
    def exit_code(self) -> int:
        return 0 if self.chosen is not None else EXIT_NONE_QUALIFIES

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
            "status": "ok" if pick is not None else "none_qualifies",
            "name": pick.name if pick else None,
            "config": pick.config if pick else None,
            "vllm_additional_config": vllm_additional_config(pick.config) if pick else None,
            "closest": ({"name": self.closest.name, "config": self.closest.config,
                         "worst_excess": self.closest.worst_excess,
                         "rejected_because": self.closest.reasons()}
                        if pick is None and self.closest is not None else None),
            "cost_basis": self.cost_basis,
            "cost_unit": _UNITS[self.cost_basis],
            "shape": asdict(self.shape),
            "budget": self.budget.to_dict(),
            "evidence": self.evidence,
            "not_checked": self.not_checked,
            "rejected_cheaper": [{"name": c.name, "config": c.config, "reasons": c.reasons()}
                                 for c in (self.rejected_cheaper if pick else [])],
            "candidates": [c.to_dict() for c in self.candidates],
        })

    def to_markdown(self) -> str:
        from .report.render import recommendation_markdown

        return recommendation_markdown(self)

    def write(self, out: str | Path) -> dict[str, Path]:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        files = {"json": d / "recommendation.json", "markdown": d / "recommendation.md"}
        files["json"].write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        files["markdown"].write_text(self.to_markdown())
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
def _drift_checks(drift: DriftResults, key: str, budget: Budget, bucket: str,
                  cross: list = ()) -> list[Check]:
    dc = drift.config(key)
    scope = "all positions" if bucket == "all" else bucket
    if dc is None:
        return [_fail("drift", scope, "no drift result for this config")]
    checks: list[Check] = []
    for issue in drift.config_issues(key):
        checks.append(_fail("drift", scope, f"{issue.kind} result: {issue.message}"))
    for issue in cross:
        checks.append(_fail("results", "drift and tasks", f"{issue.kind}: {issue.message}"))
    stats = dc.stats(bucket)
    if stats is None:
        return checks + [_fail("drift", scope, f"no drift statistics for bucket {bucket}")]
    if budget.max_kl is not None:
        value = stats.get(budget.kl_stat)
        if value is None:
            raise InputError(f"{drift.path}: drift statistics have no {budget.kl_stat!r}; "
                             f"kl_stat must be one of "
                             f"{', '.join(k for k in stats.values if k.startswith('kl_'))}")
        checks.append(_upper(budget.kl_stat, scope, value, budget.max_kl))
    if budget.min_same_top1 is not None:
        checks.append(_lower_rate("same_top1", scope, stats.get("same_top1"),
                                  budget.min_same_top1))
    if budget.max_ppl_ratio is not None:
        v = stats.get("ppl_ratio")
        # excess relative to the allowed increase above 1, like the other limits
        allowed = budget.max_ppl_ratio - 1
        if allowed > 0 and v is not None and math.isfinite(v):
            c = _upper("ppl_ratio", scope, v, budget.max_ppl_ratio)
            checks.append(replace(c, excess=(v - 1) / allowed - 1))
        else:
            checks.append(_upper("ppl_ratio", scope, v, budget.max_ppl_ratio))
    return checks


def _task_checks(m: ModelResults, key: str, budget: Budget) -> list[Check]:
    tasks = m.tasks
    assert tasks is not None
    checks: list[Check] = []
    for task in tasks.tasks:
        limit = budget.drop_limit(task)
        if limit is None:
            continue
        metric = "accuracy drop (upper 95% bound, points)"
        if tasks.is_reference(key):
            checks.append(Check(metric, task, 0.0, limit, "<=", True,
                                -1.0 if limit > 0 else 0.0, "the reference itself"))
            continue
        row = tasks.row(task, key)
        if row is None:
            checks.append(_fail(metric, task, "no result for this config on this task"))
            continue
        for issue in tasks.row_issues(task, key):
            checks.append(_fail(metric, task, f"{issue.kind} result: {issue.message}"))
        checks.append(_upper(metric, task, row.drop_hi_points, limit,
                             scale=limit if limit > 0 else 1.0))
    return checks


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
    batch measured). ``cost_basis``: ``auto`` (time with a benchmark, else bytes), ``bytes``,
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
    if results.drift is None and budget.require_drift:
        raise InputError(f"no drift results for {results.model!r}; the budget requires them "
                         "(set require_drift: false to recommend from task results alone)")

    evidence: dict[str, Any] = {
        "drift": str(results.drift.path) if results.drift else None,
        "tasks": str(results.tasks.path) if results.tasks else None,
        "tasks_reference": results.tasks.reference if results.tasks else None,
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
        cfg = parse_config(key)
        sb = step_bytes(cfg, layer)
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
        checks: list[Check] = []
        if results.drift is not None:
            cross = [i for i in results.cross_issues if i.config == key]
            checks += _drift_checks(results.drift, key, budget, bucket, cross)
        if results.tasks is not None:
            checks += _task_checks(results, key, budget)
        elif budget.require_tasks:
            checks.append(_fail("task accuracy", "all tasks", "no task results (required by "
                                                             "the budget)"))
        candidates.append(Candidate(results.label(key), key, cost, checks))
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
    return Recommendation(results.model, budget, layer, basis, candidates, chosen, closest,
                          evidence, not_checked)
