"""The CI gate: passes, fails on thresholds (exit 1), and fails closed (exit 2) on missing,
NaN, partial and mismatched results and on invalid policies; writes JUnit and Markdown."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.gate import load_policy, parse_policy, run_gate
from tests.resultdata import drift_summary, write_drift, write_tasks

ROOT = Path(__file__).resolve().parents[1]
MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-4B"
KL = {"fp32": 1e-12, "nvfp4-read/fp32": 0.002, "shared-nvfp4": 0.05}
TASKS = {("gpqa", "nvfp4-read/fp32"): (0.70, -0.004), ("gpqa", "shared-nvfp4"): (0.64, -0.1),
         ("math", "nvfp4-read/fp32"): (0.70, -0.005), ("math", "shared-nvfp4"): (0.66, -0.07)}

POLICY = {
    "version": 1,
    "models": [MODEL],
    "require": {"drift": True, "configs": ["fp32", "nvfp4-read/fp32"], "tasks": ["gpqa", "math"]},
    "checks": [
        {"name": "kl-long", "metric": "kl_mean", "bucket": "last", "max": 0.01},
        {"name": "top1", "metric": "same_top1", "bucket": "all", "min": 0.99},
        {"name": "drop", "source": "tasks", "metric": "drop_hi_points", "max": 1.0},
        {"name": "trunc", "source": "tasks", "metric": "truncation_rate",
         "relative_to": "reference", "max_increase": 0.02},
    ],
}

runner = CliRunner()


def _policy(tmp_path: Path, policy: dict | None = None, name: str = "policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(policy or POLICY, sort_keys=False))
    return p


def _results(tmp_path: Path, kl=None, tasks=None, drift_kw=None, task_kw=None,
             sub: str = "res") -> Path:
    root = tmp_path / sub
    write_drift(root / "drift", kl or KL, **(drift_kw or {}))
    write_tasks(root / "tasks", tasks or TASKS, **(task_kw or {}))
    return root


def _gate(tmp_path, results, policy=None, baseline=None, extra=()):
    args = ["gate", *map(str, results if isinstance(results, list) else [results]),
            "--policy", str(policy or _policy(tmp_path)),
            "--junit", str(tmp_path / "out" / "junit.xml"),
            "--markdown", str(tmp_path / "out" / "summary.md"), "--no-step-summary", *extra]
    for b in baseline or []:
        args += ["--baseline", str(b)]
    r = runner.invoke(app, args)
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    md = (tmp_path / "out" / "summary.md").read_text()
    return r, junit, md


def _errors(junit) -> list[tuple[str, str]]:
    return [(e.get("type"), e.get("message")) for e in junit.iter("error")]


def _failures(junit) -> list[str]:
    return [f.get("message") for f in junit.iter("failure")]


# ------------------------------------------------------------------------------------- verdicts
def test_pass(tmp_path):
    r, junit, md = _gate(tmp_path, _results(tmp_path))
    assert r.exit_code == 0, r.output
    assert junit.get("failures") == "0" and junit.get("errors") == "0"
    assert int(junit.get("tests")) >= 8
    names = {s.get("name") for s in junit.iter("testsuite")}
    assert {"kl-long", "top1", "drop", "trunc"} <= names
    assert "PASS" in md and "gate PASS" in r.output


def test_fail_on_threshold(tmp_path):
    tasks = TASKS | {("math", "nvfp4-read/fp32"): (0.68, -0.02)}
    kl = KL | {"nvfp4-read/fp32": 0.02}
    r, junit, md = _gate(tmp_path, _results(tmp_path, kl, tasks))
    assert r.exit_code == 1, r.output
    fails = _failures(junit)
    assert len(fails) == 2 and not _errors(junit)
    assert any("kl_mean = 0.02" in f and "≤ 0.01" in f for f in fails)
    assert any("drop_hi_points = 2" in f for f in fails)
    assert "FAIL" in md and "### Failures" in md


def test_relative_to_reference(tmp_path):
    # truncation 10% for every config: the reference too, so no increase and a pass ...
    r, junit, _ = _gate(tmp_path, _results(tmp_path, task_kw={"truncation": 0.10}))
    assert r.exit_code == 0, r.output
    # ... but an absolute cap fails it
    pol = json.loads(json.dumps(POLICY))
    pol["checks"][3]["max"] = 0.05
    r, junit, _ = _gate(tmp_path, _results(tmp_path, task_kw={"truncation": 0.10}),
                        _policy(tmp_path, pol))
    # the required non-reference config on both tasks
    assert r.exit_code == 1 and len(_failures(junit)) == 2


def test_relative_to_baseline(tmp_path):
    pol = {"version": 1, "checks": [{"name": "kl-vs-baseline", "metric": "kl_mean",
                                     "bucket": "each", "configs": "*",
                                     "relative_to": "baseline", "max_ratio": 1.5,
                                     "max_increase": 1e-6}]}
    base = _results(tmp_path, sub="base")
    same = _results(tmp_path, sub="same")
    r, junit, _ = _gate(tmp_path, same, _policy(tmp_path, pol), [base])
    assert r.exit_code == 0, r.output
    assert int(junit.get("tests")) >= 12  # 3 configs x 4 buckets + integrity
    worse = _results(tmp_path, KL | {"nvfp4-read/fp32": 0.004}, sub="worse")
    r, junit, _ = _gate(tmp_path, worse, _policy(tmp_path, pol), [base])
    assert r.exit_code == 1
    assert len(_failures(junit)) == 4 and "baseline" in _failures(junit)[0]
    # a baseline is required by the policy
    r, junit, _ = _gate(tmp_path, same, _policy(tmp_path, pol))
    assert r.exit_code == 2 and _errors(junit)[0][0] == "missing"


# ------------------------------------------------------------------------------------- fail closed
def _bad(tmp_path, results, policy=None, baseline=None, kind=None, text=None):
    r, junit, md = _gate(tmp_path, results, policy, baseline)
    assert r.exit_code == 2, r.output
    errs = _errors(junit)
    assert errs, r.output
    if kind is not None:
        assert kind in {k for k, _ in errs}, errs
    if text is not None:
        assert any(text in m for _, m in errs), errs
    assert "ERROR" in md and "### Errors" in md
    return errs


def test_missing(tmp_path):
    # no such folder
    _bad(tmp_path, tmp_path / "nowhere", kind="missing", text="no such file")
    # a folder without results
    (tmp_path / "empty").mkdir()
    _bad(tmp_path, tmp_path / "empty", kind="missing", text="no summary.json")
    # a required config absent from drift and tasks
    kl = {k: v for k, v in KL.items() if k != "nvfp4-read/fp32"}
    tasks = {k: v for k, v in TASKS.items() if k[1] != "nvfp4-read/fp32"}
    _bad(tmp_path, _results(tmp_path, kl, tasks, sub="a"), kind="missing",
         text="'nvfp4-read/fp32'")
    # a required task absent
    tasks = {k: v for k, v in TASKS.items() if k[0] != "math"}
    _bad(tmp_path, _results(tmp_path, tasks=tasks, sub="b"), kind="missing", text="'math'")
    # no task results at all while the policy requires tasks
    root = tmp_path / "c"
    write_drift(root / "drift", KL)
    _bad(tmp_path, root, kind="missing", text="no task results")
    # a bucket the check names does not exist
    pol = {"version": 1, "checks": [{"metric": "kl_mean", "bucket": "[1,2)", "max": 1}]}
    _bad(tmp_path, _results(tmp_path, sub="d"), _policy(tmp_path, pol), kind="missing",
         text="no bucket")
    # a required model absent
    pol = dict(POLICY, models=[MODEL, "other/model"])
    _bad(tmp_path, _results(tmp_path, sub="e"), _policy(tmp_path, pol), kind="missing",
         text="other/model")


def test_nan(tmp_path):
    # the checked value is NaN
    errs = _bad(tmp_path, _results(tmp_path, KL | {"nvfp4-read/fp32": math.nan}), kind="nan")
    assert any("kl_mean" in m for _, m in errs)
    # NaN in a config no check looks at still fails closed
    pol = {"version": 1, "checks": [{"metric": "kl_mean", "configs": ["fp32"], "max": 1}]}
    _bad(tmp_path, _results(tmp_path, KL | {"shared-nvfp4": math.nan}, sub="b"),
         _policy(tmp_path, pol), kind="nan")
    # NaN in task results
    root = _results(tmp_path, sub="c")
    s = json.loads((root / "tasks" / "summary.json").read_text())
    s["results"][1]["delta_lo"] = None
    (root / "tasks" / "summary.json").write_text(json.dumps(s))
    _bad(tmp_path, root, kind="nan")


def test_partial(tmp_path):
    # interrupted drift run: pairs/ but no summary.json
    (tmp_path / "run" / "pairs" / "doc").mkdir(parents=True)
    _bad(tmp_path, tmp_path / "run", kind="partial", text="interrupted")
    # a config without its last bucket
    root = _results(tmp_path, sub="a")
    s = json.loads((root / "drift" / "summary.json").read_text())
    s["configs"][1]["buckets"].pop()
    (root / "drift" / "summary.json").write_text(json.dumps(s))
    _bad(tmp_path, root, kind="partial", text="no statistics for bucket")
    # fewer positions than the run scored
    root = _results(tmp_path, sub="b")
    s = json.loads((root / "drift" / "summary.json").read_text())
    s["configs"][2]["overall"]["n"] -= 10
    (root / "drift" / "summary.json").write_text(json.dumps(s))
    _bad(tmp_path, root, kind="partial", text="positions scored")
    # a task config that scored fewer items than the task has
    _bad(tmp_path, _results(tmp_path, task_kw={"n": {("gpqa", "nvfp4-read/fp32"): 150}},
                            sub="c"), kind="partial", text="150 of 198")
    # with --limit the full count is unknown: a config behind the others is still partial
    root = _results(tmp_path, task_kw={"n": {("gpqa", "nvfp4-read/fp32"): 150}}, sub="d")
    s = json.loads((root / "tasks" / "summary.json").read_text())
    for t in s["tasks"]:
        t["limit"] = 200
    (root / "tasks" / "summary.json").write_text(json.dumps(s))
    _bad(tmp_path, root, kind="partial", text="150 items scored, another config of the task 198")


def test_mismatched(tmp_path):
    # results for a model the policy does not name
    _bad(tmp_path, _results(tmp_path, drift_kw={"model": "x/y"}, task_kw={"model": "x/y"}),
         kind="mismatched", text="'x/y'")
    # one name, two configs: drift and tasks disagree on what "nvfp4-read/fp32" means
    root = _results(tmp_path, sub="a")
    s = json.loads((root / "tasks" / "summary.json").read_text())
    for row in s["results"]:
        if row["name"] == "nvfp4-read/fp32":
            row["config"] = "ckpt=fp32,read=nvfp4,L=8"
    (root / "tasks" / "summary.json").write_text(json.dumps(s))
    _bad(tmp_path, root, kind="mismatched", text="L=8")
    # a baseline measured on other data, or with another seed
    pol = {"version": 1, "checks": [{"metric": "kl_mean", "relative_to": "baseline",
                                     "max_ratio": 2}]}
    base = _results(tmp_path, drift_kw={"data": "gutenberg"}, sub="base")
    _bad(tmp_path, _results(tmp_path, sub="b"), _policy(tmp_path, pol), [base],
         kind="mismatched", text="data")
    base = _results(tmp_path, drift_kw={"seed": 7}, sub="base2")
    _bad(tmp_path, _results(tmp_path, sub="c"), _policy(tmp_path, pol), [base],
         kind="mismatched", text="seed")
    # a baseline for another model
    base = _results(tmp_path, drift_kw={"model": "x/y"}, task_kw={"model": "x/y"}, sub="base3")
    _bad(tmp_path, _results(tmp_path, sub="d"), _policy(tmp_path, pol), [base],
         kind="mismatched", text="baseline has no results")


@pytest.mark.parametrize("policy,text", [
    ("checks: [\n", "not valid YAML"),
    ("version: 1\nchecks:\n  - metric: kl_mean\n    maximum: 0.1\n", "unknown key 'maximum'"),
    ("version: 1\nchecks:\n  - metric: kl_avg\n    max: 0.1\n", "not a drift metric"),
    ("version: 1\nchecks:\n  - metric: kl_mean\n    max_ratio: 2\n", "need relative_to"),
    ("version: 1\nchecks:\n  - metric: kl_mean\n", "no bound"),
    ("version: 2\nchecks:\n  - metric: kl_mean\n    max: 1\n", "version must be 1"),
    ("version: 1\n", "checks nothing"),
    ("version: 1\nrequire:\n  configs: [fp64]\n", "neither a preset"),
])
def test_invalid_policy(tmp_path, policy, text):
    p = tmp_path / "p.yaml"
    p.write_text(policy)
    errs = _bad(tmp_path, _results(tmp_path), p, kind="invalid")
    assert any(text in m for _, m in errs), errs


def test_invalid_results_schema(tmp_path):
    root = tmp_path / "r"
    root.mkdir()
    (root / "summary.json").write_text(json.dumps({"model": "m", "configs": [],
                                                   "buckets": []}))
    _bad(tmp_path, root, kind="invalid", text="'configs' must be a non-empty list")


# ------------------------------------------------------------------------------------- outputs
def test_junit_and_step_summary(tmp_path, monkeypatch):
    summary = tmp_path / "step.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    res = _results(tmp_path)
    r = runner.invoke(app, ["gate", str(res), "--policy", str(_policy(tmp_path)),
                            "--junit", str(tmp_path / "j.xml"),
                            "--markdown", str(tmp_path / "m.md")])
    assert r.exit_code == 0, r.output
    assert summary.read_text().startswith("earlier step\n")
    assert "replayssm-quant gate: PASS" in summary.read_text()
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert root.tag == "testsuites"
    for suite in root.iter("testsuite"):
        assert int(suite.get("tests")) == len(suite.findall("testcase"))


def test_api_never_raises(tmp_path):
    res = run_gate([tmp_path / "nope"], tmp_path / "no-policy.yaml")
    assert res.exit_code == 2 and res.errors[0].kind == "invalid"
    assert "<error" in res.junit_xml()


# ------------------------------------------------------------------------------------- CI policy
def test_committed_ci_policy(tmp_path):
    pol = load_policy(ROOT / "ci" / "drift_policy.yaml")
    assert pol.models == ("nemotron-h-tiny", "qwen3.5-tiny")
    assert set(pol.require_configs) == {"fp32", "nvfp4-read/fp32", "nvfp4-read/fp8-sr",
                                        "shared-nvfp4"}
    kl = {"fp32": 1e-13, "nvfp4-read/fp32": 3e-4, "nvfp4-read/fp8-sr": 4e-4,
          "shared-nvfp4": 1e-3}
    buckets = [(128, 256), (256, 512), (512, 1023)]
    for m in pol.models:  # the layout of a two-model drift run: one folder per model
        s = drift_summary(kl, model=m, buckets=buckets, data="gutenberg")
        (tmp_path / "ci-drift" / m).mkdir(parents=True)
        (tmp_path / "ci-drift" / m / "summary.json").write_text(json.dumps(s))
    r, junit, _ = _gate(tmp_path, tmp_path / "ci-drift", ROOT / "ci" / "drift_policy.yaml")
    assert r.exit_code == 0, r.output
    # the read copy drifting 3x further than the limit fails the gate
    s = drift_summary(kl | {"nvfp4-read/fp32": 3e-3}, model="qwen3.5-tiny", buckets=buckets,
                      data="gutenberg")
    (tmp_path / "ci-drift" / "qwen3.5-tiny" / "summary.json").write_text(json.dumps(s))
    r, junit, _ = _gate(tmp_path, tmp_path / "ci-drift", ROOT / "ci" / "drift_policy.yaml")
    assert r.exit_code == 1 and "read-copy-long-context-kl" in r.output
    # one model missing: fail closed
    (tmp_path / "ci-drift" / "qwen3.5-tiny" / "summary.json").unlink()
    r, junit, _ = _gate(tmp_path, tmp_path / "ci-drift", ROOT / "ci" / "drift_policy.yaml")
    assert r.exit_code == 2


def test_docs_example_policy_parses():
    text = (ROOT / "docs" / "gate.md").read_text()
    block = text.split("## Policy schema", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    pol = parse_policy(yaml.safe_load(block))
    assert pol.needs_baseline and len(pol.checks) == 4


# ------------------------------------------------------------------------------------- real output
@pytest.fixture(scope="module")
def real_drift(tmp_path_factory):
    """A real drift folder: the drift command's own writer on a tiny random Mamba-2 model."""
    from replayssm_quant.evals.data import Document
    from replayssm_quant.evals.drift import run_drift
    from replayssm_quant.models.tiny import tiny_model

    model, _ = tiny_model("nemotron_h")
    g = torch.Generator().manual_seed(0)
    docs = [Document("synthetic/0", "doc0", torch.randint(3, 200, (48,), generator=g),
                     "synthetic")]
    out = tmp_path_factory.mktemp("real") / "drift"
    run_drift(model, ["fp32", "shared-nvfp4", "nvfp4-read/fp32"], docs, prefill=8, out=out,
              model_name="random:nemotron_h")
    return out


def test_real_drift_output(tmp_path, real_drift):
    pol = {"version": 1, "models": ["random:nemotron_h"],
           "require": {"drift": True, "configs": ["fp32", "nvfp4-read/fp32", "shared-nvfp4"]},
           "checks": [{"metric": "kl_mean", "bucket": "each", "configs": "*", "max": 1e-3},
                      {"metric": "same_top1", "bucket": "all", "min": 0.99},
                      {"metric": "kl_max", "configs": ["fp32"], "bucket": "all", "max": 1e-8}]}
    r, junit, _ = _gate(tmp_path, real_drift, _policy(tmp_path, pol))
    assert r.exit_code == 0, r.output
    # the same folder as its own baseline is comparable and passes
    pol2 = {"version": 1, "checks": [{"metric": "kl_mean", "bucket": "each", "configs": "*",
                                      "relative_to": "baseline", "max_ratio": 1.0}]}
    r, junit, _ = _gate(tmp_path, real_drift, _policy(tmp_path, pol2, "p2.yaml"), [real_drift])
    assert r.exit_code == 0, r.output
    # the recommender and the report read it too
    r = runner.invoke(app, ["recommend", str(real_drift), "--out", str(tmp_path / "rec")])
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "rec" / "recommendation.json").read_text())
    assert rec["config"] == "ckpt=nvfp4,read=none,L=16"  # tiny random model: no drift
    assert rec["shape"]["heads"] > 0 and rec["evidence"]["drift_bucket"].startswith("[")
    r = runner.invoke(app, ["report", str(real_drift), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3  # KL, decay spectrum, cost vs drift


# ------------------------------------------------------------------------------------- undecided
def test_undecided_fails_unless_the_policy_allows_it(tmp_path):
    thin = _results(tmp_path, task_kw={"truncation": 0.5})
    r, junit, md = _gate(tmp_path, thin)
    assert r.exit_code == 1, r.output
    undecided = [f for f in junit.iter("failure") if f.get("type") == "undecided"]
    assert undecided and all("50% of answers truncated" in f.get("message") for f in undecided)
    assert not _errors(junit)
    allowed = POLICY | {"evidence": {"allow_undecided": True}}
    r, junit, md = _gate(tmp_path, thin, _policy(tmp_path, allowed, "allow.yaml"))
    assert r.exit_code == 0, r.output
    assert int(junit.get("skipped")) == len(undecided) and not _failures(junit)
    assert "undecided (allowed)" in r.output and "Undecided, allowed by the policy" in md
    # a looser limit decides it
    loose = POLICY | {"evidence": {"max_truncation_rate": 0.6}}
    r, junit, _ = _gate(tmp_path, thin, _policy(tmp_path, loose, "loose.yaml"))
    assert r.exit_code == 0 and junit.get("skipped") == "0"


def test_gate_writes_into_the_results_folder_by_default(tmp_path, monkeypatch):
    results = _results(tmp_path)
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["gate", str(results), "--policy", str(_policy(tmp_path)),
                            "--no-step-summary"])
    assert r.exit_code == 0, r.output
    assert (results / "gate" / "junit.xml").is_file() and (results / "gate" / "summary.md").is_file()
    assert not (tmp_path / "gate").exists()
    r = runner.invoke(app, ["gate", "--help"], env={"COLUMNS": "200"})
    assert "inside the first results folder" in r.output


# ------------------------------------------------------------------------------------- data files
def _copy(real_drift, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(real_drift, tmp_path / "copy"))


def _one_line_error(r, *words):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.output


def test_recorded_files_are_verified(tmp_path, real_drift):
    summary = json.loads((real_drift / "summary.json").read_text())
    assert set(summary["files"]) == {"drift.parquet", "drift_pooled.parquet"}
    assert all(len(f["sha256"]) == 64 and f["rows"] > 0 for f in summary["files"].values())
    # a truncated parquet: every reader stops with one line naming the file
    folder = _copy(real_drift, tmp_path)
    data = (folder / "drift.parquet").read_bytes()
    (folder / "drift.parquet").write_bytes(data[: len(data) // 2])
    words = ("drift.parquet", "truncated", "rerun the command that made it")
    _one_line_error(runner.invoke(app, ["recommend", str(folder), "--out",
                                        str(tmp_path / "rec")]), *words)
    _one_line_error(runner.invoke(app, ["report", str(folder), "--out", str(tmp_path / "rep")]),
                    *words)
    r, junit, _ = _gate(tmp_path, folder, _policy(tmp_path, {"version": 1, "require":
                                                            {"drift": True}}))
    assert r.exit_code == 2 and any("truncated" in m for _, m in _errors(junit))
    # one altered byte, same size
    folder.joinpath("drift.parquet").write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    _one_line_error(runner.invoke(app, ["recommend", str(folder), "--out",
                                        str(tmp_path / "rec")]),
                    "drift.parquet", "altered", "rerun the command that made it")
    # a missing one
    folder.joinpath("drift.parquet").unlink()
    _one_line_error(runner.invoke(app, ["recommend", str(folder), "--out",
                                        str(tmp_path / "rec")]), "drift.parquet", "missing")


def test_folders_without_records_load_with_one_warning(tmp_path, real_drift):
    folder = _copy(real_drift, tmp_path)
    s = json.loads((folder / "summary.json").read_text())
    del s["files"]
    (folder / "summary.json").write_text(json.dumps(s))
    tasks = write_tasks(tmp_path / "tasks", TASKS, model="random:nemotron_h")
    r = runner.invoke(app, ["recommend", str(folder), str(tasks), "--out", str(tmp_path / "r")])
    warnings = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "not verified" in warnings[0], r.output
    assert str(folder) in warnings[0] and str(tasks) in warnings[0]
