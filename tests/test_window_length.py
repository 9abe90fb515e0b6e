"""The window length L per shape: the byte model's cost of each L, the sweep over L of the
decode benchmark (its plan and table, with a fake timer and on the interpreter), and the
recommender's choice of L from measured times, which follows the times and never picks an L
without its own accuracy results."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.precision import (
    PRESETS,
    SHAPES,
    ModelShape,
    best_window_by_bytes,
    step_bytes,
    window_bytes,
    window_family,
    window_name,
    window_optimum,
    with_window,
)
from replayssm_quant.recommend import Budget, choose_windows, load_benchmark, recommend, window_length_table
from replayssm_quant.results import load_results
from tests.resultdata import write_bench, write_drift

runner = CliRunner()
SPLIT = "nvfp4-read/fp16-sr"
FAM = "ckpt=fp16:sr,read=nvfp4"


# ------------------------------------------------------------------------------- byte model
def test_window_bytes_trade_ring_reads_against_the_flush():
    """The window average is src + rec + rec (L-1)/2 + (2 ck + rd - src - rec) / L: convex in
    L, so the best of a set of lengths sits beside the real-valued optimum."""
    shape = SHAPES["nemotron-3-super-120b"]
    cfg = PRESETS[SPLIT]
    wb = window_bytes(cfg, shape, (2, 4, 8, 16, 32, 64, 128))
    assert wb[16] == step_bytes(cfg, shape)  # the preset's own L
    n, rec = shape.d_state, shape.record_bytes(cfg)
    ck, rd = shape.rows * cfg.ckpt.row_bytes(n), shape.rows * cfg.read.row_bytes(n)
    for L, b in wb.items():
        want = rd + rec + rec * (L - 1) / 2 + (2 * ck + rd - rd - rec) / L
        assert b.window_average == pytest.approx(want, rel=1e-12)
    opt = window_optimum(cfg, shape)
    assert opt == pytest.approx(math.sqrt(2 * (2 * ck - rec) / rec))
    best = best_window_by_bytes(cfg, shape, tuple(wb))
    assert best in (2 ** math.floor(math.log2(opt)), 2 ** math.ceil(math.log2(opt)))
    # an FP32 checkpoint under an NVFP4 copy: more flush bytes, a longer optimum
    assert window_optimum(PRESETS["nvfp4-read/fp32"], shape) > opt
    assert best_window_by_bytes(PRESETS["nvfp4-read/fp32"], shape) == 32
    assert best_window_by_bytes(PRESETS["shared-nvfp4"], shape) == 8
    with pytest.raises(ValueError, match="conventional"):
        window_optimum(PRESETS["fp32"], shape)


def test_with_window_names_only_presets():
    cfg = PRESETS[SPLIT]
    assert with_window(cfg, 16) is cfg
    c32 = with_window(cfg, 32)
    assert c32.L == 32 and c32.name is None and str(c32) == f"{FAM},L=32"
    assert window_family(c32) == FAM and window_name(c32) == SPLIT
    with pytest.raises(ValueError, match="conventional"):
        with_window(PRESETS["fp16-sr"], 16)


# --------------------------------------------------------------------------- benchmark table
def _bench(tmp_path, times_by_L: dict[int, float], name="b.csv", batch=256):
    times = {"fp32": 100.0} | {f"{FAM},L={L}": t for L, t in times_by_L.items()}
    return load_benchmark(write_bench(tmp_path / name, times, batch=batch))


def test_benchmark_windows_and_fastest_L(tmp_path):
    b = _bench(tmp_path, {8: 40.0, 16: 31.0, 32: 29.0, 64: 33.0})
    wins = b.windows("nemotron-3-nano-4b", 256, SPLIT)
    assert list(wins) == [8, 16, 32, 64]
    assert b.best_window("nemotron-3-nano-4b", 256, SPLIT).config.L == 32
    assert b.windows("nemotron-3-nano-4b", 256, "fp32") == {}
    (entry,) = [e for e in b.window_table() if e["batch"] == 256]
    assert entry["preset"] == SPLIT and entry["best_L"] == 32
    b2 = _bench(tmp_path, {8: 40.0, 16: 28.0, 32: 29.0, 64: 33.0}, "b2.csv")
    assert b2.best_window("nemotron-3-nano-4b", 256, SPLIT).config.L == 16


def test_loader_reads_json_and_leaves_verify_rows_out(tmp_path):
    rows = [{"shape": "qwen3.5-4b", "batch": 256, "config": "replay-fp32",
             "config_string": "ckpt=fp32,read=none,L=16", "window_us": 160.0},
            {"shape": "qwen3.5-4b", "batch": 256, "config": "verify T=8 replay-fp32",
             "config_string": "ckpt=fp32,read=none,L=16", "window_us": 450.0,
             "verify_vs_conv_step": 0.9}]
    p = tmp_path / "decode.json"
    p.write_text(json.dumps({"meta": {}, "rows": rows}))
    b = load_benchmark(p)
    assert [r.window_us for r in b.rows] == [160.0]
    p.write_text(json.dumps({"rows": [{"shape": "x"}]}))
    with pytest.raises(Exception, match="window_us"):
        load_benchmark(p)


def test_window_length_table_and_configs_cli(tmp_path):
    shape = SHAPES["nemotron-3-nano-4b"]
    rows = window_length_table(shape)
    by = {r["name"]: r for r in rows}
    assert "fp32" not in by and set(by[SPLIT]["bytes_per_step"]) == {8, 16, 32, 64}
    assert by["nvfp4-read/fp32"]["bytes_best_L"] == 32
    csv = write_bench(tmp_path / "b.csv", {"fp32": 100.0, f"{FAM},L=8": 40.0,
                                           f"{FAM},L=16": 31.0, f"{FAM},L=32": 29.0})
    bench = load_benchmark(csv)
    m = {r["name"]: r for r in window_length_table(shape, bench=bench)}[SPLIT]["measured"]
    assert m[256]["best_L"] == 32 and m[1]["best_L"] == 32
    res = runner.invoke(app, ["configs", "--shape", "nemotron-3-nano", "--windows", "--json"])
    assert res.exit_code == 0, res.output
    assert {r["name"]: r for r in json.loads(res.output)}[SPLIT]["bytes_best_L"] == 16
    res = runner.invoke(app, ["configs", "--shape", "nemotron-3-nano", "--bench-table", str(csv)])
    assert res.exit_code == 0, res.output
    assert "fastest B=256" in res.output and "fewest bytes" in res.output
    res = runner.invoke(app, ["configs", "--shape", "qwen3.5-4b", "--bench-table", str(csv)])
    assert res.exit_code == 2 and "error:" in res.output


# ------------------------------------------------------------------------------ recommend
def _results(tmp_path, kl_by_L: dict[int, float]):
    kl = {"fp32": 0.0} | {f"{FAM},L={L}": v for L, v in kl_by_L.items()}
    return load_results([write_drift(tmp_path / "drift", kl)]).model()


@pytest.mark.parametrize("times,kl,chosen", [
    ({8: 40.0, 16: 31.0, 32: 29.0, 64: 33.0}, {16: 0.002, 32: 0.002}, 32),
    ({8: 40.0, 16: 28.0, 32: 29.0, 64: 33.0}, {16: 0.002, 32: 0.002}, 16),   # times moved
    ({8: 40.0, 16: 31.0, 32: 29.0, 64: 33.0}, {16: 0.002, 32: 0.05}, 16),    # L=32 fails
    ({8: 40.0, 16: 31.0, 32: 29.0, 64: 33.0}, {16: 0.05, 32: 0.05}, None),   # none passes
])
def test_recommend_chooses_L_from_measured_times(tmp_path, times, kl, chosen):
    m = _results(tmp_path, kl)
    rec = recommend(m, Budget(), bench=_bench(tmp_path, times))
    (w,) = rec.windows
    assert w.name == SPLIT and w.family == FAM and w.chosen == chosen
    assert w.times_us == times and set(w.verdicts) == set(kl)
    if chosen is not None:
        assert rec.chosen.config.L == chosen  # the overall pick agrees on time
    assert rec.to_dict()["window_lengths"][0]["chosen"] == chosen


def test_an_L_without_results_is_named_not_chosen(tmp_path):
    m = _results(tmp_path, {16: 0.002})
    rec = recommend(m, Budget(), bench=_bench(tmp_path, {16: 31.0, 32: 29.0, 64: 27.0}))
    (w,) = rec.windows
    assert w.fastest_measured == 64 and w.chosen == 16
    assert "L=64" in w.notes[0] and "no accuracy results" in w.notes[0]
    assert "evidence only at L=16" in w.notes[0]
    # results at an L the benchmark did not time
    m = _results(tmp_path / "b", {16: 0.002, 128: 0.001})
    (w,) = recommend(m, Budget(), bench=_bench(tmp_path, {16: 31.0, 32: 29.0}, "c.csv")).windows
    assert any("no measured time at L=128" in n for n in w.notes) and w.chosen == 16


def test_choose_windows_without_a_measured_window(tmp_path):
    m = _results(tmp_path, {16: 0.002})
    rec = recommend(m, Budget())
    assert rec.windows == []  # no benchmark: no choice
    bench = load_benchmark(write_bench(tmp_path / "b.csv", {"fp32": 100.0}))
    (w,) = choose_windows(rec.candidates, bench, "nemotron-3-nano-4b", 256)
    assert w.chosen is None and "no window measured" in w.notes[0]


def test_recommend_cli_prints_the_window_choice(tmp_path):
    drift = write_drift(tmp_path / "drift", {"fp32": 0.0, f"{FAM},L=16": 0.002,
                                             f"{FAM},L=32": 0.002})
    csv = write_bench(tmp_path / "b.csv", {"fp32": 100.0, f"{FAM},L=16": 31.0,
                                           f"{FAM},L=32": 29.0, f"{FAM},L=64": 27.0})
    res = runner.invoke(app, ["recommend", str(drift), "--bench-table", str(csv),
                              "--out", str(tmp_path / "rec")])
    assert res.exit_code == 0, res.output
    assert f"window length of {SPLIT}" in res.output and "L=32" in res.output
    one = write_bench(tmp_path / "one.csv", {"fp32": 100.0, f"{FAM},L=16": 31.0})
    res = runner.invoke(app, ["recommend", str(drift), "--bench", str(one),
                              "--out", str(tmp_path / "rec1")])
    assert "only L=16 timed" in res.output
    md = (tmp_path / "rec" / "recommendation.md").read_text()
    assert "Window length per split" in md and "no results" in md
    data = json.loads((tmp_path / "rec" / "recommendation.json").read_text())
    assert data["window_lengths"][0]["chosen"] == 32


# ---------------------------------------------------------------------- the sweep over L
def _decode():
    import benchmarks.decode as mod

    return mod


def test_sweep_over_L_plans_every_preset_length_and_batch(tmp_path, monkeypatch):
    """``--L 8 16 32 64 --window-only`` on the tiny shapes with a fake timer: one row per
    (preset, L, batch, shape), the ratio to the conventional FP32 step of the same block, the
    bandwidth fraction, and the fastest L marked as the times say."""
    mod = _decode()
    calls = []
    fast = {"tiny-m2": 32, "tiny-gdn": 16}

    def fake(shape, batch, cfg, reps, device="cuda", layers=1, stagger=False,
             window_only=False, **kw):
        calls.append((shape.name, batch, cfg.label, cfg.L, window_only, device))
        us = 100.0 if cfg.L == 1 else 40.0 + abs(math.log2(cfg.L / fast[shape.name]))
        return dict(window_us=us * batch, nonflush_us=float("nan"), flush_us=float("nan"),
                    layers=1)

    monkeypatch.setattr(mod, "measure", fake)
    out = tmp_path / "sweep"
    assert mod.main(["--device", "cpu", "--tiny", "--L", "8", "16", "32", "64", "--window-only",
                     "--batch", "1", "64", "--verify-T", "0", "--reps", "1",
                     "--out", str(out)]) == 0
    windowed = [c for c in PRESETS.values() if c.L > 1]
    conv = [c for c in PRESETS.values() if c.L == 1]
    assert len(calls) == 2 * 2 * (len(windowed) * 4 + len(conv))
    assert all(c[4] and c[5] == "cpu" for c in calls)
    data = json.loads((out / "window_l.json").read_text())
    rows = data["rows"]
    keys = {(r["preset"], r["L"], r["batch"], r["shape"]) for r in rows}
    for s in fast:
        for b in (1, 64):
            for c in windowed:
                assert {(c.label, L, b, s) for L in (8, 16, 32, 64)} <= keys
            assert (("fp32", 1, b, s)) in keys
    for r in rows:
        assert r["speedup_vs_conv_fp32"] == pytest.approx(100.0 * r["batch"] / r["window_us"])
        assert r["bw_frac_window"] == pytest.approx(
            r["bytes_per_step"] / (r["window_us"] * 1e-6) / data["meta"]["copy_bandwidth"])
        if r["L"] > 1:
            assert r["fastest"] == (r["L"] == fast[r["shape"]])
    assert {(e["shape"], e["best_L"]) for e in data["best"]} == set(fast.items())
    assert data["meta"]["window_only"] and data["meta"]["complete"]
    # the table is a benchmark the recommender and `configs` read
    bench = load_benchmark(out / "window_l.json")
    assert bench.best_window("tiny-m2", 64, SPLIT).config.L == 32
    assert (out / "window_l.csv").read_text().startswith("L,batch,")
    assert "**" in (out / "window_l.md").read_text()


def test_window_only_measure_runs_only_the_window_on_the_interpreter(monkeypatch):
    """A real measurement on the interpreter (tiny shape, CPU): the window graph runs, the
    flush and non-flush graphs do not."""
    from dataclasses import replace

    mod = _decode()
    seen = []
    real = mod.Workload.step

    def step(self, i, **kw):
        seen.append((i, kw.get("advance", True)))
        return real(self, i, **kw)

    monkeypatch.setattr(mod.Workload, "step", step)
    monkeypatch.setattr(mod, "CONV_STEPS", 2)
    tiny = ModelShape("tiny-m", "mamba2", 2, 16, 32, 1)
    m = mod.measure(tiny, 1, replace(PRESETS[SPLIT], L=2), 1, device="cpu", window_only=True)
    assert m["window_us"] > 0 and math.isnan(m["flush_us"]) and math.isnan(m["nonflush_us"])
    assert [i for i, _ in seen] == [0, 1, 0, 1]  # one window, called twice (CPU timing)
