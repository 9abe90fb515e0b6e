"""Cheap rounds: a run redone with a larger ``--limit`` generates only its new prompts, and
``eval --until-decided`` stops each config once its paired difference is decided.

Answers are planted through the real decode path (a responder) on the carry_chain probe, whose
answer can be read off the prompt: the reference and one config answer right (a pass), a
positive control answers wrong (a fail). Every responder call is one generation.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from replayssm_quant.evals.suite import SuiteProgress, SuiteSettings, run_suite

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "nemotron-h-tiny"
TERMS = 2
CONTROL = "shared-nvfp4"
SAME = "nvfp4-read/fp32"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def carry_answer(context: str) -> int:
    """The walk's end, computed from the problem text."""
    table = [int(v) for _, v in re.findall(r"f\((\d)\) = (\d)", context)[-10:]]
    x = int(re.findall(r"Let \$x_\{0\} = (\d)\$", context)[-1])
    steps = int(re.findall(r"find \$x_\{(\d+)\}\$", context)[-1])
    for _ in range(steps):
        x = table[x]
    return x


class Planted(SuiteProgress):
    """Tracks the running config and answers for it: right, except ``wrong`` configs."""

    def __init__(self, wrong: tuple[str, ...] = ()) -> None:
        self.config = "fp32"
        self.wrong = wrong
        self.calls: list[tuple[str, str]] = []

    def run_started(self, task, config, index, total):
        self.config = config

    def respond(self, context: str, gen_kwargs: dict) -> str:
        self.calls.append((self.config, context))
        x = carry_answer(context)
        if self.config in self.wrong:
            x = (x + 1) % 10
        return f" So $\\boxed{{{x}}}$.\n\nProblem:"


def _settings(limit: int, configs: tuple[str, ...] = ()) -> SuiteSettings:
    return SuiteSettings(model=MODEL, tasks=("carry_chain",), configs=configs, limit=limit,
                         max_gen_toks=64, carry_terms=TERMS, batch_size=8)


def test_larger_limit_generates_only_new_prompts(tmp_path):
    out = tmp_path / "ev"
    plan = Planted()
    cache: dict = {}
    run_suite(_settings(3), out, progress=plan, responder=plan.respond, resamples=100,
              cache=cache)
    first = [c for _, c in plan.calls]
    assert len(first) == 3
    plan.calls.clear()
    res = run_suite(_settings(5), out, progress=plan, responder=plan.respond, resamples=100,
                    cache=cache)
    assert len(plan.calls) == 2 and not set(c for _, c in plan.calls) & set(first)
    log = [json.loads(line) for line in
           (out / "runs" / "carry_chain" / "fp32" / "generations.jsonl").read_text().splitlines()]
    assert sorted(e["reused"] for e in log) == [False, False, True, True, True]
    assert all(e["text"].startswith(" So $\\boxed{") and len(e["key"]) == 64 for e in log)
    row = next(r for r in res.summary["results"] if r["task"] == "carry_chain")
    assert row["n"] == 5 and row["accuracy"] == 1.0
    # another seed is another run: nothing is reused
    plan.calls.clear()
    other = SuiteSettings(**{**_settings(5).__dict__, "seed": 1})
    run_suite(other, out, progress=plan, responder=plan.respond, resamples=100,
              cache=cache)
    assert len(plan.calls) == 5


class _Tracking(SuiteProgress):
    """Passes the CLI's progress through and tells ``plan`` which config is running."""

    def __init__(self, inner, plan: Planted) -> None:
        self.inner, self.plan = inner, plan

    def run_started(self, task, config, index, total):
        self.plan.config = config
        self.inner.run_started(task, config, index, total)

    def requests(self, done, total):
        self.inner.requests(done, total)

    def run_finished(self, *args):
        self.inner.run_finished(*args)


def _cli(out, *extra):
    from typer.testing import CliRunner

    from replayssm_quant.cli.app import app

    return CliRunner().invoke(app, [
        "eval", MODEL, "--tasks", "carry_chain", "--carry-terms", str(TERMS), "-c",
        f"{SAME},{CONTROL}", "--max-gen-toks", "64", "--out", str(out), "--resamples", "200",
        *extra])


def test_until_decided_end_to_end(tmp_path, monkeypatch):
    """fp32 and nvfp4-read/fp32 answer right (pass), shared-nvfp4 answers wrong (fail): both
    are decided before the cap, with fewer generations than the fixed-n run, and recommend
    reads the folder."""
    import replayssm_quant.evals.suite as suite
    from replayssm_quant.recommend import recommend
    from replayssm_quant.results import Budget, load_results

    plan = Planted(wrong=(CONTROL,))
    real = suite.run_suite
    monkeypatch.setattr(suite, "run_suite", lambda settings, out, *, progress=None, **kw: real(
        settings, out, progress=_Tracking(progress, plan), **(kw | {"responder": plan.respond})))
    out = tmp_path / "ev"
    args = ("--until-decided", "--round", "8", "--limit", "40", "--budget-points", "30")
    r = _cli(out, *args)
    assert r.exit_code == 0, r.output
    assert "carry_chain × shared-nvfp4: fail at n=16 items" in r.output
    assert "carry_chain × nvfp4-read/fp32: pass at n=24 items" in r.output
    assert "generations: 64 used, 120 for the fixed-n run (47% saved)" in r.output
    assert len(plan.calls) == 64  # every item generated once: 24 + 24 + 16
    seq = json.loads((out / "sequential.json").read_text())
    rows = seq["tasks"]["carry_chain"]["configs"]
    assert rows[CONTROL]["verdict"] == "fail" and rows[CONTROL]["n"] == 16
    assert rows[SAME]["verdict"] == "pass" and [h["n"] for h in rows[SAME]["history"]] == [
        8, 16, 24]
    assert rows[SAME]["lo"] > -0.3 and rows[CONTROL]["hi"] < -0.3
    assert seq["generations"]["used"] == 64 and seq["generations"]["fixed_n"] == 120
    summary = json.loads((out / "summary.json").read_text())
    n = {x["name"]: x["n"] for x in summary["results"]}
    assert n == {"fp32": 24, SAME: 24, CONTROL: 16}
    rec = recommend(load_results([out]).model(), Budget.from_mapping(
        {"require_drift": False, "max_accuracy_drop": 30, "max_kl": None,
         "min_same_top1": None}))
    verdicts = {c.name: c.verdict for c in rec.candidates}
    assert verdicts[CONTROL] == "rejected" and verdicts[SAME] != "rejected"
    # rerunning the command continues: nothing is generated again
    again = _cli(out, *args)
    assert again.exit_code == 0, again.output
    assert len(plan.calls) == 64
    assert "carry_chain × shared-nvfp4: fail at n=16 items" in again.output


@pytest.mark.parametrize("args, message", [
    (["--round", "0", "--limit", "10"], "--round must be >= 1"),
    (["--round", "20", "--limit", "10"], "must be >= --round"),
    (["--limit", "40", "--alpha", "1.5"], "--alpha must lie in (0, 1)"),
    ([], "--until-decided needs --limit"),
])
def test_until_decided_argument_errors(tmp_path, args, message):
    r = _cli(tmp_path / "ev", "--until-decided", *args)
    assert r.exit_code == 2 and message in r.output, r.output
    assert r.output.count("\n") <= 2


def test_replay_on_fixed_run_matches_the_live_plan(tmp_path, monkeypatch):
    """The same planted answers as above, run at a fixed n of 40: replaying the plan on that
    folder gives the live run's verdicts, item counts and generations (64 of 120)."""
    import replayssm_quant.evals.suite as suite
    from replayssm_quant.evals.until_decided import SequentialPlan, replay_fixed_run

    plan = Planted(wrong=(CONTROL,))
    real = suite.run_suite
    monkeypatch.setattr(suite, "run_suite", lambda settings, out, *, progress=None, **kw: real(
        settings, out, progress=_Tracking(progress, plan), **(kw | {"responder": plan.respond})))
    out = tmp_path / "fixed"
    r = _cli(out, "--limit", "40")
    assert r.exit_code == 0, r.output
    assert len(plan.calls) == 120
    rep = replay_fixed_run(out, "carry_chain", ["fp32", SAME, CONTROL],
                           SequentialPlan(round_size=8, cap=40, budget_points=30))
    rows = rep["configs"]
    assert (rows[CONTROL]["verdict"], rows[CONTROL]["items"]) == ("fail", 16)
    assert (rows[SAME]["verdict"], rows[SAME]["items"]) == ("pass", 24)
    assert rows[CONTROL]["fixed_n_verdict"] == "fail" and rows[SAME]["fixed_n_verdict"] == "pass"
    assert rep["reference_n"] == 24
    assert rep["generations"] == {"used": 64, "fixed_n": 120, "saved": 1 - 64 / 120}
