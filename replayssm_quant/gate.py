"""CI accuracy gate: check result folders against a policy, report an exit code, JUnit XML and a
Markdown summary of the checks.

The policy (``docs/gate.md``) compiles into the check language of
:mod:`replayssm_quant.results.criteria`; this module turns its outcomes into verdicts.

A gate that passes when results are missing is worse than no gate, so it fails closed: a
required model, config, task or bucket that is absent (``missing``), a metric that is NaN
(``nan``), a run that stopped early or scored fewer items than it should (``partial``), and
results that cannot be compared (other model, other data or settings than the baseline, the
same name for two configs: ``mismatched``) are all errors, never passes.

Outcomes follow JUnit: a threshold that is not met is a *failure* (exit 1); a result the gate
cannot trust, or input it cannot read, is an *error* (exit 2). Errors win over failures,
because a verdict computed from broken results is not a verdict. A task check whose evidence
is too thin to decide (:mod:`replayssm_quant.results.evidence`) is a failure of kind
``undecided``, or, where the policy says ``evidence: {allow_undecided: true}``, a *skipped*
case that does not change the exit code.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .results import (
    Check,
    Criteria,
    ModelResults,
    PolicyError,
    ResultsError,
    ResultSet,
    evaluate,
    load_policy,
    load_results,
    parse_policy,
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
    "default_output",
    "parse_policy",
    "run_gate",
]

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

Policy = Criteria
"""A parsed policy is criteria in the one check language."""
CheckSpec = Check


# ---------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class GateCase:
    """One JUnit test case: a threshold on one value, or one integrity requirement.

    ``status``: pass, fail (threshold not met, or ``kind`` undecided), skipped (undecided, allowed
    by the policy) or error (``kind``: missing, nan, partial, mismatched, invalid).
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
    policy: Criteria | None = None
    inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateCase]:
        return [c for c in self.cases if c.status == "fail"]

    @property
    def errors(self) -> list[GateCase]:
        return [c for c in self.cases if c.status == "error"]

    @property
    def skipped(self) -> list[GateCase]:
        return [c for c in self.cases if c.status == "skipped"]

    @property
    def passed(self) -> list[GateCase]:
        return [c for c in self.cases if c.status == "pass"]

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
        total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for group, cases in groups.items():
            suite = ET.SubElement(suites, "testsuite", name=group, tests=str(len(cases)),
                                  failures=str(sum(c.status == "fail" for c in cases)),
                                  errors=str(sum(c.status == "error" for c in cases)),
                                  skipped=str(sum(c.status == "skipped" for c in cases)),
                                  time="0")
            for c in cases:
                tc = ET.SubElement(suite, "testcase", classname=group, name=c.name, time="0")
                if c.status == "fail":
                    el = ET.SubElement(tc, "failure", message=c.message,
                                       type=c.kind or "threshold")
                    el.text = c.message
                elif c.status == "skipped":
                    ET.SubElement(tc, "skipped", message=c.message)
                elif c.status == "error":
                    el = ET.SubElement(tc, "error", message=c.message, type=c.kind or "error")
                    el.text = c.message
                elif c.message:
                    ET.SubElement(tc, "system-out").text = c.message
            total["tests"] += len(cases)
            total["failures"] += int(suite.get("failures"))
            total["errors"] += int(suite.get("errors"))
            total["skipped"] += int(suite.get("skipped"))
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
                     f"{len(self.passed)} passed, "
                     f"{len(self.failures)} failed, {len(self.errors)} error(s)" +
                     (f", {len(self.skipped)} undecided (allowed)." if self.skipped else "."))
        lines.append("")
        for w in self.warnings:
            lines += [f"> warning: {_md(w)}", ""]
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
        if self.skipped:
            lines += ["### Undecided, allowed by the policy (evidence too thin to decide)", "",
                      "| check | case | why |", "|---|---|---|"]
            lines += [f"| {_md(c.group)} | {_md(c.name)} | {_md(c.message)} |"
                      for c in self.skipped]
            lines.append("")
        passed = self.passed
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


def default_output(results: Sequence[str | Path], name: str) -> Path:
    """Where the gate writes ``name`` when no path is given: ``gate/`` inside the first results
    folder (next to the results it judged, never into the current folder)."""
    first = Path(results[0]) if results else Path(".")
    folder = first.parent if first.is_file() else first
    return folder / "gate" / name


# ---------------------------------------------------------------------------------------- core
_COMPARED_DRIFT = ("data", "prefill", "max_tokens", "seed", "reference", "model_type")


class _Run:
    """Evaluation state: the cases found so far."""

    def __init__(self, policy: Criteria) -> None:
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


def _check(run: _Run, m: ModelResults, spec: Check, baseline: ResultSet | None) -> None:
    """One JUnit case per outcome of ``spec`` on the model's results."""
    group = f"{spec.name}"
    for o in evaluate(m, spec, run.policy, baseline):
        case = f"{m.model} · {o.config} @ {o.scope}" if o.config is not None else f"{m.model}"
        if o.status == "error":
            run.error(group, case, o.kind or "missing", o.note, m.model)
            continue
        if o.undecided:
            allowed = run.policy.evidence.allow_undecided
            msg = (f"{spec.metric} undecided: {o.note}" +
                   (" (allowed by the policy: evidence.allow_undecided)" if allowed else ""))
            run.cases.append(GateCase(group, case, "skipped" if allowed else "fail", msg,
                                      "undecided", m.model, o.value))
            continue
        parts = []
        if o.upper is not None:
            parts.append(f"≤ {_fmt(o.upper)}")
        if o.lower is not None:
            parts.append(f"≥ {_fmt(o.lower)}")
        limit = " and ".join(parts)
        if o.ref is not None:
            limit += f" ({spec.relative_to} {_fmt(o.ref)})"
        msg = f"{spec.metric} = {_fmt(o.value)}, limit {limit}"
        run.cases.append(GateCase(group, case, o.status, msg, None, m.model, o.value, limit))


def run_gate(results: Sequence[str | Path], policy: Criteria | str | Path,
             baseline: Sequence[str | Path] | None = None) -> GateResult:
    """Check ``results`` against ``policy`` (and a stored ``baseline``). Never raises for bad
    input: every problem becomes an error case, so CI always gets a report."""
    out = GateResult(inputs=[str(p) for p in results])
    if not isinstance(policy, Criteria):
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
        out.warnings += rs.warnings
    except ResultsError as e:
        out.cases += [GateCase("results", p.split(": ")[0], "error", p, k)
                      for p, k in zip(e.problems, e.kinds, strict=True)]
        return out
    base = None
    if baseline:
        try:
            base = load_results(baseline)
            out.warnings += base.warnings
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
