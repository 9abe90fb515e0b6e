"""CI accuracy gate: check result folders against a YAML policy of thresholds.

A gate that passes when results are missing is worse than no gate, so it fails closed: a
required model, config, task or bucket that is absent (``missing``), a metric that is NaN
(``nan``), a run that stopped early or scored fewer items than it should (``partial``), and
results that cannot be compared (other model, other data or settings than the baseline, the
same name for two configs: ``mismatched``) are all errors, never passes.

Outcomes follow JUnit: a threshold that is not met is a *failure* (exit 1); a result the gate
cannot trust, or input it cannot read, is an *error* (exit 2). Errors win over failures,
because a verdict computed from broken results is not a verdict. The policy schema is
documented in ``docs/gate.md``.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .evals.results import (
    DRIFT_REQUIRED_STATS,
    TASK_REQUIRED_FIELDS,
    ModelResults,
    ResultsError,
    ResultSet,
    config_key,
    load_results,
)

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAIL",
    "EXIT_PASS",
    "CheckSpec",
    "GateCase",
    "GateResult",
    "Policy",
    "PolicyError",
    "load_policy",
    "run_gate",
]

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

DRIFT_METRICS: tuple[str, ...] = DRIFT_REQUIRED_STATS + (
    "kl_se", "kl_p95", "kl_p99_9", "same_top1_lo", "same_top1_hi", "dp_mean", "dp_rms",
    "ppl_ref", "ppl", "ppl_ratio_lo", "ppl_ratio_hi",
)
TASK_METRICS: tuple[str, ...] = TASK_REQUIRED_FIELDS[2:] + ("drop_hi_points",)
"""Task metrics: the row fields, plus ``drop_hi_points`` (upper 95% bound of the paired accuracy
drop in points, ``-100 * delta_lo``)."""

_RELATIVE_KEYS = ("max_ratio", "min_ratio", "max_increase", "max_decrease")
_BOUND_KEYS = ("max", "min") + _RELATIVE_KEYS
_CHECK_KEYS = {"name", "source", "metric", "configs", "bucket", "tasks", "relative_to",
               *_BOUND_KEYS}
_POLICY_KEYS = {"version", "models", "reference", "require", "checks"}
_REQUIRE_KEYS = {"drift", "configs", "tasks"}


class PolicyError(ValueError):
    """A policy file the gate cannot use; one line per problem."""


# ---------------------------------------------------------------------------------------- policy
@dataclass(frozen=True)
class CheckSpec:
    """One threshold of the policy, applied to every selected (model, config, bucket|task)."""

    name: str
    source: str
    metric: str
    configs: tuple[str, ...] | None  # None: the required configs, else every config
    bucket: str = "last"
    tasks: tuple[str, ...] | None = None  # None: the required tasks, else every task
    relative_to: str | None = None
    max: float | None = None
    min: float | None = None
    max_ratio: float | None = None
    min_ratio: float | None = None
    max_increase: float | None = None
    max_decrease: float | None = None

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
class Policy:
    version: int
    models: tuple[str, ...] | None
    reference: str
    require_drift: bool
    require_configs: tuple[str, ...]
    require_tasks: tuple[str, ...]
    checks: tuple[CheckSpec, ...]
    path: Path | None = None

    @property
    def needs_baseline(self) -> bool:
        return any(c.relative_to == "baseline" for c in self.checks)


def _names(value: Any, what: str, problems: list[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if value == "*":
        return ("*",)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{what} must be a list of names or '*'")
        return None
    return tuple(value)


def _number(value: Any, what: str, problems: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"{what} must be a finite number, got {value!r}")
        return None
    return float(value)


def parse_policy(data: Any, path: Path | None = None) -> Policy:
    """Validate a policy mapping; :class:`PolicyError` lists every problem."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise PolicyError("a policy is a YAML mapping with 'version', 'require' and 'checks'")
    for k in sorted(set(data) - _POLICY_KEYS):
        problems.append(f"unknown key {k!r} (keys: {', '.join(sorted(_POLICY_KEYS))})")
    version = data.get("version", 1)
    if version != 1:
        problems.append(f"version must be 1, got {version!r}")
    models = _names(data.get("models"), "models", problems)
    if models == ("*",):
        models = None
    reference = data.get("reference", "fp32")
    if not isinstance(reference, str):
        problems.append("reference must be a config name or string")
        reference = "fp32"
    req = data.get("require") or {}
    if not isinstance(req, Mapping):
        problems.append("require must be a mapping")
        req = {}
    for k in sorted(set(req) - _REQUIRE_KEYS):
        problems.append(f"require: unknown key {k!r} (keys: {', '.join(sorted(_REQUIRE_KEYS))})")
    req_drift = req.get("drift", False)
    if not isinstance(req_drift, bool):
        problems.append("require.drift must be true or false")
        req_drift = False
    req_configs = _names(req.get("configs"), "require.configs", problems) or ()
    req_tasks = _names(req.get("tasks"), "require.tasks", problems) or ()
    for label in req_configs:
        if label != "*" and config_key(label) == label and "=" not in label:
            problems.append(f"require.configs: {label!r} is neither a preset nor a config string")
    checks_raw = data.get("checks") or []
    if not isinstance(checks_raw, list):
        problems.append("checks must be a list")
        checks_raw = []
    if not checks_raw and not (req_configs or req_tasks or req_drift):
        problems.append("the policy checks nothing: give 'checks' or 'require'")
    checks: list[CheckSpec] = []
    names: set[str] = set()
    for i, c in enumerate(checks_raw):
        where = f"checks[{i}]"
        if not isinstance(c, Mapping):
            problems.append(f"{where} must be a mapping")
            continue
        for k in sorted(set(c) - _CHECK_KEYS):
            problems.append(f"{where}: unknown key {k!r} (keys: {', '.join(sorted(_CHECK_KEYS))})")
        source = c.get("source", "drift")
        if source not in ("drift", "tasks"):
            problems.append(f"{where}: source must be drift or tasks, got {source!r}")
            continue
        metric = c.get("metric")
        known = DRIFT_METRICS if source == "drift" else TASK_METRICS
        if metric not in known:
            problems.append(f"{where}: metric {metric!r} is not a {source} metric "
                            f"({', '.join(known)})")
            continue
        rel = c.get("relative_to")
        if rel not in (None, "reference", "baseline"):
            problems.append(f"{where}: relative_to must be reference or baseline, got {rel!r}")
            continue
        bounds = {k: _number(c.get(k), f"{where}: {k}", problems) for k in _BOUND_KEYS}
        if all(v is None for v in bounds.values()):
            problems.append(f"{where}: no bound; give max/min, or with relative_to "
                            f"{'/'.join(_RELATIVE_KEYS)}")
            continue
        rel_given = [k for k in _RELATIVE_KEYS if bounds[k] is not None]
        if rel_given and rel is None:
            problems.append(f"{where}: {', '.join(rel_given)} need relative_to "
                            "(reference or baseline)")
            continue
        if rel is not None and not rel_given:
            problems.append(f"{where}: relative_to {rel} needs one of "
                            f"{', '.join(_RELATIVE_KEYS)}")
            continue
        bucket = c.get("bucket", "last")
        if source == "tasks" and "bucket" in c:
            problems.append(f"{where}: bucket applies to drift checks only")
        if not isinstance(bucket, str):
            problems.append(f"{where}: bucket must be last, all, each or a bucket label")
            continue
        if source == "drift" and "tasks" in c:
            problems.append(f"{where}: tasks applies to task checks only")
        default = f"{source}-{metric}-{bucket if source == 'drift' else 'tasks'}"
        name = c.get("name") or (default + (f"-vs-{rel}" if rel else ""))
        if not isinstance(name, str):
            problems.append(f"{where}: name must be a string")
            continue
        if name in names:
            problems.append(f"{where}: name {name!r} used twice")
        names.add(name)
        checks.append(CheckSpec(
            name=name, source=source, metric=metric,
            configs=_names(c.get("configs"), f"{where}: configs", problems),
            bucket=bucket, tasks=_names(c.get("tasks"), f"{where}: tasks", problems),
            relative_to=rel, **bounds))
    if problems:
        where = f"{path}: " if path else ""
        raise PolicyError("\n".join(where + p for p in problems))
    return Policy(version=1, models=models, reference=reference, require_drift=req_drift,
                  require_configs=req_configs, require_tasks=req_tasks, checks=tuple(checks),
                  path=path)


def load_policy(path: str | Path) -> Policy:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise PolicyError(f"{p}: cannot read the policy: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise PolicyError(f"{p}: not valid YAML: {' '.join(str(e).split())}") from None
    return parse_policy(data, p)


# ---------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class GateCase:
    """One JUnit test case: a threshold on one value, or one integrity requirement.

    ``status``: pass, fail (threshold not met) or error (``kind``: missing, nan, partial,
    mismatched, invalid).
    """

    group: str
    name: str
    status: str
    message: str = ""
    kind: str | None = None
    model: str | None = None
    value: float | None = None
    limit: str = ""


@dataclass
class GateResult:
    cases: list[GateCase] = field(default_factory=list)
    policy: Policy | None = None
    inputs: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateCase]:
        return [c for c in self.cases if c.status == "fail"]

    @property
    def errors(self) -> list[GateCase]:
        return [c for c in self.cases if c.status == "error"]

    @property
    def exit_code(self) -> int:
        if self.errors:
            return EXIT_ERROR
        return EXIT_FAIL if self.failures else EXIT_PASS

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: "PASS", EXIT_FAIL: "FAIL", EXIT_ERROR: "ERROR"}[self.exit_code]

    def junit_xml(self) -> str:
        """JUnit XML in the shape CI test reporters read (GitHub, GitLab, Jenkins)."""
        suites = ET.Element("testsuites", name="replayssm-quant gate")
        groups: dict[str, list[GateCase]] = {}
        for c in self.cases:
            groups.setdefault(c.group, []).append(c)
        total = {"tests": 0, "failures": 0, "errors": 0}
        for group, cases in groups.items():
            suite = ET.SubElement(suites, "testsuite", name=group, tests=str(len(cases)),
                                  failures=str(sum(c.status == "fail" for c in cases)),
                                  errors=str(sum(c.status == "error" for c in cases)),
                                  skipped="0", time="0")
            for c in cases:
                tc = ET.SubElement(suite, "testcase", classname=group, name=c.name, time="0")
                if c.status == "fail":
                    el = ET.SubElement(tc, "failure", message=c.message, type="threshold")
                    el.text = c.message
                elif c.status == "error":
                    el = ET.SubElement(tc, "error", message=c.message, type=c.kind or "error")
                    el.text = c.message
                elif c.message:
                    ET.SubElement(tc, "system-out").text = c.message
            total["tests"] += len(cases)
            total["failures"] += int(suite.get("failures"))
            total["errors"] += int(suite.get("errors"))
        for k, v in total.items():
            suites.set(k, str(v))
        ET.indent(suites)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"

    def markdown(self) -> str:
        """A summary for a CI job page (``$GITHUB_STEP_SUMMARY``): verdict, problems first."""
        icon = {"PASS": "✅", "FAIL": "❌", "ERROR": "⛔"}[self.verdict]
        n = len(self.cases)
        lines = [f"## {icon} replayssm-quant gate: {self.verdict}", ""]
        pol = self.policy.path if self.policy and self.policy.path else "the policy"
        lines.append(f"{n} check(s) of `{pol}` on {', '.join(f'`{i}`' for i in self.inputs)}: "
                     f"{n - len(self.failures) - len(self.errors)} passed, "
                     f"{len(self.failures)} failed, {len(self.errors)} error(s).")
        lines.append("")
        if self.errors:
            lines += ["### Errors (results the gate cannot trust)", "",
                      "| kind | check | case | problem |", "|---|---|---|---|"]
            lines += [f"| {c.kind} | {_md(c.group)} | {_md(c.name)} | {_md(c.message)} |"
                      for c in self.errors]
            lines.append("")
        if self.failures:
            lines += ["### Failures", "", "| check | case | value | limit |",
                      "|---|---|---:|---|"]
            lines += [f"| {_md(c.group)} | {_md(c.name)} | {_fmt(c.value)} | {_md(c.limit)} |"
                      for c in self.failures]
            lines.append("")
        passed = [c for c in self.cases if c.status == "pass"]
        if passed:
            lines += ["<details><summary>Passed checks</summary>", "",
                      "| check | case | value | limit |", "|---|---|---:|---|"]
            lines += [f"| {_md(c.group)} | {_md(c.name)} | {_fmt(c.value)} | {_md(c.limit)} |"
                      for c in passed]
            lines += ["", "</details>", ""]
        return "\n".join(lines)

    def write(self, junit: str | Path | None, markdown: str | Path | None) -> None:
        for path, text in ((junit, self.junit_xml), (markdown, self.markdown)):
            if path is not None:
                p = Path(path)
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text())


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.4g}" if 1e-3 <= abs(x) < 1e5 else f"{x:.3e}"


# ---------------------------------------------------------------------------------------- core
_SELF_PAIRED = ("delta", "delta_lo", "delta_hi", "drop_hi_points", "flip_rate")
_COMPARED_DRIFT = ("data", "prefill", "max_tokens", "seed", "reference", "model_type")


class _Run:
    """Evaluation state: the cases found so far."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.cases: list[GateCase] = []

    def error(self, group: str, name: str, kind: str, message: str,
              model: str | None = None) -> None:
        self.cases.append(GateCase(group, name, "error", message, kind, model))

    def ok(self, group: str, name: str, message: str, model: str | None = None) -> None:
        self.cases.append(GateCase(group, name, "pass", message, None, model))


def _integrity(run: _Run, rs: ResultSet, baseline: ResultSet | None) -> list[str]:
    """Cases for what must be present and comparable; returns the models to check."""
    pol = run.policy
    models = list(rs.models)
    if pol.models is not None:
        for m in pol.models:
            if m not in rs.models:
                run.error("integrity", f"model {m}", "missing",
                          f"no results for model {m!r} (results hold "
                          f"{', '.join(map(repr, rs.models))})", m)
        for m in rs.models:
            if m not in pol.models:
                run.error("integrity", f"model {m}", "mismatched",
                          f"results for model {m!r}, which the policy does not name "
                          f"({', '.join(map(repr, pol.models))})", m)
        models = [m for m in pol.models if m in rs.models]
    for name in models:
        m = rs.models[name]
        group = f"integrity {name}"
        for issue in m.issues:
            run.error(group, issue.where, issue.kind, issue.message, name)
        if pol.require_drift:
            if m.drift is None:
                run.error(group, "drift results", "missing", "no drift results", name)
            else:
                run.ok(group, "drift results", str(m.drift.path), name)
        for label in pol.require_configs:
            if label == "*":
                continue
            if m.drift is not None or pol.require_drift:
                if m.drift is None or m.drift.config(label) is None:
                    run.error(group, f"drift config {label}", "missing",
                              f"no drift result for config {label!r}", name)
                else:
                    run.ok(group, f"drift config {label}", "present", name)
        tasks = list(pol.require_tasks)
        if tasks and m.tasks is None:
            run.error(group, "task results", "missing",
                      f"no task results (required: {', '.join(tasks)})", name)
        elif m.tasks is not None:
            for task in tasks or m.tasks.tasks:
                if task not in m.tasks.tasks:
                    run.error(group, f"task {task}", "missing", f"no results for task {task!r}",
                              name)
                    continue
                for label in pol.require_configs:
                    if label == "*" or m.tasks.is_reference(label):
                        continue
                    if m.tasks.row(task, label) is None:
                        run.error(group, f"task {task} config {label}", "missing",
                                  f"no result for config {label!r} on task {task!r}", name)
                    else:
                        run.ok(group, f"task {task} config {label}", "present", name)
        if baseline is not None:
            _compare_baseline(run, m, baseline, group)
    return models


def _compare_baseline(run: _Run, m: ModelResults, baseline: ResultSet, group: str) -> None:
    b = baseline.models.get(m.model)
    if b is None:
        run.error(group, "baseline", "mismatched",
                  f"the baseline has no results for model {m.model!r} (it holds "
                  f"{', '.join(map(repr, baseline.models))})", m.model)
        return
    for issue in b.issues:
        run.error(group, f"baseline {issue.where}", issue.kind, issue.message, m.model)
    problems: list[str] = []
    if m.drift is not None and b.drift is not None:
        for key in _COMPARED_DRIFT:
            x, y = getattr(m.drift, key), getattr(b.drift, key)
            if x != y:
                problems.append(f"drift {key} {x!r} vs baseline {y!r}")
        xb = [s.bucket for s in m.drift.buckets]
        yb = [s.bucket for s in b.drift.buckets]
        if xb != yb:
            problems.append(f"drift buckets {xb} vs baseline {yb}")
        for c in m.drift.configs:
            bc = b.drift.config(c.name)
            if bc is not None and bc.config != c.config:
                problems.append(f"config {c.name!r} is {c.config} but {bc.config} in the "
                                "baseline")
    if m.tasks is not None and b.tasks is not None:
        if m.tasks.reference != b.tasks.reference:
            problems.append(f"task reference {m.tasks.reference} vs baseline "
                            f"{b.tasks.reference}")
        for r in m.tasks.rows:
            br = b.tasks.row(r.task, r.config)
            if br is not None and br.n != r.n:
                problems.append(f"task {r.task!r} config {r.name!r} scored {r.n} items, the "
                                f"baseline {br.n}")
    for p in problems:
        run.error(group, "baseline comparable", "mismatched", p, m.model)
    if not problems:
        run.ok(group, "baseline comparable", str(b.drift.path if b.drift else b.tasks.path),
               m.model)


def _selected(spec_configs: tuple[str, ...] | None, policy: Policy,
              available: Sequence[str]) -> list[str]:
    if spec_configs is None:
        spec_configs = tuple(c for c in policy.require_configs if c != "*") or ("*",)
    if spec_configs == ("*",):
        return list(available)
    return list(spec_configs)


def _value(m: ModelResults, spec: CheckSpec, config: str, scope: str
           ) -> tuple[float | None, str | None]:
    """``(value, problem)`` of the spec's metric for one config and bucket/task."""
    if spec.source == "drift":
        if m.drift is None:
            return None, "no drift results"
        c = m.drift.config(config)
        if c is None:
            return None, f"no drift result for config {config!r}"
        st = c.stats(scope)
        if st is None:
            return None, f"config {config!r} has no statistics for bucket {scope}"
        v = st.get(spec.metric)
        return (None, f"no {spec.metric} for config {config!r} in bucket {scope}") if v is None \
            else (v, None)
    if m.tasks is None:
        return None, "no task results"
    if scope not in m.tasks.tasks:
        return None, f"no results for task {scope!r}"
    if m.tasks.is_reference(config) and spec.metric in _SELF_PAIRED:
        return 0.0, None  # the reference paired against itself, by definition
    r = m.tasks.row(scope, config)
    if r is None:
        return None, f"no result for config {config!r} on task {scope!r}"
    if spec.metric == "drop_hi_points":
        return r.drop_hi_points, None
    v = r.get(spec.metric)
    return (None, f"no {spec.metric} for config {config!r} on task {scope!r}") if v is None \
        else (v, None)


def _scopes(m: ModelResults, spec: CheckSpec, policy: Policy) -> tuple[list[str], str | None]:
    if spec.source == "drift":
        if m.drift is None:
            return [], "no drift results"
        if spec.bucket == "each":
            return [b.bucket for b in m.drift.buckets], None
        label = m.drift.resolve_bucket(spec.bucket)
        if label is None:
            return [], (f"no bucket {spec.bucket!r} (buckets: "
                        f"{', '.join(b.bucket for b in m.drift.buckets)})")
        return [label], None
    if m.tasks is None:
        return [], "no task results"
    tasks = spec.tasks or (tuple(policy.require_tasks) or ("*",))
    if tasks == ("*",):
        return m.tasks.tasks, None
    return list(tasks), None


def _check(run: _Run, m: ModelResults, spec: CheckSpec, baseline: ResultSet | None) -> None:
    pol = run.policy
    group = f"{spec.name}"
    scopes, problem = _scopes(m, spec, pol)
    if problem:
        run.error(group, f"{m.model}", "missing", problem, m.model)
        return
    if spec.source == "drift":
        available = [c.name for c in m.drift.configs] if m.drift else []
    else:
        available = list(dict.fromkeys(r.name for r in m.tasks.rows)) if m.tasks else []
    configs = _selected(spec.configs, pol, available)
    if spec.relative_to == "reference" and (spec.configs in (None, ("*",))):
        configs = [c for c in configs if config_key(c) != config_key(pol.reference)]
    if not configs:
        run.error(group, f"{m.model}", "missing", "the check selects no config", m.model)
        return
    for config in configs:
        for scope in scopes:
            case = f"{m.model} · {config} @ {scope}"
            value, problem = _value(m, spec, config, scope)
            if problem:
                run.error(group, case, "missing", problem, m.model)
                continue
            assert value is not None
            if not math.isfinite(value):
                run.error(group, case, "nan", f"{spec.metric} is {value}", m.model)
                continue
            ref = None
            if spec.relative_to is not None:
                if spec.relative_to == "reference":
                    ref, problem = _value(m, spec, pol.reference, scope)
                    what = f"reference {pol.reference}"
                else:
                    assert baseline is not None
                    bm = baseline.models.get(m.model)
                    if bm is None:
                        ref, problem = None, f"the baseline has no model {m.model!r}"
                    else:
                        ref, problem = _value(bm, spec, config, scope)
                    what = "baseline"
                if problem:
                    run.error(group, case, "missing", f"{what}: {problem}", m.model)
                    continue
                assert ref is not None
                if not math.isfinite(ref):
                    run.error(group, case, "nan", f"{what} {spec.metric} is {ref}", m.model)
                    continue
            upper, lower = spec.limits(ref)
            parts = []
            if upper is not None:
                parts.append(f"≤ {_fmt(upper)}")
            if lower is not None:
                parts.append(f"≥ {_fmt(lower)}")
            limit = " and ".join(parts)
            if ref is not None:
                limit += f" ({spec.relative_to} {_fmt(ref)})"
            ok = (upper is None or value <= upper) and (lower is None or value >= lower)
            msg = f"{spec.metric} = {_fmt(value)}, limit {limit}"
            run.cases.append(GateCase(group, case, "pass" if ok else "fail", msg, None,
                                      m.model, value, limit))


def run_gate(results: Sequence[str | Path], policy: Policy | str | Path,
             baseline: Sequence[str | Path] | None = None) -> GateResult:
    """Check ``results`` against ``policy`` (and a stored ``baseline``). Never raises for bad
    input: every problem becomes an error case, so CI always gets a report."""
    out = GateResult(inputs=[str(p) for p in results])
    if not isinstance(policy, Policy):
        try:
            policy = load_policy(policy)
        except PolicyError as e:
            out.cases += [GateCase("policy", "policy", "error", line, "invalid")
                          for line in str(e).splitlines()]
            return out
    out.policy = policy
    if policy.needs_baseline and not baseline:
        out.cases.append(GateCase("policy", "baseline", "error",
                                  "the policy compares with a baseline (relative_to: baseline) "
                                  "but none was given (--baseline)", "missing"))
        return out
    try:
        rs = load_results(results)
    except ResultsError as e:
        out.cases += [GateCase("results", p.split(": ")[0], "error", p, k)
                      for p, k in zip(e.problems, e.kinds, strict=True)]
        return out
    base = None
    if baseline:
        try:
            base = load_results(baseline)
        except ResultsError as e:
            out.cases += [GateCase("baseline", p.split(": ")[0], "error", p, k)
                          for p, k in zip(e.problems, e.kinds, strict=True)]
            return out
    run = _Run(policy)
    models = _integrity(run, rs, base)
    for spec in policy.checks:
        for name in models:
            _check(run, rs.models[name], spec, base)
    out.cases += run.cases
    return out
