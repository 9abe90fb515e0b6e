"""The task suite offline: lm-eval's stock GPQA-Diamond / MMLU-Pro / MATH-hard definitions on small
local files in the hub's schemas, end to end through the ReplaySSM backend.

Answers are planted: a responder forces each item's continuation through the real decode path
(correct, wrong, unextractable, or cut off by ``max_gen_toks``), so the test checks extraction,
scoring, truncation accounting and the paired statistics exactly, without relying on a tiny
model being smart.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from replayssm_quant.evals.tasks import (
    TASKS,
    TaskDataError,
    find_data_files,
    resolve_tasks,
    run_task,
    stock_task_dir,
    write_local_tasks,
)

from .eval_data import correct_answer, item_of, make_responder, write_task_data

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_task_data(tmp_path_factory.mktemp("taskdata"))


@pytest.fixture(scope="module")
def local(data, tmp_path_factory):
    return write_local_tasks(data, tmp_path_factory.mktemp("wrappers"))


@pytest.fixture(scope="module")
def task_manager(local):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(local.include_path))


# ----------------------------------------------------------------------------- wrappers
def test_wrappers_include_stock_yaml_and_only_move_the_data(local, data):
    stock = stock_task_dir()
    assert local.names == {"gpqa_diamond": "gpqa_diamond_cot_zeroshot_local",
                           "mmlu_pro": "mmlu_pro_local",
                           "math_l5": "leaderboard_math_hard_local"}
    assert local.subtasks["mmlu_pro"] == ["mmlu_pro_biology_local", "mmlu_pro_math_local"]
    assert local.subtasks["math_l5"] == ["leaderboard_math_algebra_hard_local",
                                         "leaderboard_math_num_theory_hard_local"]
    for path in local.include_path.rglob("*.yaml"):
        cfg = yaml.safe_load(path.read_text())
        if "group" in cfg:
            assert cfg["aggregate_metric_list"]  # the stock aggregation
            continue
        inc = Path(cfg["include"])
        assert inc.is_absolute() and inc.is_file() and stock in inc.parents
        assert set(cfg) == {"include", "task", "dataset_path", "dataset_name", "dataset_kwargs"}
        assert cfg["dataset_path"] in ("json", "parquet", "csv") and cfg["dataset_name"] is None
        for files in cfg["dataset_kwargs"]["data_files"].values():
            assert all(Path(f).is_absolute() and Path(f).is_file() for f in files)
    gpqa = yaml.safe_load((local.include_path / "gpqa_diamond_cot_zeroshot_local.yaml")
                          .read_text())
    assert gpqa["dataset_path"] == "csv" and list(gpqa["dataset_kwargs"]["data_files"]) == ["train"]


def test_local_data_errors(tmp_path, data):
    with pytest.raises(TaskDataError, match="not a folder"):
        write_local_tasks(tmp_path / "nope", tmp_path / "w")
    bad = tmp_path / "bad"
    write_task_data(bad, mmlu_val=4)
    with pytest.raises(TaskDataError, match="at least 5"):
        write_local_tasks(bad, tmp_path / "w", [TASKS["mmlu_pro"]])
    frame = pd.read_csv(bad / "gpqa" / "gpqa_diamond.csv").drop(columns=["Incorrect Answer 3"])
    frame.to_csv(bad / "gpqa" / "gpqa_diamond.csv", index=False)
    with pytest.raises(TaskDataError, match="Incorrect Answer 3"):
        write_local_tasks(bad, tmp_path / "w", [TASKS["gpqa_diamond"]])
    assert set(find_data_files(TASKS["mmlu_pro"], data)) == {"test", "validation"}
    with pytest.raises(ValueError, match="unknown task"):
        resolve_tasks("gpqa_diamond,mmlu")


# ----------------------------------------------------------------------------- lm-eval runs
class _Scripted:
    """A minimal lm-eval LM that answers every item correctly from the prompt alone and
    records what it was asked."""

    def __new__(cls):
        from lm_eval.api.model import LM

        class Scripted(LM):
            def __init__(self):
                super().__init__()
                self.seen: list[tuple[str, dict]] = []

            def generate_until(self, requests, disable_tqdm=False):
                self.seen += [r.args for r in requests]
                out = []
                for ctx, _ in (r.args for r in requests):
                    kind, ans = correct_answer(ctx)
                    out.append({"gpqa": f"The answer is {ans}.", "mmlu": f"The answer is ({ans}).",
                                "math": f"$\\boxed{{{ans}}}$"}[kind])
                return out

            def loglikelihood(self, requests, disable_tqdm=False):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests, disable_tqdm=False):
                raise NotImplementedError

        return Scripted()


def _letters(res) -> list[str]:
    samples = res["samples"]["gpqa_diamond_cot_zeroshot_local"]
    return [s["target"] for s in samples if s["filter"] == "flexible-extract"]


def test_gpqa_seeded_shuffle_is_reproducible_and_scored_consistently(local, task_manager):
    """The prompt's letters and the scoring target come from one shuffle (lm-eval runs
    process_docs twice), fixed by the seed."""
    runs = {}
    for seed in (0, 0, 1):
        lm = _Scripted()
        res = run_task(lm, local.names["gpqa_diamond"], task_manager=task_manager,
                       max_gen_toks=8, seed=seed)
        assert res["results"]["gpqa_diamond_cot_zeroshot_local"][
            "exact_match,flexible-extract"] == 1.0
        runs.setdefault(seed, []).append(_letters(res))
    assert runs[0][0] == runs[0][1]
    assert runs[0][0] != runs[1][0]


def test_max_gen_toks_reaches_every_task(local, task_manager):
    """Every task gets ``max_gen_toks`` through gen_kwargs (MMLU-Pro's YAML says 2048, MATH's
    1024, GPQA's nothing, which would mean lm-eval's 256)."""
    for key, name in local.names.items():
        lm = _Scripted()
        res = run_task(lm, name, task_manager=task_manager, max_gen_toks=777, limit=1, seed=0)
        assert lm.seen, key
        assert {gk["max_gen_toks"] for _, gk in lm.seen} == {777}, key
        accs = [v for k, v in _flat(res["results"]).items() if k.startswith("exact_match,")
                and not k.endswith("stderr")]
        assert accs and all(a == 1.0 for a in accs), (key, res["results"])


def _flat(results: dict) -> dict:
    return {f"{k}@{task}": v for task, metrics in results.items() for k, v in metrics.items()
            if isinstance(v, float)}


# ----------------------------------------------------------------------------- end to end
CAND = "nvfp4-read/fp32"
# per item id: what the candidate config answers (the reference answers everything right
# except MMLU-Pro item 1); limit 2 keeps ids gpqa 0,1 / mmlu 0,1,8,9 / math 0,1,4,5
PLAN = {("gpqa", 0): "truncated", ("gpqa", 1): "wrong",
        ("mmlu", 0): "invalid", ("mmlu", 1): "correct", ("mmlu", 8): "wrong",
        ("mmlu", 9): "truncated",
        ("math", 0): "correct", ("math", 1): "invalid", ("math", 4): "truncated",
        ("math", 5): "wrong"}


def _model_and_budget() -> tuple[str, int]:
    from replayssm_quant.models.fixture import fixture_path

    try:
        fixture_path("nemotron-h-tiny")
        return "nemotron-h-tiny", 40
    except FileNotFoundError:  # byte-level tokenizer: answers take more tokens
        return "random:nemotron_h", 96


class _Plan:
    def __init__(self):
        self.config = None
        self.started: list[tuple[str, str]] = []

    def run_started(self, task, config, index, total):
        self.config = config
        self.started.append((task, config))

    def requests(self, done, total):
        pass

    def run_finished(self, task, config, summary, cached, seconds):
        pass

    def answer(self, kind: str, i: int) -> str:
        if self.config == "fp32":
            return "wrong" if (kind, i) == ("mmlu", 1) else "correct"
        return PLAN[(kind, i)]


def test_suite_end_to_end_two_configs(tmp_path, data, task_manager):
    from replayssm_quant.evals.suite import SuiteSettings, run_suite

    model, budget = _model_and_budget()
    plan = _Plan()
    settings = SuiteSettings(model=model, tasks=("gpqa_diamond", "mmlu_pro", "math_l5"),
                             configs=(CAND,), limit=2, max_gen_toks=budget, seed=0,
                             data=str(data), batch_size=4)
    out = tmp_path / "out"
    res = run_suite(settings, out, progress=plan, responder=make_responder(plan.answer),
                    task_manager=task_manager, resamples=2000)
    assert len(res.ran) == 6 and not res.cached

    items = pd.read_parquet(out / "items.parquet")
    assert {"doc_id", "prompt_hash", "doc_hash", "answer", "truncated", "correct"} <= set(items)
    kind_of = {"gpqa_diamond": "gpqa", "mmlu_pro": "mmlu", "math_l5": "math"}
    cand = items[items["config"] == CAND]
    for _, row in cand.iterrows():
        kind = kind_of[row["task"]]
        assert item_of(_prompt(out, row))[0] == kind
        i = item_of(_prompt(out, row))[1]
        what = PLAN[(kind, i)]
        assert bool(row["truncated"]) == (what == "truncated"), (kind, i)
        assert bool(row["invalid"]) == (what == "invalid"), (kind, i)
        assert bool(row["correct"]) == (what == "correct"), (kind, i)
        if what == "truncated":  # lm-eval found the right answer in the cut-off text...
            assert row["score_raw"] == 1.0 and row["finish"] == "length"
            assert row["gen_tokens"] == budget  # ...but it is not scored as an answer
    ref = items[items["config"] == "fp32"]
    assert not ref["truncated"].any() and set(ref["finish"]) == {"stop"}
    # identical items and prompts for both configs
    key = ["task", "subtask", "doc_id"]
    merged = ref.merge(cand, on=key, suffixes=("_r", "_c"))
    assert len(merged) == len(ref) == len(cand) == 10
    assert (merged["prompt_hash_r"] == merged["prompt_hash_c"]).all()

    summary = json.loads((out / "summary.json").read_text())
    rows = {(r["task"], r["name"]): r for r in summary["results"]}
    g = rows[("gpqa_diamond", CAND)]
    assert (g["n"], g["accuracy"], g["accuracy_raw"], g["truncation_rate"], g["invalid_rate"]) \
        == (2, 0.0, 0.5, 0.5, 0.0)
    assert g["delta"] == -1.0 and g["flips_to_wrong"] == 2 and g["mcnemar_p"] == 0.5
    m = rows[("mmlu_pro", CAND)]
    assert (m["n"], m["accuracy"], m["accuracy_raw"], m["truncation_rate"], m["invalid_rate"]) \
        == (4, 0.25, 0.5, 0.25, 0.25)
    assert m["delta"] == pytest.approx(-0.5) and m["discordant"] == 4
    assert (m["flips_to_wrong"], m["flips_to_right"]) == (3, 1)
    assert m["mcnemar_p"] == pytest.approx(0.625) and m["flip_rate"] == 1.0
    assert m["delta_lo"] <= -0.5 <= m["delta_hi"]
    x = rows[("math_l5", CAND)]
    assert (x["n"], x["accuracy"], x["accuracy_raw"], x["truncation_rate"], x["invalid_rate"]) \
        == (4, 0.25, 0.5, 0.25, 0.25)
    r = rows[("mmlu_pro", "fp32")]
    assert (r["accuracy"], r["delta"], r["mcnemar_p"]) == (0.75, 0.0, 1.0)
    assert summary["kind"] == "tasks" and summary["reference"] == "fp32"
    assert summary["ssm_shape"]["kind"] == "mamba2"
    tasks = {t["task"]: t for t in summary["tasks"]}
    assert tasks["gpqa_diamond"]["items"] == 4 and tasks["math_l5"]["items"] == 6
    assert all(t["max_gen_toks"] == budget for t in tasks.values())

    # lm-eval's own results and sample logs are kept beside the table
    run = out / "runs" / "mmlu_pro" / "nvfp4-read--fp32"
    assert (run / "results.json").is_file() and (run / "run.json").is_file()
    assert sorted(p.name for p in (run / "samples").iterdir()) == [
        "mmlu_pro_biology_local.jsonl", "mmlu_pro_math_local.jsonl"]
    lm_res = json.loads((run / "results.json").read_text())
    assert lm_res["results"]["mmlu_pro_local"]["exact_match,custom-extract"] == 0.5
    gens = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]
    assert sum(g["truncated"] for g in gens) == 1

    # the shared results loader (recommender, gate) accepts the summary
    results = pytest.importorskip("replayssm_quant.results")
    loaded = results.load_tasks(out)[model]
    assert str(loaded.reference) == "ckpt=fp32,read=none,L=1" and len(loaded.rows) == 6

    # resumable: nothing runs again, same summary
    again = run_suite(settings, out, progress=_Plan(), task_manager=task_manager,
                      resamples=2000)
    assert not again.ran and len(again.cached) == 6
    assert again.summary["results"] == summary["results"]


def _prompt(out: Path, row) -> str:
    """The prompt of a row, read from the run's lm-eval sample log."""
    from replayssm_quant.evals.suite import slug

    path = out / "runs" / row["task"] / slug(row["config"]) / "samples" / \
        f"{slug(row['subtask'])}.jsonl"
    for line in path.read_text().splitlines():
        s = json.loads(line)
        if s["doc_id"] == row["doc_id"]:
            return s["arguments"][0][0]
    raise AssertionError("sample not logged")


def test_cli_eval_resumes_and_reports(tmp_path, data, task_manager, monkeypatch):
    """The CLI on a finished output folder runs nothing and prints the paired table."""
    from typer.testing import CliRunner

    from replayssm_quant.cli.app import app
    from replayssm_quant.evals.suite import SuiteSettings, run_suite

    model, budget = _model_and_budget()
    plan = _Plan()
    out = tmp_path / "cli"
    run_suite(SuiteSettings(model=model, tasks=("gpqa_diamond",), configs=(CAND,), limit=2,
                            max_gen_toks=budget, seed=0, data=str(data.resolve()),
                            batch_size=8),
              out, progress=plan, responder=make_responder(plan.answer),
              task_manager=task_manager, resamples=500)
    monkeypatch.setattr("lm_eval.tasks.TaskManager", None)  # a cached run must not index tasks
    r = CliRunner().invoke(app, ["eval", model, "--tasks", "gpqa_diamond", "--configs", CAND,
                                 "--data", str(data), "--limit", "2", "--max-gen-toks",
                                 str(budget), "--out", str(out), "--resamples", "500"])
    assert r.exit_code == 0, r.output
    assert "0 run, 2 cached" in r.output and "nvfp4-read/fp32" in r.output


@pytest.mark.parametrize("args, message", [
    (["--tasks", "gpqa"], "unknown task"),
    (["--configs", "ckpt=fp5"], "fp5"),
    (["--backend", "vllm"], "needs vLLM"),
    (["--backend", "tgi"], "--backend"),
    (["--limit", "0"], "--limit"),
])
def test_cli_eval_argument_errors(args, message, monkeypatch):
    from typer.testing import CliRunner

    import replayssm_quant.evals.lm_backend as backend
    from replayssm_quant.cli.app import app

    monkeypatch.setattr(backend, "vllm_available", lambda: False)
    r = CliRunner().invoke(app, ["eval", "random:nemotron_h", *args])
    assert r.exit_code == 2 and message in r.output
    assert r.output.count("\n") <= 2  # one clear line, no traceback


def test_cli_config_splitting():
    from replayssm_quant.precision import split_configs as _split_configs

    assert _split_configs(["fp32,ckpt=fp8:sr,read=nvfp4,L=16;shared-nvfp4",
                           "nvfp4-read/fp32"]) == [
        "fp32", "ckpt=fp8:sr,read=nvfp4,L=16", "shared-nvfp4", "nvfp4-read/fp32"]
