"""The whole flow on a fixture model, through the real commands: drift -> eval -> recommend ->
report -> gate. Result files made by the real drift and eval commands are the inputs of the
recommender, the report and the gate here."""

import json

import pytest
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.evals.offline_data import write_task_data

CONFIGS = "fp32,nvfp4-read/fp32,shared-nvfp4"


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    root = tmp_path_factory.mktemp("flow")
    run = CliRunner().invoke
    r = run(app, ["drift", "nemotron-h-tiny", "-c", CONFIGS, "--max-tokens", "384",
                  "--prefill", "64", "--out", str(root / "drift")])
    assert r.exit_code == 0, r.output
    data = write_task_data(root / "data", gpqa=3, mmlu_test=2, mmlu_val=5, math=2)
    # two items per task: one paired item has no bootstrap interval (NaN, rejected by design)
    r = run(app, ["eval", "nemotron-h-tiny", "--tasks", "gpqa_diamond,mmlu_pro,math_l5",
                  "-c", CONFIGS, "--data", str(data), "--limit", "2", "--max-gen-toks", "12",
                  "--resamples", "200", "--out", str(root / "eval")])
    assert r.exit_code == 0, r.output
    return root


def test_recommend_on_real_results(flow):
    r = CliRunner().invoke(app, ["recommend", str(flow / "drift"), str(flow / "eval"),
                                 "--max-kl", "1.0", "--min-same-top1", "0.5",
                                 "--max-acc-drop", "100", "--out", str(flow / "rec")])
    # the fixtures' answers are all cut off: the task evidence decides nothing
    assert r.exit_code == 3 and "undecided: shared-nvfp4" in r.output, r.output
    r = CliRunner().invoke(app, ["recommend", str(flow / "drift"), str(flow / "eval"),
                                 "--max-kl", "1.0", "--min-same-top1", "0.5",
                                 "--max-acc-drop", "100", "--max-truncated", "1",
                                 "--max-invalid", "1", "--out", str(flow / "rec")])
    assert r.exit_code == 0, r.output
    rec = json.loads((flow / "rec" / "recommendation.json").read_text())
    # with a budget every config meets, the cheapest by state bytes wins: shared NVFP4
    assert rec["name"] == "shared-nvfp4"
    r = CliRunner().invoke(app, ["recommend", str(flow / "drift"), str(flow / "eval"),
                                 "--max-kl", "1e-15", "--out", str(flow / "rec2")])
    assert r.exit_code == 3, r.output
    assert "closest" in r.output


def test_report_and_gate_on_real_results(flow):
    r = CliRunner().invoke(app, ["report", str(flow / "drift"), str(flow / "eval"),
                                 "--out", str(flow / "report")])
    assert r.exit_code == 0, r.output
    html = list((flow / "report").rglob("report.html"))
    assert html and "data:image/png;base64," in html[0].read_text()
    policy = flow / "policy.yaml"
    policy.write_text(
        "version: 1\nmodels: [nemotron-h-tiny]\nreference: fp32\n"
        "require:\n  drift: true\n  configs: [fp32, nvfp4-read/fp32]\n"
        "checks:\n  - {configs: [fp32], metric: kl_max, bucket: all, max: 1.0e-8}\n")
    r = CliRunner().invoke(app, ["gate", str(flow / "drift"), "--policy", str(policy),
                                 "--junit", str(flow / "g.xml"), "--markdown", str(flow / "g.md")])
    assert r.exit_code == 0, r.output
