"""The CI probe policy fails the gate on the positive control and only on it.

A small carry_chain run on a fixture with answers planted through the real decode path (a
responder): fp32, ``nvfp4-read/fp32`` and ``nvfp4-read/fp16-sr`` answer every item right,
the conventional NVFP4 state ``ckpt=nvfp4,read=none,L=1`` (the positive control) answers three
items in four wrong. The gate with ``ci/probe_policy.yaml`` must exit 1, name the control as
failed and pass the read copies.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest

from replayssm_quant.evals.suite import SuiteProgress, SuiteSettings, run_suite
from tests.test_until_decided import carry_answer

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

POLICY = Path(__file__).resolve().parents[1] / "ci" / "probe_policy.yaml"
MODEL = "nemotron-h-tiny"
CONTROL = "ckpt=nvfp4,read=none,L=1"
READ_COPY = "nvfp4-read/fp32"
SR_COPY = "nvfp4-read/fp16-sr"
ITEMS = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class PlantedControl(SuiteProgress):
    """Answers every item right, except three in four for the positive control."""

    def __init__(self) -> None:
        self.config = "fp32"
        self.calls = 0

    def run_started(self, task, config, index, total):
        self.config = config
        self.calls = 0

    def respond(self, context: str, gen_kwargs: dict) -> str:
        self.calls += 1
        x = carry_answer(context)
        if self.config == CONTROL and self.calls % 4:
            x = (x + 1) % 10
        return f" So $\\boxed{{{x}}}$.\n\nProblem:"


@pytest.fixture(scope="module")
def probe_runs(tmp_path_factory) -> tuple[Path, Path]:
    """``(run without the control, the same run with the control added)``: the second folder
    starts as a copy of the first, so only the control is generated again."""
    root = tmp_path_factory.mktemp("probe")
    plan, cache = PlantedControl(), {}

    def run(out: Path, configs: tuple[str, ...]) -> dict[str, float]:
        settings = SuiteSettings(model=MODEL, tasks=("carry_chain",), configs=configs,
                                 limit=ITEMS, max_gen_toks=64, carry_terms=2, batch_size=8)
        res = run_suite(settings, out, progress=plan, responder=plan.respond, resamples=200,
                        cache=cache)
        return {r["name"]: r["accuracy"] for r in res.summary["results"]}

    assert run(root / "ci-probe", (READ_COPY, SR_COPY)) == {"fp32": 1.0, READ_COPY: 1.0, SR_COPY: 1.0}
    shutil.copytree(root / "ci-probe", root / "with-control")
    acc = run(root / "with-control", (READ_COPY, SR_COPY, CONTROL))
    assert acc == {"fp32": 1.0, READ_COPY: 1.0, SR_COPY: 1.0, CONTROL: 0.25}
    return root / "ci-probe", root / "with-control"


def _gate(run: Path, tmp_path: Path):
    from typer.testing import CliRunner

    from replayssm_quant.cli.app import app

    junit = tmp_path / "junit.xml"
    r = CliRunner().invoke(app, ["gate", str(run), "--policy", str(POLICY), "--junit",
                                 str(junit), "--markdown", str(tmp_path / "summary.md"),
                                 "--no-step-summary"])
    return r, ElementTree.parse(junit).getroot()


def test_gate_fails_on_the_positive_control(probe_runs, tmp_path):
    r, junit = _gate(probe_runs[1], tmp_path)
    assert r.exit_code == 1, r.output
    failed = [line for line in r.output.splitlines() if line.startswith("fail ")]
    assert failed and all(CONTROL in line for line in failed), r.output
    assert not any(READ_COPY in line for line in failed)
    assert not any(line.startswith("error") for line in r.output.splitlines())
    assert " 0 error(s)" in r.output
    cases = [c for c in junit.iter("testcase")]
    control = [c for c in cases if CONTROL in c.get("name", "")]
    read_copy = [c for c in cases if READ_COPY in c.get("name", "")]
    assert control and all(c.find("failure") is not None for c in control)
    assert read_copy and all(c.find("failure") is None and c.find("skipped") is None
                             for c in read_copy)


def test_gate_passes_the_ci_run_without_the_control(probe_runs, tmp_path):
    r, junit = _gate(probe_runs[0], tmp_path)
    assert r.exit_code == 0, r.output
    assert not any(c.find("failure") is not None for c in junit.iter("testcase"))
