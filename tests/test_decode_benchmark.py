"""benchmarks/decode.py's tables: the 'bytes allow' column is the counted-byte ratio of the
conventional FP32 step to the config (ring included), '-' where it does not apply."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from replayssm_quant.precision import PRESETS, SHAPES, step_bytes

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("decode_bench", ROOT / "benchmarks" / "decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_byte_bound_column():
    mod = _module()
    shape = SHAPES["qwen3.5-4b"]
    cfg = PRESETS["nvfp4-read/fp16-sr"]
    want = step_bytes(PRESETS["fp32"], shape).window_average / step_bytes(cfg, shape).window_average
    assert abs(mod.byte_bound(shape, cfg) - want) < 1e-12
    assert 6.0 < mod.byte_bound(shape, cfg) < 6.2  # GDN's fp32 u ring caps it near 6.1x
    assert abs(mod.byte_bound(shape, PRESETS["fp32"]) - 1.0) < 1e-12
    rows = [dict(shape="qwen3.5-4b", batch=256, config="fp32", window_us=290.0, nonflush_us=290.0,
                 flush_us=290.0, bw_frac_window=0.87, speedup_vs_conv_fp32=1.0,
                 byte_bound_vs_conv_fp32=1.0),
            dict(shape="qwen3.5-4b", batch=256, config=cfg.label, window_us=200.0,
                 nonflush_us=70.0, flush_us=2200.0, bw_frac_window=0.2,
                 speedup_vs_conv_fp32=1.45, byte_bound_vs_conv_fp32=want),
            dict(shape="qwen3.5-4b", batch=256, config="verify T=8 replay-fp32",
                 window_us=3900.0, nonflush_us=3900.0, flush_us=3900.0,
                 speedup_vs_conv_fp32=0.07)]
    md = mod.markdown_table(rows, dict(device="test", copy_bandwidth=4.2e12, torch="t",
                                       triton="t", argv=["decode.py"]))
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert lines[0].endswith("| bytes allow |")
    assert lines[1].endswith("| 1.00x |")
    assert lines[2].endswith(f"| {want:.2f}x |")
    assert lines[3].endswith("| - |")


def test_time_variants_jobs_files(tmp_path):
    """benchmarks/time_variants.py reads the committed jobs files and rejects malformed jobs
    with a message instead of a traceback."""
    import json

    import pytest

    spec = importlib.util.spec_from_file_location("time_variants",
                                                  ROOT / "benchmarks" / "time_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("tune_r40_jobs_window.json", "tune_r40_jobs_new.json",
                 "tune_r88_jobs_fp32_flush_grid.json", "tune_r89_jobs_m2_fp32_flush_regs.json",
                 "tune_r90_jobs_batch1.json", "tune_r92_jobs_one_launch.json",
                 "tune_r94_jobs_batch1.json", "tune_r97_jobs_batch1.json",
                 "tune_r97_jobs_batch4.json", "tune_r99_jobs_evict.json",
                 "tune_r101_jobs_batch1.json", "tune_r101_jobs_batch4.json"):
        jobs = mod.load_jobs(str(ROOT / "reports" / "kernels" / name))
        assert jobs and all(s in SHAPES and mod.preset_config(c) for s, c, _, _ in jobs)
    assert mod.preset_config("replay-fp32@L8").L == 8
    assert mod.preset_config("replay-fp32") is PRESETS["replay-fp32"]
    for bad in ("replay-fp33", "replay-fp32@Lx"):
        with pytest.raises(KeyError):
            mod.preset_config(bad)
    rows = json.loads((ROOT / "reports" / "kernels" / "tune_r40_jobs_window.json").read_text())
    rows[0][3] = "both"
    tmp = tmp_path / "jobs.json"
    tmp.write_text(json.dumps(rows))
    with pytest.raises(SystemExit, match="job 0 must be"):
        mod.load_jobs(str(tmp))


def test_process_state_probe_on_tiny_shapes(monkeypatch):
    """benchmarks/probe_process_state.py times both steps of every probed shape at all four
    points (CPU dry run on tiny shapes: reference steps, plain timing)."""

    from replayssm_quant.precision import ModelShape

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("probe_state",
                                                  ROOT / "benchmarks" / "probe_process_state.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tiny = {"tiny-gdn": ModelShape("tiny-gdn", "gdn", 2, 32, 32, 1),
            "tiny-m2": ModelShape("tiny-m2", "mamba2", 2, 32, 32, 1)}
    monkeypatch.setattr(mod, "SHAPES", tiny)
    monkeypatch.setattr(mod, "CHURN_CONFIGS", ("fp32",))
    out = mod.probe(["tiny-gdn"], ["tiny-m2"], batch=2, reps=1, device="cpu")
    assert [p for p, _ in out] == ["fresh", "after tiny-m2", "after empty_cache", "again"]
    for _, t in out:
        conv, window = t["tiny-gdn"]
        assert conv > 0 and window > 0


def test_probe_timing_refuses_without_a_gpu(monkeypatch):
    """benchmarks/probe_timing.py names its probes in --help, rejects an unknown one, and
    stops with a message (not a traceback) where there is no GPU to time."""
    import pytest

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("probe_timing",
                                                  ROOT / "benchmarks" / "probe_timing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert set(mod.PROBES) == {"inplace", "warm", "clocks", "data", "ramp", "harness"}
    with pytest.raises(SystemExit) as e:
        mod.main(["nonsense"])
    assert e.value.code == 2
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a GPU"):
        mod.main(["ramp"])


def test_measure_times_steps_without_a_window_as_a_window(monkeypatch):
    """A conventional step is timed over CONV_STEPS steps with their own inputs, as a
    ReplaySSM window is over L (CPU dry run on a tiny shape)."""
    from replayssm_quant.precision import ModelShape

    mod = _module()
    seen = []
    real = mod.Workload.step

    def step(self, i, **kw):
        seen.append(i)
        return real(self, i, **kw)

    monkeypatch.setattr(mod.Workload, "step", step)
    tiny = ModelShape("tiny-gdn", "gdn", 2, 32, 32, 1)
    m = mod.measure(tiny, 2, PRESETS["fp32"], 1, device="cpu")
    assert m["window_us"] > 0 and m["window_us"] == m["flush_us"]
    assert sorted(set(seen)) == list(range(mod.CONV_STEPS))


def test_time_variants_compare_pairs_two_committed_logs(capsys):
    """``--compare`` reads two logs of time_variants.py (the committed batch-1 A/B of the
    relaxed counter), pairs their variants and gives each one's ratio to the conventional step
    of its own run; logs with nothing in common are refused."""
    import pytest

    spec = importlib.util.spec_from_file_location("time_variants",
                                                  ROOT / "benchmarks" / "time_variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kdir = ROOT / "reports" / "kernels"
    old = mod.parse_log(str(kdir / "tune_r101_relaxed_b1_old.log"))
    new = mod.parse_log(str(kdir / "tune_r101_relaxed_b1_new.log"))
    assert len(old) == len(new) == 16
    key = (1, "qwen3.5-4b", "replay-fp32", "{}")
    assert old[key]["win"] == 4.4 and new[key]["win"] == 4.0 and new[key]["fl"] == 5.0
    assert mod.main(["--compare", str(kdir / "tune_r101_relaxed_b1_old.log"),
                     str(kdir / "tune_r101_relaxed_b1_new.log")]) == 0
    table = capsys.readouterr().out
    assert "| 1 | qwen3.5-4b | replay-fp32 | {} | 4.4 | 4.0 | -9.1% | 0.95x | 1.00x |" in table
    flushes = mod.parse_log(str(kdir / "tune_r40_readcopy_flush_ab.log"))  # flush-mode lines
    assert flushes and any(set(v) == {"flush"} for v in flushes.values())
    with pytest.raises(SystemExit):
        mod.main(["--compare", str(kdir / "tune_r101_relaxed_b1_old.log"),
                  str(kdir / "tune_r99_evict_old.log")])
