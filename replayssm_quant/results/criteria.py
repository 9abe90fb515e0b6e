"""The one check language over results: a :class:`Check` selects a metric (drift statistic in
a position bucket, or task metric on a task) for some configs, sets a threshold (absolute, or
relative to the reference config or a stored baseline) and says how a miss is measured; it is
evaluated per config into an :class:`Outcome`: pass, fail, undecided (task evidence too thin
to decide, :mod:`.evidence`) or error, with the reason.

The recommender's budgets and the gate's policies are two YAML spellings of the same thing:
both compile into :class:`Criteria` (:mod:`.budget`, :mod:`.policy`), so a limit means the same
in both and a missing or NaN value fails closed in both (an ``error`` outcome, never a pass),
as thin task evidence does (``undecided``, never a pass).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..precision import PrecisionConfig
from .evidence import Evidence, decide
from .model import DRIFT_REQUIRED_STATS, TASK_REQUIRED_FIELDS, ModelResults, ResultSet, config_key

__all__ = [
    "BOUND_KEYS",
    "DRIFT_METRICS",
    "MISS_SCALES",
    "RELATIVE_KEYS",
    "TASK_METRICS",
    "Check",
    "Criteria",
    "Outcome",
    "evaluate",
    "failed",
    "judge",
    "lookup",
    "scopes",
]

DRIFT_METRICS: tuple[str, ...] = DRIFT_REQUIRED_STATS + (
    "kl_se", "kl_p95", "kl_p99_9", "same_top1_lo", "same_top1_hi", "dp_mean", "dp_rms",
    "ppl_ref", "ppl", "ppl_ratio_lo", "ppl_ratio_hi",
)
TASK_METRICS: tuple[str, ...] = TASK_REQUIRED_FIELDS[2:] + ("drop_hi_points",)
"""Task metrics: the row fields, plus ``drop_hi_points`` (upper 95% bound of the paired accuracy
drop in points, ``-100 * delta_lo``)."""

SELF_PAIRED = ("delta", "delta_lo", "delta_hi", "drop_hi_points", "flip_rate")
"""Task metrics of the reference paired against itself: 0 by definition."""

RELATIVE_KEYS = ("max_ratio", "min_ratio", "max_increase", "max_decrease")
BOUND_KEYS = ("max", "min") + RELATIVE_KEYS

MISS_SCALES = ("ratio", "rate", "ppl", "points")
"""How a check measures a miss (:attr:`Outcome.excess`), so misses of different metrics compare:
``ratio``: ``value / limit - 1``; ``rate``: a lower limit on an agreement rate, the disagreement
against the allowed disagreement ``(1 - value) / (1 - limit) - 1``; ``ppl``: a ratio whose
perfect value is 1, ``(value - 1) / (limit - 1) - 1``; ``points``: like ratio, with a limit of
0 or below measured in units of 1."""


# ---------------------------------------------------------------------------------------- checks
@dataclass(frozen=True)
class Check:
    """One threshold, applied to every selected (model, config, bucket | task).

    ``configs`` / ``tasks``: None selects the criteria's required ones (else every one), ``("*",)``
    every one. ``bucket``: ``last``, ``first``, ``all``, ``each`` or a bucket label.
    ``label``: how a reader calls the metric (default: its name).
    """

    name: str
    source: str
    metric: str
    configs: tuple[str, ...] | None = None
    bucket: str = "last"
    tasks: tuple[str, ...] | None = None
    relative_to: str | None = None
    max: float | None = None
    min: float | None = None
    max_ratio: float | None = None
    min_ratio: float | None = None
    max_increase: float | None = None
    max_decrease: float | None = None
    label: str | None = None
    miss: str = "ratio"

    @property
    def shown(self) -> str:
        return self.label or self.metric

    def limits(self, ref: float | None) -> tuple[float | None, float | None]:
        """``(upper, lower)`` limits on the value given the comparison value ``ref``."""
        upper = [self.max] if self.max is not None else []
        lower = [self.min] if self.min is not None else []
        if ref is not None:
            if self.max_ratio is not None or self.max_increase is not None:
                upper.append(ref * (self.max_ratio if self.max_ratio is not None else 1.0)
                             + (self.max_increase or 0.0))
            if self.min_ratio is not None or self.max_decrease is not None:
                lower.append(ref * (self.min_ratio if self.min_ratio is not None else 1.0)
                             - (self.max_decrease or 0.0))
        return (min(upper) if upper else None, max(lower) if lower else None)


@dataclass(frozen=True)
class Criteria:
    """Checks plus what must be present: the compiled form of a budget or a policy."""

    checks: tuple[Check, ...]
    reference: str = "fp32"
    models: tuple[str, ...] | None = None
    require_drift: bool = False
    require_configs: tuple[str, ...] = ()
    require_tasks: tuple[str, ...] = ()
    evidence: Evidence = Evidence()
    version: int = 1
    path: Path | None = None

    @property
    def needs_baseline(self) -> bool:
        return any(c.relative_to == "baseline" for c in self.checks)


# ---------------------------------------------------------------------------------------- outcome
@dataclass(frozen=True)
class Outcome:
    """One check on one value. ``status``: pass, fail (threshold not met), undecided (``kind``
    undecided: task evidence too thin to tell pass from fail, :mod:`.evidence`) or error
    (``kind``: missing, nan, partial, mismatched; the value cannot be judged). ``limit``/``op`` is the
    binding bound; ``excess`` how far the value is beyond its allowance (0 at the limit,
    negative inside, infinite when there is no usable value); ``note`` the reason when there is
    no comparison, else a remark."""

    metric: str
    scope: str
    value: float | None
    limit: float | None
    op: str
    status: str
    excess: float
    note: str = ""
    kind: str | None = None
    config: str | None = None
    ref: float | None = None
    upper: float | None = None
    lower: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    @property
    def undecided(self) -> bool:
        return self.status == "undecided"

    def describe(self) -> str:
        """E.g. ``kl_mean in [256,511) = 0.034 > 0.01 (3.4x the allowance)``."""
        if self.value is None or self.limit is None or not math.isfinite(self.value):
            return f"{self.metric} in {self.scope}: {self.note or 'no value'}"
        if self.undecided:
            return (f"{self.metric} in {self.scope} = {_g(self.value)} (limit {self.op} "
                    f"{_g(self.limit)}): undecided: {self.note}")
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
                "limit": self.limit, "op": self.op, "ok": self.ok, "status": self.status,
                "excess": self.excess,
                "note": self.note, "text": self.describe()}


def _g(x: float) -> str:
    if x == 0:
        return "0"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.3e}"


def failed(metric: str, scope: str, note: str, kind: str = "missing",
           config: str | None = None) -> Outcome:
    """An outcome for evidence that is absent or unusable: an error, never a pass."""
    return Outcome(metric, scope, None, None, "<=", "error", math.inf, note, kind, config)


def _excess(check: Check, value: float, upper: float | None, lower: float | None,
            ok: bool) -> float:
    if check.miss == "rate" and lower is not None:
        allowed = 1 - lower
        return (1 - value) / allowed - 1 if allowed > 0 else (-1.0 if ok else math.inf)
    if upper is None:
        assert lower is not None
        return lower / value - 1 if value > 0 else (-1.0 if ok else math.inf)
    if check.miss == "ppl" and upper - 1 > 0:
        return (value - 1) / (upper - 1) - 1
    scale = (upper if upper > 0 else 1.0) if check.miss == "points" else upper
    return value / scale - 1 if scale > 0 else (0.0 if value <= upper else math.inf)


def judge(check: Check, value: float | None, ref: float | None = None, *, scope: str,
          config: str | None = None, by_definition: bool = False) -> Outcome:
    """Compare one value with the check's limits (given the comparison value ``ref`` for a
    relative check). A missing or NaN value is an error: the check fails closed.
    ``by_definition``: the value holds by definition (the reference paired with itself)."""
    upper, lower = check.limits(ref)
    limit, op = (upper, "<=") if upper is not None else (lower, ">=")
    common = dict(metric=check.shown, scope=scope, limit=limit, op=op, config=config, ref=ref,
                  upper=upper, lower=lower)
    if value is None or not math.isfinite(value):
        kind, note = ("missing", "missing") if value is None else ("nan", "NaN")
        return Outcome(value=value, status="error", excess=math.inf, note=note, kind=kind,
                       **common)
    if by_definition:
        return Outcome(value=value, status="pass",
                       excess=-1.0 if limit is not None and limit > 0 else 0.0,
                       note="the reference itself", **common)
    ok = (upper is None or value <= upper) and (lower is None or value >= lower)
    return Outcome(value=value, status="pass" if ok else "fail",
                   excess=_excess(check, value, upper, lower, ok), **common)


# ---------------------------------------------------------------------------------------- select
def lookup(m: ModelResults, check: Check, config: str | PrecisionConfig, scope: str
           ) -> tuple[float | None, str | None]:
    """``(value, problem)`` of the check's metric for one config and bucket/task."""
    if check.source == "drift":
        if m.drift is None:
            return None, "no drift results"
        c = m.drift.config(config)
        if c is None:
            return None, f"no drift result for config {config!r}"
        st = c.stats(scope)
        if st is None:
            return None, f"config {config!r} has no statistics for bucket {scope}"
        v = st.get(check.metric)
        return (None, f"no {check.metric} for config {config!r} in bucket {scope}") \
            if v is None else (v, None)
    if m.tasks is None:
        return None, "no task results"
    if scope not in m.tasks.tasks:
        return None, f"no results for task {scope!r}"
    if m.tasks.is_reference(config) and check.metric in SELF_PAIRED:
        return 0.0, None  # the reference paired against itself, by definition
    r = m.tasks.row(scope, config)
    if r is None:
        return None, f"no result for config {config!r} on task {scope!r}"
    if check.metric == "drop_hi_points":
        return r.drop_hi_points, None
    v = r.get(check.metric)
    return (None, f"no {check.metric} for config {config!r} on task {scope!r}") if v is None \
        else (v, None)


def scopes(m: ModelResults, check: Check, criteria: Criteria) -> tuple[list[str], str | None]:
    """The buckets or tasks a check applies to in one model's results, or why there are none."""
    if check.source == "drift":
        if m.drift is None:
            return [], "no drift results"
        if check.bucket == "each":
            return [b.bucket for b in m.drift.buckets], None
        label = m.drift.resolve_bucket(check.bucket)
        if label is None:
            return [], (f"no bucket {check.bucket!r} (buckets: "
                        f"{', '.join(b.bucket for b in m.drift.buckets)})")
        return [label], None
    if m.tasks is None:
        return [], "no task results"
    tasks = check.tasks or (tuple(criteria.require_tasks) or ("*",))
    if tasks == ("*",):
        return m.tasks.tasks, None
    return list(tasks), None


def _selected(check: Check, criteria: Criteria, available: Sequence[str]) -> list[str]:
    names = check.configs
    if names is None:
        names = tuple(c for c in criteria.require_configs if c != "*") or ("*",)
    if names == ("*",):
        return list(available)
    return list(names)


def evaluate(m: ModelResults, check: Check, criteria: Criteria,
             baseline: ResultSet | None = None) -> list[Outcome]:
    """Every outcome of one check on one model's results: one per selected config and
    bucket/task, or one error (``config`` None) when the check selects nothing there."""
    found, problem = scopes(m, check, criteria)
    if problem:
        return [failed(check.shown, "", problem)]
    if check.source == "drift":
        available = [c.name for c in m.drift.configs] if m.drift else []
    else:
        available = list(dict.fromkeys(r.name for r in m.tasks.rows)) if m.tasks else []
    configs = _selected(check, criteria, available)
    if check.relative_to == "reference" and check.configs in (None, ("*",)):
        configs = [c for c in configs if config_key(c) != config_key(criteria.reference)]
    if not configs:
        return [failed(check.shown, "", "the check selects no config")]
    out: list[Outcome] = []
    for config in configs:
        for scope in found:
            value, problem = lookup(m, check, config, scope)
            if problem:
                out.append(failed(check.shown, scope, problem, config=config))
                continue
            assert value is not None
            if not math.isfinite(value):
                out.append(failed(check.shown, scope, f"{check.metric} is {value}", "nan",
                                  config))
                continue
            ref = None
            if check.relative_to is not None:
                if check.relative_to == "reference":
                    ref, problem = lookup(m, check, criteria.reference, scope)
                    what = f"reference {criteria.reference}"
                else:
                    assert baseline is not None
                    bm = baseline.models.get(m.model)
                    if bm is None:
                        ref, problem = None, f"the baseline has no model {m.model!r}"
                    else:
                        ref, problem = lookup(bm, check, config, scope)
                    what = "baseline"
                if problem:
                    out.append(failed(check.shown, scope, f"{what}: {problem}", config=config))
                    continue
                assert ref is not None
                if not math.isfinite(ref):
                    out.append(failed(check.shown, scope, f"{what} {check.metric} is {ref}",
                                      "nan", config))
                    continue
            outcome = judge(check, value, ref, scope=scope, config=config)
            if check.source == "tasks" and m.tasks is not None:
                outcome = decide(outcome, m.tasks, check.metric, config, scope,
                                 criteria.evidence, absolute=check.relative_to is None)
            out.append(outcome)
    return out
