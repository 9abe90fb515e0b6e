"""``replayssm-quant sweep`` on a local Ray with two workers (CPU): a sweep's summaries equal
the same units run one by one; a driver killed with SIGKILL and rerun resumes with every unit
present once; a failing unit leaves the others finished and exits 1 naming it; a bad plan is
one error line and exit 2 before Ray starts.

Eval answers are planted through the real decode path (a responder factory named by
``REPLAYSSM_SWEEP_RESPONDER``) on the carry_chain probe, whose answer can be read off the
prompt; ``shared-nvfp4`` answers wrong, so the paired statistics are not all trivial.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("ray")

from replayssm_quant.cli.app import app  # noqa: E402
from replayssm_quant.evals.drift import run_drift  # noqa: E402
from replayssm_quant.evals.suite import SuiteProgress, SuiteSettings, run_suite  # noqa: E402
from replayssm_quant.sweep.plan import model_slug  # noqa: E402
from tests.test_until_decided import carry_answer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("nemotron-h-tiny", "qwen3.5-tiny")
CONFIGS = ("fp32", "shared-fp8", "nvfp4-read/fp32", "shared-nvfp4")
WRONG = "shared-nvfp4"
FAIL_ENV = "SWEEP_TEST_FAIL_CONFIG"
DRIFT = dict(data="gutenberg", docs=2, max_tokens=256, prefill=128)
EVAL = dict(tasks=["carry_chain"], limit=2, max_gen_toks=64, carry_terms=2, batch_size=8,
            resamples=200)


def planted(model: str, task: str, config: str):
    """The responder factory the sweep's eval units call (``tests.test_sweep:planted``)."""
    if config == os.environ.get(FAIL_ENV):
        raise RuntimeError(f"planted failure of {config}")

    def respond(context: str, gen_kwargs: dict) -> str:
        x = carry_answer(context)
        if config == WRONG:
            x = (x + 1) % 10
        return f" So $\\boxed{{{x}}}$.\n\nProblem:"

    return respond


class _Planted(SuiteProgress):
    """Serial runs: answers for the config running now."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.config = "fp32"

    def run_started(self, task, config, index, total):
        self.config = config

    def respond(self, context: str, gen_kwargs: dict) -> str:
        return planted(self.model, "carry_chain", self.config)(context, gen_kwargs)


def _plan(tmp: Path, out: Path, *, models=MODELS, configs=CONFIGS, drift=DRIFT,
          eval_=EVAL) -> Path:
    path = tmp / "plan.yaml"
    plan = {"models": list(models), "configs": list(configs), "out": str(out),
            "drift": dict(drift), "eval": dict(eval_)}
    path.write_text(json.dumps(plan))  # JSON is YAML
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != FAIL_ENV}
    return env | dict(PYTHONPATH=str(ROOT), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                      REPLAYSSM_SWEEP_RESPONDER="tests.test_sweep:planted") | extra


def _sweep_cmd(plan: Path) -> list[str]:
    return [sys.executable, "-m", "replayssm_quant.cli.app", "sweep", str(plan), "--workers",
            "2", "--retries", "1"]


def _run(plan: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(_sweep_cmd(plan), env=_env(**env), capture_output=True, text=True,
                          timeout=300, cwd=ROOT, start_new_session=True)


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    """The same units run one by one through the single commands' library calls."""
    out = tmp_path_factory.mktemp("serial")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for model in MODELS:
            run_drift(model, list(CONFIGS), DRIFT["data"], max_tokens=DRIFT["max_tokens"],
                      docs=DRIFT["docs"], prefill=DRIFT["prefill"],
                      out=out / model_slug(model) / "drift", device="cpu")
            tracker = _Planted(model)
            settings = SuiteSettings(model=model, tasks=tuple(EVAL["tasks"]), configs=CONFIGS,
                                     limit=EVAL["limit"], max_gen_toks=EVAL["max_gen_toks"],
                                     carry_terms=EVAL["carry_terms"],
                                     batch_size=EVAL["batch_size"])
            run_suite(settings, out / model_slug(model) / "eval", progress=tracker,
                      responder=tracker.respond, resamples=EVAL["resamples"])
    finally:
        torch.set_num_threads(threads)
    return out


def _same_results(sweep: Path, serial: Path) -> None:
    for model in MODELS:
        for kind in ("drift", "eval"):
            a = json.loads((sweep / model_slug(model) / kind / "summary.json").read_text())
            b = json.loads((serial / model_slug(model) / kind / "summary.json").read_text())
            assert a == b, f"{model} {kind} summary differs"
        pd.testing.assert_frame_equal(
            pd.read_parquet(sweep / model_slug(model) / "drift" / "drift.parquet"),
            pd.read_parquet(serial / model_slug(model) / "drift" / "drift.parquet"))


def _units_once(out: Path) -> None:
    """Every (document, config) pair file and every eval run exactly once, nothing half
    written or left over."""
    for model in MODELS:
        drift = out / model_slug(model) / "drift"
        pairs = sorted(p.relative_to(drift) for p in (drift / "pairs").rglob("*") if p.is_file())
        assert len(pairs) == DRIFT["docs"] * len(CONFIGS), pairs
        assert all(p.suffix == ".parquet" and not p.name.startswith(".") for p in pairs), pairs
        assert not list((drift / "reference").glob("*.pt"))
        runs = sorted((out / model_slug(model) / "eval" / "runs").glob("*/*/run.json"))
        assert len(runs) == len(CONFIGS), runs


def test_sweep_equals_serial_runs(tmp_path, serial):
    out = tmp_path / "out"
    res = _run(_plan(tmp_path, out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "28 units" in res.stderr and "0 failed" in res.stderr, res.stderr[-2000:]
    _same_results(out, serial)
    _units_once(out)


def test_driver_killed_and_rerun_resumes(tmp_path, serial):
    out = tmp_path / "out"
    plan = _plan(tmp_path, out)
    wait = random.uniform(12.0, 30.0)
    proc = subprocess.Popen(_sweep_cmd(plan), env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)  # the driver alone, mid-sweep
        proc.wait()
    time.sleep(1.0)
    try:  # Ray's helpers the driver started outlive it; end them before the rerun
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    res = _run(plan)
    assert res.returncode == 0, f"killed after {wait:.1f} s: {res.stderr[-3000:]}"
    _same_results(out, serial)
    _units_once(out)


def test_failing_unit_is_named_and_the_others_finish(tmp_path):
    out = tmp_path / "out"
    plan = _plan(tmp_path, out, models=MODELS[:1], configs=("fp32", "shared-fp8"),
                 drift=DRIFT | {"docs": 1})
    res = _run(plan, **{FAIL_ENV: "shared-fp8"})
    assert res.returncode == 1, res.stderr[-3000:]
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, res.stderr[-3000:]
    assert "nemotron-h-tiny/eval/carry_chain/shared-fp8" in err[0]
    assert "planted failure of shared-fp8" in err[0]
    assert "nemotron-h-tiny/eval/summary" in err[0]  # waited for it, so not run
    folder = out / "nemotron-h-tiny"
    assert (folder / "drift" / "summary.json").is_file()  # the other units finished
    assert (folder / "eval" / "runs" / "carry_chain" / "fp32" / "run.json").is_file()
    assert not (folder / "eval" / "runs" / "carry_chain" / "shared-fp8" / "run.json").exists()
    assert not (folder / "eval" / "summary.json").exists()


BAD_PLANS = {
    "unknown model": ("models: [no-such-model]\nconfigs: [fp32]\ndrift: {docs: 1}\n",
                      "no-such-model"),
    "unknown config": ("models: [nemotron-h-tiny]\nconfigs: [fp32, fp5-magic]\n"
                       "drift: {docs: 1}\n", "fp5-magic"),
    "unknown task": ("models: [nemotron-h-tiny]\nconfigs: [fp32]\neval: {tasks: [nope]}\n",
                     "nope"),
    "missing data": ("models: [nemotron-h-tiny]\nconfigs: [fp32]\n"
                     "drift: {data: missing/texts.txt}\n", "missing/texts.txt"),
    "malformed yaml": ("models: [nemotron-h-tiny\nconfigs: fp32\n", "malformed YAML"),
    "python tag": ("models: !!python/object/apply:os.system ['true']\nconfigs: [fp32]\n"
                   "drift: {docs: 1}\n", "safe YAML loader"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_bad_plan_is_one_error_line_before_ray(tmp_path, case):
    import ray

    text, named = BAD_PLANS[case]
    plan = tmp_path / "plan.yaml"
    plan.write_text(text + f"out: {tmp_path / 'out'}\n")
    result = CliRunner().invoke(app, ["sweep", str(plan)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert named in lines[0], lines[0]
    assert not ray.is_initialized()
    assert not (tmp_path / "out").exists()
