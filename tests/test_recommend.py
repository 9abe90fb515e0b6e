"""The recommender picks the cheapest config inside the budget, moves its pick when the budget
or the costs change, and names the closest config (exit 3) when none qualifies."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.recommend import Budget, InputError, load_benchmark, recommend
from replayssm_quant.results import ResultsError, load_results
from tests.resultdata import write_bench, write_drift, write_tasks

# Cheapest first in state bytes for the Nemotron-3-Nano shape:
# shared-nvfp4 < nvfp4-read/fp8-sr < nvfp4-read/fp16-sr < nvfp4-read/fp32 < fp8-read/fp32
# < fp16-sr < replay-fp32 < fp32
KL = {
    "fp32": 0.0,
    "shared-nvfp4": 0.05,
    "nvfp4-read/fp8-sr": 0.006,
    "nvfp4-read/fp16-sr": 0.002,
    "nvfp4-read/fp32": 0.0015,
    "fp8-read/fp32": 0.0002,
    "fp16-sr": 0.003,
    "replay-fp32": 0.0,
}
TASKS = {("gpqa", c): (0.70, -0.004) for c in KL if c != "fp32"} | {
    ("math", c): (0.70, -0.005) for c in KL if c != "fp32"}

runner = CliRunner()


def _results(tmp_path, kl=None, top1=None, tasks=None, task_kw=None):
    paths = [write_drift(tmp_path / "drift", kl or KL, top1_last=top1)]
    if tasks is not None:
        paths.append(write_tasks(tmp_path / "tasks", tasks, **(task_kw or {})))
    return load_results(paths).model()


CASES = [
    # id, budget, kl overrides, top-1 overrides, task overrides, pick, rejected cheaper: metric
    ("default", {}, {}, {}, {}, "nvfp4-read/fp8-sr", {"shared-nvfp4": "kl_mean"}),
    ("tighter-kl", {"max_kl": 0.0025}, {}, {}, {}, "nvfp4-read/fp16-sr",
     {"shared-nvfp4": "kl_mean", "nvfp4-read/fp8-sr": "kl_mean"}),
    ("looser-kl", {"max_kl": 0.1}, {}, {}, {}, "shared-nvfp4", {}),
    ("top1", {"max_kl": 0.1}, {}, {"shared-nvfp4": 0.97}, {}, "nvfp4-read/fp8-sr",
     {"shared-nvfp4": "same_top1"}),
    ("kl-p99", {"kl_stat": "kl_p99", "max_kl": 0.02}, {}, {}, {}, "nvfp4-read/fp16-sr",
     {"nvfp4-read/fp8-sr": "kl_p99"}),
    ("bucket-all", {"bucket": "all", "max_kl": 0.004}, {}, {}, {}, "nvfp4-read/fp8-sr",
     {"shared-nvfp4": "kl_mean"}),
    ("task-drop", {}, {}, {}, {("gpqa", "nvfp4-read/fp8-sr"): (0.68, -0.02)},
     "nvfp4-read/fp16-sr", {"nvfp4-read/fp8-sr": "accuracy drop"}),
    ("task-override", {"task_max_accuracy_drop": {"gpqa": 3.0}}, {}, {},
     {("gpqa", "nvfp4-read/fp8-sr"): (0.68, -0.02)}, "nvfp4-read/fp8-sr", {}),
    ("task-drop-off", {"max_accuracy_drop": None}, {}, {},
     {("math", "nvfp4-read/fp8-sr"): (0.60, -0.15)}, "nvfp4-read/fp8-sr", {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_picks_cheapest_inside_budget(tmp_path, case):
    _, budget, kl, top1, tasks, pick, rejected = case
    m = _results(tmp_path, KL | kl, top1, TASKS | tasks)
    rec = recommend(m, Budget.from_mapping(budget))
    assert rec.chosen is not None and rec.chosen.name == pick
    assert rec.exit_code == 0
    costs = [c.cost.value for c in rec.candidates]
    assert costs == sorted(costs)
    cheaper = {c.name: c for c in rec.rejected_cheaper}
    assert set(rejected) <= set(cheaper)
    assert all(not c.qualifies for c in cheaper.values())
    for name, metric in rejected.items():
        reasons = " ".join(cheaper[name].reasons())
        assert metric in reasons, reasons
        assert ">" in reasons or "<" in reasons  # value vs limit
    # nothing that qualifies is cheaper than the pick
    assert all(c.cost.value >= rec.chosen.cost.value for c in rec.candidates if c.qualifies)


def test_bytes_follow_the_model_shape(tmp_path):
    m = _results(tmp_path)
    rec = recommend(m)
    by = {c.name: c for c in rec.candidates}
    assert by["fp32"].cost.traffic_vs_fp32 == pytest.approx(1.0)
    assert by["shared-nvfp4"].cost.value < by["nvfp4-read/fp8-sr"].cost.value
    assert by["nvfp4-read/fp32"].cost.value < by["fp16-sr"].cost.value
    assert rec.shape.heads == 96 and rec.shape.head_dim == 80 and rec.shape.layers == 21
    # --shape overrides what the results record
    other = recommend(m, shape="qwen3.5-4b")
    assert other.shape.kind == "gdn"
    assert other.candidates[0].cost.value != rec.candidates[0].cost.value


@pytest.mark.parametrize("times,pick", [
    # the benchmark says the FP8-SR checkpoint's flush is slow: the FP32 one wins on time
    ({"fp32": 100.0, "shared-nvfp4": 30.0, "nvfp4-read/fp8-sr": 60.0,
      "nvfp4-read/fp16-sr": 50.0, "nvfp4-read/fp32": 40.0, "fp8-read/fp32": 45.0,
      "fp16-sr": 70.0, "replay-fp32": 80.0}, "nvfp4-read/fp32"),
    ({"fp32": 100.0, "shared-nvfp4": 30.0, "nvfp4-read/fp8-sr": 35.0,
      "nvfp4-read/fp16-sr": 50.0, "nvfp4-read/fp32": 40.0, "fp8-read/fp32": 45.0,
      "fp16-sr": 70.0, "replay-fp32": 80.0}, "nvfp4-read/fp8-sr"),
])
def test_measured_time_changes_the_pick(tmp_path, times, pick):
    m = _results(tmp_path)
    bench = load_benchmark(write_bench(tmp_path / "decode.csv", times))
    rec = recommend(m, bench=bench)
    assert rec.cost_basis == "time"
    assert rec.chosen.name == pick
    assert rec.evidence["bench"]["batch"] == 256  # the largest batch measured
    assert [c.cost.value for c in rec.candidates] == sorted(c.cost.value for c in rec.candidates)
    by_bytes = recommend(m, bench=bench, cost_basis="bytes")
    assert by_bytes.chosen.name == "nvfp4-read/fp8-sr"
    assert recommend(m, bench=bench, batch=1).evidence["bench"]["batch"] == 1


def test_unmeasured_config_is_rejected_on_time(tmp_path):
    m = _results(tmp_path)
    times = {"fp32": 100.0, "nvfp4-read/fp16-sr": 50.0, "fp16-sr": 70.0}
    rec = recommend(m, bench=load_benchmark(write_bench(tmp_path / "d.csv", times)))
    assert rec.chosen.name == "nvfp4-read/fp16-sr"
    unmeasured = [c for c in rec.candidates if c.cost.value is None]
    assert {c.name for c in unmeasured} >= {"nvfp4-read/fp8-sr", "shared-nvfp4"}
    assert all("no measured step time" in " ".join(c.reasons()) for c in unmeasured)


def test_none_qualifies_names_the_closest(tmp_path):
    kl = {"fp32": 0.02, "shared-nvfp4": 0.5, "nvfp4-read/fp8-sr": 0.03, "nvfp4-read/fp32": 0.012,
          "fp16-sr": 0.1}
    m = _results(tmp_path, kl)
    rec = recommend(m)
    assert rec.chosen is None and rec.exit_code == 3
    # nvfp4-read/fp32 misses by 20%, fp32 by 100%: closest is the smallest worst excess
    assert rec.closest.name == "nvfp4-read/fp32"
    assert rec.closest.worst_excess == pytest.approx(0.2, rel=1e-6)
    d = rec.to_dict()
    assert d["status"] == "none_qualifies" and d["config"] is None
    assert d["closest"]["name"] == "nvfp4-read/fp32"
    assert "kl_mean" in d["closest"]["rejected_because"][0]


def test_closest_compares_metrics_by_allowance(tmp_path):
    # shared-nvfp4: KL 2x the limit (excess 1.0); nvfp4-read/fp32: 1.5% disagreement against an
    # allowed 1% (excess 0.5): the read copy is closer
    m = _results(tmp_path, {"shared-nvfp4": 0.02, "nvfp4-read/fp32": 0.001},
                 top1={"shared-nvfp4": 0.999, "nvfp4-read/fp32": 0.985})
    rec = recommend(m)
    assert rec.chosen is None
    assert rec.closest.name == "nvfp4-read/fp32"
    by = {c.name: c for c in rec.candidates}
    assert by["shared-nvfp4"].worst_excess == pytest.approx(1.0)
    assert by["nvfp4-read/fp32"].worst_excess == pytest.approx(0.5)


def test_missing_task_result_rejects_the_config(tmp_path):
    tasks = {k: v for k, v in TASKS.items() if k != ("math", "nvfp4-read/fp8-sr")}
    m = _results(tmp_path, tasks=tasks)
    rec = recommend(m)
    assert rec.chosen.name == "nvfp4-read/fp16-sr"
    fp8 = next(c for c in rec.candidates if c.name == "nvfp4-read/fp8-sr")
    assert "no result for this config" in " ".join(fp8.reasons())


def test_fp32_reference_qualifies_without_its_own_task_row(tmp_path):
    kl = {"fp32": 0.0, "shared-nvfp4": 0.5}
    tasks = {("gpqa", "shared-nvfp4"): (0.5, -0.3)}
    rec = recommend(_results(tmp_path, kl, tasks=tasks))
    assert rec.chosen.name == "fp32"


def test_partial_and_nan_results_are_rejected(tmp_path):
    kl = dict(KL) | {"nvfp4-read/fp8-sr": math.nan}
    m = _results(tmp_path, kl, tasks=TASKS, task_kw={"n": {("gpqa", "nvfp4-read/fp16-sr"): 150}})
    rec = recommend(m)
    by = {c.name: c for c in rec.candidates}
    assert "nan" in " ".join(by["nvfp4-read/fp8-sr"].reasons()).lower()
    assert "partial" in " ".join(by["nvfp4-read/fp16-sr"].reasons())
    assert rec.chosen.name == "nvfp4-read/fp32"


def test_require_tasks(tmp_path):
    m = _results(tmp_path)
    rec = recommend(m)
    assert rec.chosen is not None and rec.not_checked
    rec = recommend(m, Budget(require_tasks=True))
    assert rec.chosen is None and "no task results" in " ".join(rec.closest.reasons())


def test_budget_yaml_and_flags(tmp_path):
    f = tmp_path / "budget.yaml"
    f.write_text("max_kl: 0.0025\nmin_same_top1: 0.99\ntask_max_accuracy_drop:\n  gpqa: 2\n")
    b = Budget.from_yaml(f)
    assert b.max_kl == 0.0025 and b.task_max_accuracy_drop == {"gpqa": 2}
    assert b.max_accuracy_drop == 1.0  # default kept
    f.write_text("max_kl: 0.01\nmax_kll: 0.1\n")
    with pytest.raises(InputError, match="max_kll"):
        Budget.from_yaml(f)
    f.write_text("min_same_top1: 99\n")
    with pytest.raises(InputError, match="fraction"):
        Budget.from_yaml(f)


def _cli(*args):
    return runner.invoke(app, ["recommend", *map(str, args)])


def test_cli_writes_recommendation(tmp_path):
    drift = write_drift(tmp_path / "drift", KL)
    tasks = write_tasks(tmp_path / "tasks", TASKS)
    r = _cli(drift, tasks, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    d = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert d["model"] == "nvidia/NVIDIA-Nemotron-3-Nano-4B"
    assert d["config"] == "ckpt=fp8:sr,read=nvfp4,L=16"
    assert json.loads(d["vllm_additional_config"]) == {"replayssm_quant": d["config"]}
    assert d["budget"]["max_kl"] == 0.01 and d["budget"]["min_same_top1"] == 0.99
    assert d["evidence"]["drift_bucket"] == "[1024,2047)"
    assert d["rejected_cheaper"][0]["name"] == "shared-nvfp4"
    md = (tmp_path / "out" / "recommendation.md").read_text()
    assert "--additional-config" in md and "shared-nvfp4" in md
    # a ReplaySSM config needs the plugin's flags too
    assert "--use-replayssm --replayssm-buffer-len 16" in md and "--no-enable-prefix-caching" in md
    # a flag moves the pick; a budget file does the same
    r = _cli(drift, tasks, "--out", tmp_path / "o2", "--max-kl", "0.0025")
    assert r.exit_code == 0
    d2 = json.loads((tmp_path / "o2" / "recommendation.json").read_text())
    assert d2["name"] == "nvfp4-read/fp16-sr"
    (tmp_path / "b.yaml").write_text("max_kl: 0.1\n")
    r = _cli(drift, tasks, "--out", tmp_path / "o3", "--budget", tmp_path / "b.yaml")
    d3 = json.loads((tmp_path / "o3" / "recommendation.json").read_text())
    assert r.exit_code == 0 and d3["name"] == "shared-nvfp4"
    # the flag wins over the file
    r = _cli(drift, "--out", tmp_path / "o4", "--budget", tmp_path / "b.yaml", "--max-kl", "0.0025")
    d4 = json.loads((tmp_path / "o4" / "recommendation.json").read_text())
    assert d4["name"] == "nvfp4-read/fp16-sr"


def test_cli_exit_3_names_closest(tmp_path):
    drift = write_drift(tmp_path / "drift", {"fp32": 0.02, "nvfp4-read/fp32": 0.012})
    r = _cli(drift, "--out", tmp_path / "out")
    assert r.exit_code == 3, r.output
    assert "closest" in r.output and "nvfp4-read/fp32" in r.output
    d = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert d["status"] == "none_qualifies" and d["closest"]["name"] == "nvfp4-read/fp32"


def test_cli_bad_input_exits_2(tmp_path):
    drift = write_drift(tmp_path / "drift", KL)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    (tmp_path / "bad.yaml").write_text("max_kl: [1\n")
    bench = write_bench(tmp_path / "d.csv", {"fp32": 1.0}, shape="qwen3.5-4b")
    cases = [
        [tmp_path / "nowhere"],
        [tmp_path / "broken"],
        [drift, "--budget", tmp_path / "bad.yaml"],
        [drift, "--bucket", "[1,2)"],
        [drift, "--kl-stat", "kl_nope"],
        [drift, "--min-same-top1", "99"],
        [drift, "--bench", bench],  # no benchmark row has the model's shape
        [drift, "--bench", tmp_path / "missing.csv"],
        [drift, "--cost", "time"],
        [drift, "--shape", "no-such-shape"],
    ]
    for args in cases:
        r = _cli(*args, "--out", tmp_path / "o")
        assert r.exit_code == 2, (args, r.output)
        assert "error:" in r.output


def test_loader_reports_every_schema_problem(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({
        "model": "", "buckets": [{"bucket": "[0,16)"}],
        "configs": [{"name": "x", "config": "ckpt=fp5"},
                    {"name": "y", "config": "fp32", "overall": {"n": 1}, "buckets": []}]}))
    with pytest.raises(ResultsError) as e:
        load_results([d])
    text = str(e.value)
    assert len(e.value.problems) >= 4
    for piece in ("'model'", "buckets[0]", "ckpt=fp5", "lacks"):
        assert piece in text


def test_benchmark_loader(tmp_path):
    p = write_bench(tmp_path / "decode.csv", {"fp32": 100.0, "nvfp4-read/fp32": 40.0})
    b = load_benchmark(p)
    assert b.shapes == ["nemotron-3-nano-4b"] and b.batches("nemotron-3-nano-4b") == [1, 256]
    assert b.lookup("nemotron-3-nano-4b", 256, "nvfp4-read/fp32").window_us == 40.0
    assert b.lookup("nemotron-3-nano-4b", 256, "ckpt=fp32,read=nvfp4,L=16") is not None
    assert [r.name for r in b.peers("nemotron-3-nano-4b", 256)] == ["fla-fused-recurrent"]
    (tmp_path / "x.csv").write_text("shape,batch\nfoo,1\n")
    with pytest.raises(InputError, match="config_string"):
        load_benchmark(tmp_path / "x.csv")


# ---------------------------------------------------------------------------------- undecided
UNDECIDED_KL = {"fp32": 0.0, "nvfp4-read/fp32": 0.0015, "shared-nvfp4": 0.002}


def _paired(tmp_path, **kw):
    from tests.resultdata import paired_tasks

    drift = write_drift(tmp_path / "drift", UNDECIDED_KL)
    tasks = paired_tasks(tmp_path / "tasks", {"nvfp4-read/fp32": 0, "shared-nvfp4": 0},
                         model="nvidia/NVIDIA-Nemotron-3-Nano-4B", **kw)
    return drift, tasks


def test_cli_thin_task_evidence_is_undecided_exit_3(tmp_path):
    """The README's small flow: 4 items a task, every answer cut off and unreadable. Nothing is
    decided, so nothing is recommended; the console says why for each config."""
    drift, tasks = _paired(tmp_path, n=4, truncation=1.0, invalid=1.0)
    r = _cli(drift, tasks, "--out", tmp_path / "out")
    assert r.exit_code == 3, r.output
    assert "no config qualifies or is decided" in r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("undecided:")]
    assert {ln.split(":")[1].strip() for ln in lines} == {"shared-nvfp4", "nvfp4-read/fp32",
                                                         "fp32"}
    assert all("100% of answers truncated (limit 10%)" in ln for ln in lines)
    d = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert d["status"] == "undecided" and d["name"] is None
    assert {u["name"] for u in d["undecided"]} == {"shared-nvfp4", "nvfp4-read/fp32", "fp32"}
    assert {c["verdict"] for c in d["candidates"]} == {"undecided"}
    assert d["budget"]["max_truncation_rate"] == 0.1


def test_undecided_configs_are_never_picked(tmp_path):
    # 4 items, none truncated: the cheap configs' intervals straddle the limit; fp32, the
    # reference, is decided by definition and is the pick
    drift, tasks = _paired(tmp_path, n=4)
    rec = recommend(load_results([drift, tasks]).model())
    assert rec.chosen.name == "fp32" and rec.exit_code == 0
    assert [c.name for c in rec.undecided] == ["shared-nvfp4", "nvfp4-read/fp32"]
    # 500 concordant items decide it: the cheapest config passes
    drift, tasks = _paired(tmp_path / "big", n=500)
    rec = recommend(load_results([drift, tasks]).model())
    assert rec.chosen.name == "shared-nvfp4" and not rec.undecided


def test_truncation_limit_is_an_option(tmp_path):
    drift, tasks = _paired(tmp_path, n=500, truncation=0.5)
    r = _cli(drift, tasks, "--out", tmp_path / "a")
    assert r.exit_code == 3 and "50% of answers truncated" in r.output
    r = _cli(drift, tasks, "--out", tmp_path / "b", "--max-truncated", "0.6")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "b" / "recommendation.json").read_text())["name"] == \
        "shared-nvfp4"


def test_serve_command_has_the_mamba_backend_for_mamba2():
    from replayssm_quant.recommend import vllm_serve_command

    nemotron = vllm_serve_command("nvidia/NVIDIA-Nemotron-3-Nano-4B", "nvfp4-read/fp32", "mamba2")
    assert "--use-replayssm --replayssm-buffer-len 16 --mamba-backend triton" in nemotron
    qwen = vllm_serve_command("Qwen/Qwen3.5-4B", "nvfp4-read/fp32", "gdn")
    assert "--mamba-backend" not in qwen


def test_cli_prints_the_mamba_backend_for_nemotron(tmp_path):
    r = _cli(write_drift(tmp_path / "drift", KL), "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "--mamba-backend triton" in r.output
    d = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert "--mamba-backend triton" in d["vllm_serve"]
    assert "--mamba-backend triton" in (tmp_path / "out" / "recommendation.md").read_text()
