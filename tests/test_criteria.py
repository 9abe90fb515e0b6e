"""The one check language: a check passes, fails, fails closed on NaN and missing values, and
both YAML schemas (the recommender's budget, the gate's policy) compile into it and agree."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from replayssm_quant.precision import PrecisionConfig, parse_config
from replayssm_quant.results import (
    Budget,
    Check,
    Criteria,
    Outcome,
    evaluate,
    judge,
    load_policy,
    load_results,
    parse_policy,
)
from tests.resultdata import write_drift, write_tasks

ROOT = Path(__file__).resolve().parents[1]
KL = {"fp32": 1e-12, "nvfp4-read/fp32": 0.002, "shared-nvfp4": 0.05}
TASKS = {("gpqa", "nvfp4-read/fp32"): (0.70, -0.004), ("gpqa", "shared-nvfp4"): (0.64, -0.1)}
KL_CHECK = Check("kl", "drift", "kl_mean", ("*",), "last", max=0.01)


def _model(tmp_path, kl=None):
    paths = [write_drift(tmp_path / "drift", kl or KL), write_tasks(tmp_path / "tasks", TASKS)]
    return load_results(paths).model()


def test_judge_pass_fail_and_excess():
    ok = judge(KL_CHECK, 0.005, scope="last")
    assert isinstance(ok, Outcome) and ok.status == "pass" and ok.ok
    assert ok.excess == pytest.approx(-0.5) and (ok.limit, ok.op) == (0.01, "<=")
    bad = judge(KL_CHECK, 0.034, scope="[256,511)")
    assert bad.status == "fail" and not bad.ok
    assert bad.describe() == "kl_mean in [256,511) = 0.034 > 0.01 (3.4x the allowance)"
    # a lower limit on an agreement rate: disagreement against the allowed disagreement
    top1 = Check("top1", "drift", "same_top1", min=0.99, miss="rate")
    assert judge(top1, 0.985, scope="all").excess == pytest.approx(0.5)
    # relative limits: value <= ref * max_ratio + max_increase
    rel = Check("rel", "drift", "kl_mean", relative_to="baseline", max_ratio=1.5,
                max_increase=1e-6)
    assert judge(rel, 0.0015, 0.001, scope="last").ok
    assert judge(rel, 0.0016, 0.001, scope="last").status == "fail"


@pytest.mark.parametrize("value,kind", [(math.nan, "nan"), (math.inf, "nan"), (None, "missing")])
def test_nan_and_missing_fail_closed(value, kind):
    o = judge(KL_CHECK, value, scope="last")
    assert o.status == "error" and o.kind == kind and not o.ok and o.excess == math.inf


def test_evaluate_on_results(tmp_path):
    m = _model(tmp_path)
    crit = Criteria((KL_CHECK,))
    by = {o.config: o for o in evaluate(m, KL_CHECK, crit)}
    assert by["fp32"].ok and by["nvfp4-read/fp32"].ok
    assert by["shared-nvfp4"].status == "fail" and by["shared-nvfp4"].scope == "[1024,2047)"
    # NaN in the results: an error for that config, never a pass
    m = _model(tmp_path / "nan", KL | {"nvfp4-read/fp32": math.nan})
    by = {o.config: o for o in evaluate(m, KL_CHECK, crit)}
    assert by["nvfp4-read/fp32"].status == "error" and by["nvfp4-read/fp32"].kind == "nan"
    # a config the check names but the results lack
    absent = Check("x", "drift", "kl_mean", ("fp16-sr",), max=1)
    (o,) = evaluate(m, absent, Criteria((absent,)))
    assert o.status == "error" and o.kind == "missing" and "fp16-sr" in o.note


def test_loader_parses_configs_once(tmp_path):
    m = _model(tmp_path)
    assert all(isinstance(c, PrecisionConfig) for c in m.configs())
    assert m.tasks is not None and m.tasks.reference == parse_config("fp32")
    assert m.drift.config("nvfp4-read/fp32").config == parse_config("ckpt=fp32,read=nvfp4,L=16")


def test_budget_yaml_compiles_to_checks(tmp_path):
    f = tmp_path / "budget.yaml"
    f.write_text("budget:\n  max_kl: 0.005\n  min_same_top1: 0.98\n"
                 "  task_max_accuracy_drop: {gpqa: 2.0}\n")
    crit = Budget.from_yaml(f).criteria(["gpqa", "math"])
    assert isinstance(crit, Criteria) and crit.require_drift and not crit.require_tasks
    by = {c.metric: c for c in crit.checks if c.source == "drift"}
    assert by["kl_mean"].max == 0.005 and by["kl_mean"].bucket == "last"
    assert by["same_top1"].min == 0.98 and by["same_top1"].miss == "rate"
    drops = {c.tasks: c.max for c in crit.checks if c.source == "tasks"}
    assert drops == {("gpqa",): 2.0, ("math",): 1.0}


def test_policy_yaml_compiles_to_checks():
    crit = load_policy(ROOT / "ci" / "drift_policy.yaml")
    assert isinstance(crit, Criteria) and crit.require_drift
    assert all(isinstance(c, Check) for c in crit.checks) and len(crit.checks) == 7
    text = (ROOT / "docs" / "gate.md").read_text()
    import yaml

    block = text.split("## Policy schema", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    assert parse_policy(yaml.safe_load(block)).needs_baseline


def test_budget_and_policy_agree(tmp_path):
    """The same limit written in either schema gives the same verdict per config."""
    import yaml

    m = _model(tmp_path)
    budget = Budget.from_mapping({"max_kl": 0.01, "min_same_top1": None,
                                  "max_accuracy_drop": None}).criteria()
    policy = parse_policy(yaml.safe_load(
        "version: 1\nchecks:\n  - {metric: kl_mean, bucket: last, configs: '*', max: 0.01}\n"))
    (b_check,), (p_check,) = budget.checks, policy.checks
    b = {o.config: o.status for o in evaluate(m, b_check, budget)}
    p = {o.config: o.status for o in evaluate(m, p_check, policy)}
    assert b == p == {"fp32": "pass", "nvfp4-read/fp32": "pass", "shared-nvfp4": "fail"}


# ---------------------------------------------------------------------------------- undecided
DROP = Budget(max_accuracy_drop=1.0)


def _task_outcomes(tmp_path, budget=DROP, **kw):
    from tests.resultdata import paired_tasks

    m = load_results([paired_tasks(tmp_path / "t", {"nvfp4-read/fp32": 0, "shared-nvfp4": 150},
                                   **kw)]).model()
    crit = budget.criteria(m.tasks.tasks)
    (check,) = crit.checks[-1:]
    return {o.config: o for o in evaluate(m, check, crit)}


def test_small_sample_is_undecided_not_a_pass(tmp_path):
    # 4 items, every answer the same: Tango's interval is wide, so the drop's bound straddles
    # the 1-point limit; a bootstrap would have said [0, 0] and passed
    by = _task_outcomes(tmp_path, n=4)
    o = by["nvfp4-read/fp32"]
    assert o.status == "undecided" and not o.ok and "too few items (4)" in o.note
    assert "undecided" in o.describe()


def test_big_concordant_sample_passes_and_positive_control_fails(tmp_path):
    by = _task_outcomes(tmp_path, n=500)
    assert by["nvfp4-read/fp32"].ok and by["nvfp4-read/fp32"].value < 1.0
    bad = by["shared-nvfp4"]  # 150 of 500 items turn wrong: a 30-point drop
    assert bad.status == "fail" and bad.value > 25


@pytest.mark.parametrize("kw,reason", [
    ({"truncation": 0.5}, "50% of answers truncated (limit 10%)"),
    ({"invalid": 0.25}, "25% of answers invalid (limit 10%)"),
    ({"method": None}, "interval method unknown"),
    ({"method": "bootstrap"}, "interval method 'bootstrap' is not valid at small n"),
])
def test_thin_evidence_is_undecided(tmp_path, kw, reason):
    by = _task_outcomes(tmp_path, n=500, **kw)
    for config in ("nvfp4-read/fp32", "shared-nvfp4"):
        assert by[config].status == "undecided" and reason in by[config].note
    # the reference's own answers count too: all truncated, it cannot anchor a comparison
    if "truncation" in kw:
        assert by["fp32"].status == "undecided" and by["fp32"].note.startswith("reference:")


def test_evidence_limits_are_settable(tmp_path):
    loose = Budget(max_accuracy_drop=1.0, max_truncation_rate=0.6)
    assert _task_outcomes(tmp_path, loose, n=500, truncation=0.5)["nvfp4-read/fp32"].ok
    pol = parse_policy({"version": 1, "evidence": {"max_truncation_rate": 0.6,
                                                   "allow_undecided": True},
                        "checks": [{"source": "tasks", "metric": "drop_hi_points", "max": 1}]})
    assert pol.evidence.max_truncation_rate == 0.6 and pol.evidence.allow_undecided
    with pytest.raises(Exception, match="evidence: unknown key 'max_truncated'"):
        parse_policy({"version": 1, "evidence": {"max_truncated": 0.1},
                      "checks": [{"source": "tasks", "metric": "drop_hi_points", "max": 1}]})
    from replayssm_quant.results import InputError

    with pytest.raises(InputError, match="fraction"):
        Budget(max_truncation_rate=10)
