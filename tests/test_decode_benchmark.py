"""benchmarks.decode's tables: the 'bytes allow' column is the counted-byte ratio of the
conventional FP32 step to the config (ring included), '-' where it does not apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayssm_quant.precision import PRESETS, SHAPES, step_bytes

ROOT = Path(__file__).resolve().parents[1]


def _module():
    import benchmarks.decode as mod

    return mod


def _variants_module():
    import benchmarks.variants as mod

    return mod


def _harness_module():
    import benchmarks.harness as mod

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


def test_time_variants_jobs_files(tmp_path, capsys):
    """``tune_decode variants`` reads a jobs file of every mode and rejects malformed jobs with
    a message instead of a traceback."""
    import json

    import pytest

    mod = _variants_module()
    jobs_file = tmp_path / "every_mode.json"
    jobs_file.write_text(json.dumps([
        ["qwen3.5-4b", "fp32", {}, "window"], ["qwen3.5-4b", "replay-fp32", {"flush_warps": 1}, "window"],
        ["nemotron-3-super-120b", "replay-fp32@L8", {}, "flush"],
        ["nemotron-3-super-120b", "nvfp4-read/fp16-sr", {"advance": False}, "flush"],
        ["qwen3.5-122b-a10b", "replay-fp32", {"pdl": True}, "verify"],
        ["nemotron-3-nano-4b", "shared-fp8", {}, "stagger"], ["qwen3.5-4b", "fp32", {}, "fla"]]))
    jobs = mod.load_jobs(str(jobs_file))
    assert [mode for *_, mode in jobs] == ["window", "window", "flush", "flush", "verify", "stagger", "fla"]
    assert all(s in SHAPES and mod.preset_config(c) for s, c, _, _ in jobs)
    assert mod.preset_config("replay-fp32@L8").L == 8
    assert mod.preset_config("replay-fp32") is PRESETS["replay-fp32"]
    for bad in ("replay-fp33", "replay-fp32@Lx"):
        with pytest.raises(KeyError):
            mod.preset_config(bad)
    rows = json.loads(jobs_file.read_text())
    rows[0][3] = "both"
    tmp = tmp_path / "jobs.json"
    tmp.write_text(json.dumps(rows))
    with pytest.raises(SystemExit, match="job 0 must be"):
        mod.load_jobs(str(tmp))
    good = tmp_path / "stagger.json"
    good.write_text(json.dumps([["qwen3.5-4b", "replay-fp32", {}, "stagger"]]))
    for bad in ("0", "two"):  # refused before anything is timed
        with pytest.raises(SystemExit):
            mod.main(["--jobs", str(good), "--layers", bad])
        assert "positive count or 'auto'" in capsys.readouterr().err
    flush = tmp_path / "flush.json"
    flush.write_text(json.dumps([["qwen3.5-4b", "replay-fp32", {}, "flush"]]))
    with pytest.raises(SystemExit):
        mod.main(["--jobs", str(flush), "--layers", "auto"])
    assert "a flush job times one layer" in capsys.readouterr().err
    for job, msg in ((["qwen3.5-4b", "replay-fp32", {}, "fla"], "takes preset 'fp32'"),
                     (["qwen3.5-4b", "fp32", {"block_v": 8}, "fla"], "takes preset 'fp32'")):
        bad_fla = tmp_path / "fla.json"
        bad_fla.write_text(json.dumps([job]))
        with pytest.raises(SystemExit, match=msg):
            mod.load_jobs(str(bad_fla))
    fla_m2 = tmp_path / "fla_m2.json"
    fla_m2.write_text(json.dumps([["nemotron-3-super-120b", "fp32", {}, "fla"]]))
    with pytest.raises(SystemExit, match="fla jobs need a GDN shape"):
        mod.main(["--jobs", str(fla_m2)])


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
    tiny = ModelShape("tiny-gdn", "gdn", 2, 16, 32, 1)
    m = mod.measure(tiny, 1, PRESETS["fp32"], 1, device="cpu")
    assert m["window_us"] > 0 and m["window_us"] == m["flush_us"]
    assert sorted(set(seen)) == list(range(mod.CONV_STEPS))


def _variant_log(tag: str, wins: dict[tuple[str, str], tuple[float, float, float]],
                 flushes: dict[tuple[str, str], float] | None = None) -> str:
    """A log as ``tune_decode variants`` prints it at batch 1: a comment, the copy bandwidth,
    one line per window variant and per flush variant."""
    lines = [f"# python -m benchmarks.tune_decode variants --jobs jobs.json --batch 1 --tag {tag}",
             f"{tag} copy 4.165 TB/s"]
    for (shape, preset), (win, nf, fl) in wins.items():
        lines.append(f"{tag} B=1 {shape:22s} {preset:20s} {'{}':50s} win {win:8.1f} nf {nf:8.1f} "
                     f"fl {fl:8.1f}")
    for (shape, preset), t in (flushes or {}).items():
        lines.append(f"{tag} B=1 {shape:22s} {preset:20s} {'{}':50s} flush {t:8.1f}")
    return "\n".join(lines) + "\n"


def test_time_variants_compare_pairs_two_logs(tmp_path, capsys):
    """``--compare`` reads two logs of ``tune_decode variants``, pairs their variants and gives
    each one's ratio to the conventional step of its own run; logs with nothing in common are
    refused."""
    import pytest

    mod = _variants_module()
    shapes = ("nemotron-3-nano-4b", "nemotron-3-super-120b", "qwen3.5-4b", "qwen3.5-122b-a10b")
    presets = ("fp32", "replay-fp32", "nvfp4-read/fp16-sr", "fp8-read/fp32")
    old_w = {(s, p): (4.2 + i * 0.1, 4.1, 5.0) for i, (s, p) in
             enumerate((s, p) for s in shapes for p in presets)}
    new_w = {k: (v[0] - 0.3, v[1], v[2]) for k, v in old_w.items()}
    old_w[("qwen3.5-4b", "fp32")], new_w[("qwen3.5-4b", "fp32")] = (4.2, 4.2, 4.2), (4.0, 4.0, 4.0)
    old_w[("qwen3.5-4b", "replay-fp32")] = (4.4, 4.4, 5.0)
    new_w[("qwen3.5-4b", "replay-fp32")] = (4.0, 3.9, 5.0)
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    old_log.write_text(_variant_log("old", old_w))
    new_log.write_text(_variant_log("new", new_w, {("qwen3.5-4b", "replay-fp32"): 5.1}))
    old, new = mod.parse_log(str(old_log)), mod.parse_log(str(new_log))
    assert len(old) == 16 and len(new) == 17
    key = (1, "qwen3.5-4b", "replay-fp32", "{}", "window")
    assert old[key]["win"] == 4.4 and new[key]["win"] == 4.0 and new[key]["fl"] == 5.0
    assert new[key]["n"] == 1
    assert new[(1, "qwen3.5-4b", "replay-fp32", "{}", "flush")] == {"flush": 5.1, "n": 1}
    assert mod.main(["--compare", str(old_log), str(new_log)]) == 0
    table = capsys.readouterr().out
    assert "| 1 | qwen3.5-4b | replay-fp32 | {} | window | 4.4 | 4.0 | -9.1% | 0.95x | 1.00x |" in table
    other = tmp_path / "other.log"
    other.write_text(_variant_log("x", {("qwen3.5-4b", "shared-fp8"): (3.0, 3.0, 3.0)}))
    with pytest.raises(SystemExit):
        mod.main(["--compare", str(old_log), str(other)])


def test_time_variants_log_keeps_modes_apart_and_averages_repeats(tmp_path):
    """A variant timed as a window and as a verify gives two entries (the mode is part of the
    key), and a variant timed twice in one log is the mean of both lines; the verify's ratio
    to the conventional step comes out of the same run."""
    mod = _variants_module()
    conv = "t B=256 qwen3.5-4b  fp32  {}  win  266.0 nf  266.0 fl  266.0"
    body = [conv, "t B=256 qwen3.5-4b  replay-fp32  {}  win  172.0 nf  160.0 fl  360.0",
            "t B=256 qwen3.5-4b  replay-fp32  {}  verify  250.0",
            "t B=256 qwen3.5-4b  replay-fp32  {}  verify  260.0",
            "t B=256 qwen3.5-4b  replay-fp32  {}  stagger  180.0",
            "t B=256 qwen3.5-4b  fp32  {}  fla  250.0"]
    old, new = tmp_path / "old.log", tmp_path / "new.log"
    old.write_text("\n".join(body) + "\n")
    new.write_text("\n".join([conv, "t B=256 qwen3.5-4b  replay-fp32  {}  verify  240.0"]) + "\n")
    runs = mod.parse_log(str(old))
    assert runs[(256, "qwen3.5-4b", "replay-fp32", "{}", "window")]["win"] == 172.0
    assert runs[(256, "qwen3.5-4b", "replay-fp32", "{}", "verify")] == {"flush": 255.0, "n": 2}
    assert runs[(256, "qwen3.5-4b", "replay-fp32", "{}", "stagger")] == {"flush": 180.0, "n": 1}
    assert runs[(256, "qwen3.5-4b", "fp32", "{}", "fla")] == {"flush": 250.0, "n": 1}
    table = mod.compare(runs, mod.parse_log(str(new)))
    assert "| 256 | qwen3.5-4b | replay-fp32 | {} | verify | 255.0 | 240.0 | -5.9% | 1.04x | 1.11x |" in table
    assert "| window | 172.0 |" not in table  # the new log has no window of it


def _targets_module():
    import benchmarks.targets as mod

    return mod


def _sweep_rows(conv_us=500.0, replay_us=280.0, nvfp4_us=70.0, verify_us=450.0, fla_us=None,
                shape="qwen3.5-4b", kind="gdn", batch=256, conv_bw=0.96):
    """Rows shaped as benchmarks.decode writes them, for one (shape, batch)."""
    def row(config, L, win, nf, fl, bw=0.9):
        return dict(shape=shape, kind=kind, batch=batch, config=config, L=L, window_us=win,
                    nonflush_us=nf, flush_us=fl, bw_frac_window=bw, bw_frac_nonflush=bw,
                    bw_frac_flush=bw, byte_bound_vs_conv_fp32=1.8)
    rows = [row("fp32", 1, conv_us, conv_us, conv_us, conv_bw),
            row("replay-fp32", 16, replay_us, replay_us * 0.93, replay_us * 2.1),
            row("nvfp4-read/fp16-sr", 16, nvfp4_us * 1.5, nvfp4_us, nvfp4_us * 9, 0.3),
            dict(shape=shape, kind=kind, batch=batch, config="verify T=8 replay-fp32", L=16,
                 window_us=verify_us, nonflush_us=verify_us, flush_us=verify_us,
                 verify_vs_conv_step=verify_us / conv_us)]
    if fla_us:
        rows.append(dict(shape=shape, kind=kind, batch=batch, config="fla-fused-recurrent", L=1,
                         window_us=fla_us, nonflush_us=fla_us, flush_us=fla_us, bw_frac_window=0.98))
    return rows


def test_targets_verdicts_follow_the_numbers():
    """Each target's verdict is the bound applied to the number formed from the rows: moving
    one time across its bound flips exactly that verdict; targets whose rows are missing or
    whose batch does not apply give no verdict."""
    mod = _targets_module()
    v = {x.target: x for x in mod.evaluate(_sweep_rows(fla_us=490.0))}
    assert abs(v["replay-fp32-window"].value - 500 / 280) < 1e-12 and v["replay-fp32-window"].met
    assert "bytes allow 1.80x" in v["replay-fp32-window"].detail
    assert "against 500.0 us (0.96 of copy bandwidth)" in v["replay-fp32-window"].detail
    assert not v["nvfp4-fp16sr-window"].met  # 500 / 105 < 7
    assert abs(v["nvfp4-nonflush"].value - 280 * 0.93 / 70) < 1e-12 and not v["nvfp4-nonflush"].met
    assert v["verify-replay-fp32"].met and abs(v["verify-replay-fp32"].value - 0.9) < 1e-12
    assert v["replay-fp32-vs-fla"].met  # 490 / 280 = 1.75
    fla = [x for x in mod.evaluate(_sweep_rows(fla_us=470.0))
           if x.target == "replay-fp32-vs-fla"][0]
    assert not fla.met and abs(fla.value - 470 / 280) < 1e-12
    assert not v["every-kernel-bandwidth"].met and "nvfp4-read/fp16-sr non-flush 0.30" in \
        v["every-kernel-bandwidth"].detail
    slow = {x.target: x for x in mod.evaluate(_sweep_rows(verify_us=510.0))}
    assert not slow["verify-replay-fp32"].met
    assert "replay-fp32-vs-fla" not in slow  # no FLA row: no verdict, not a pass
    assert "batch1-no-regression" not in v  # batch 256 rows
    mamba = {x.target for x in mod.evaluate(_sweep_rows(fla_us=470.0, kind="mamba2"))}
    assert "replay-fp32-vs-fla" not in mamba  # a GDN-only target
    b1 = [x for x in mod.evaluate(_sweep_rows(batch=1, replay_us=560.0)) if x.target.startswith("batch1")]
    assert len(b1) == 1 and not b1[0].met and "replay-fp32 0.89" in b1[0].detail
    assert [x.target for x in mod.evaluate(_sweep_rows(batch=1))] == ["batch1-no-regression"]
    nan = _sweep_rows()
    nan[1]["window_us"] = float("nan")
    assert not [x for x in mod.evaluate(nan) if x.target == "replay-fp32-window"][0].met


def test_targets_flag_a_ratio_over_a_slow_baseline(tmp_path):
    """A ratio to a conventional step below SLOW_BASELINE of copy bandwidth also carries its
    value with that step at SLOW_BASELINE: a window met only over the slow step is met but
    not trusted, and the table, JSON and summary say so; a verify that holds either way, and
    every ratio over a step at full speed, carry nothing."""
    mod = _targets_module()
    ok = {x.target: x for x in mod.evaluate(_sweep_rows())}
    assert all(x.adjusted is None and x.trusted == x.met for x in ok.values())
    v = {x.target: x for x in mod.evaluate(_sweep_rows(conv_bw=0.90))}
    win = v["replay-fp32-window"]
    assert win.met and not win.trusted
    assert abs(win.adjusted - 500 / 280 * 0.90 / 0.95) < 1e-12
    ver = v["verify-replay-fp32"]
    assert ver.met and ver.trusted and abs(ver.adjusted - 0.9 * 0.95 / 0.90) < 1e-12
    assert v["nvfp4-nonflush"].adjusted is None  # not a ratio to the conventional step
    md = mod.markdown(list(v.values()))
    assert "yes, over a slow baseline" in md
    assert "1 of them only over a conventional step below 0.95" in md
    sweep, js = tmp_path / "s.json", tmp_path / "t.json"
    sweep.write_text(json.dumps(dict(meta={}, rows=_sweep_rows(conv_bw=0.90))))
    assert mod.main([str(sweep), "--json", str(js)]) == 0
    got = {d["target"]: d for d in json.loads(js.read_text())}
    assert got["replay-fp32-window"]["met"] and not got["replay-fp32-window"]["trusted"]


def test_targets_table_and_cli(tmp_path):
    """The CLI reads decode.json files (later files replace earlier rows, but a ratio takes
    both its rows from one file, the latest that holds them), writes the Markdown table and
    the verdicts as JSON, and refuses a file that is not a decode.py result."""
    import json

    import pytest

    mod = _targets_module()
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(dict(meta={}, rows=_sweep_rows(replay_us=300.0))))
    b.write_text(json.dumps(dict(meta={}, rows=_sweep_rows(replay_us=250.0)[:2])))
    # c: a later run with its own conventional step (slower) and window
    c.write_text(json.dumps(dict(meta={}, rows=[_sweep_rows(conv_us=520.0)[0]]
                                 + _sweep_rows(replay_us=200.0)[1:2])))
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    assert mod.main([str(a), str(b), "--out", str(md), "--json", str(js)]) == 0
    verdicts = {d["target"]: d for d in json.loads(js.read_text())}
    assert abs(verdicts["replay-fp32-window"]["value"] - 2.0) < 1e-12  # b's rows replaced a's
    assert verdicts["replay-fp32-window"]["detail"].endswith("[b]")
    text = md.read_text()
    assert "### replay-fp32-window" in text and "| qwen3.5-4b | 256 | 2.000 | >= 1.75 | yes |" in text
    # b alone lacks the NVFP4 rows: that ratio still comes from a, whole
    assert abs(verdicts["nvfp4-nonflush"]["value"] - 300 * 0.93 / 70) < 1e-12
    only_window = tmp_path / "w.json"
    only_window.write_text(json.dumps(dict(meta={}, rows=_sweep_rows(replay_us=250.0)[1:2])))
    assert mod.main([str(a), str(only_window), "--json", str(js)]) == 0
    verdicts = {d["target"]: d for d in json.loads(js.read_text())}
    assert abs(verdicts["replay-fp32-window"]["value"] - 500 / 300) < 1e-12  # never 500 / 250
    assert mod.main([str(a), str(c), "--json", str(js)]) == 0
    verdicts = {d["target"]: d for d in json.loads(js.read_text())}
    assert abs(verdicts["replay-fp32-window"]["value"] - 520 / 200) < 1e-12  # c's own pair
    assert abs(verdicts["conv-fp32-bandwidth"]["value"] - 0.96) < 1e-12
    assert "**no**" in text and "checks met." in text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(SystemExit, match="not a decode.py result"):
        mod.main([str(bad)])


def test_decode_outputs_carry_the_targets(tmp_path):
    """decode.py's files carry the verdicts: a "targets" list in decode.json, the table after
    the timings in decode.md."""
    import json

    mod = _module()
    meta = dict(device="test", copy_bandwidth=4.2e12, torch="t", triton="t", argv=["decode.py"])
    mod.write_outputs(tmp_path, _sweep_rows(), meta)
    data = json.loads((tmp_path / "decode.json").read_text())
    assert {d["target"] for d in data["targets"]} >= {"replay-fp32-window", "verify-replay-fp32"}
    md = (tmp_path / "decode.md").read_text()
    assert md.index("## qwen3.5-4b, batch 256") < md.index("## Targets")


ARGS = ["--shapes", "tiny-gdn", "tiny-m2", "--configs", "replay-fp32", "nvfp4-read/fp16-sr",
        "fp16-sr", "--batch", "2", "--device", "cpu"]


def test_targets_plot_scores_and_draws(tmp_path):
    """``--plot``: each check at value / bound (>= 1 when met, the bound's side flipped for
    upper bounds), drawn as a PNG; a missing value is left out, not drawn at 0."""
    mod = _targets_module()
    lo = mod.Verdict("t", "s", 256, 1.5, 1.75, ">=", False, "")
    up = mod.Verdict("v", "s", 256, 0.8, 1.0, "<=", True, "")
    assert abs(mod.score(lo) - 1.5 / 1.75) < 1e-12 and abs(mod.score(up) - 1.25) < 1e-12
    assert mod.score(mod.Verdict("t", "s", 1, float("nan"), 1.0, ">=", False, "")) != \
        mod.score(mod.Verdict("t", "s", 1, float("nan"), 1.0, ">=", False, ""))
    sweep = tmp_path / "decode.json"
    sweep.write_text(json.dumps(dict(meta={}, rows=_sweep_rows() + _sweep_rows(
        shape="qwen3.5-122b-a10b", batch=512, replay_us=250.0))))
    out = tmp_path / "targets.png"
    assert mod.main([str(sweep), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


class _FakeCuda:
    """A stand-in for ``torch.cuda`` that logs the host-side order of calls and plays back
    event times: what ``timed_replays`` and ``hold_cycles`` ask of the GPU."""

    def __init__(self, elapsed_ms):
        self.log, self.elapsed = [], list(elapsed_ms)
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.name = f"event{len(fake.log)}"

            def record(self):
                fake.log.append("record")

            def synchronize(self):
                fake.log.append("sync")

            def elapsed_time(self, end):
                return fake.elapsed.pop(0)

        self.Event = Event

    def _sleep(self, cycles):
        self.log.append(f"sleep {cycles}")

    def current_device(self):
        return 7


def test_timed_replays_hold_before_start_event():
    """Each timed replay is queued behind the GPU hold: sleep, start event, replay, end event,
    in that order every time; without a hold no sleep is queued; the median is per call of
    the graph's ``repeat`` copies."""
    mod = _harness_module()
    fake = _FakeCuda([4.0, 1.0, 2.0])
    t = mod.timed_replays(lambda: fake.log.append("replay"), 3, repeat=2, hold=5000, cuda=fake)
    assert fake.log == ["sleep 5000", "record", "replay", "record", "sync"] * 3
    assert t == pytest.approx(2.0e-3 / 2)
    fake = _FakeCuda([3.0])
    mod.timed_replays(lambda: fake.log.append("replay"), 1, hold=0, cuda=fake)
    assert fake.log == ["record", "replay", "record", "sync"]


def test_hold_cycles_calibrates_once_per_device():
    """The cycles of a hold come from one timed sleep of 2^21 cycles on the device: a sleep
    that took 1.0 ms gives 2097 cycles per us, and later holds reuse the calibration."""
    mod = _harness_module()
    fake = _FakeCuda([1.0])
    assert mod.hold_cycles(100.0, cuda=fake) == int(100.0 * (1 << 21) / 1000.0)
    assert fake.log == [f"sleep {1 << 21}", "record", f"sleep {1 << 21}", "record", "sync"]
    fake.log.clear()
    assert mod.hold_cycles(10.0, cuda=fake) == int(10.0 * (1 << 21) / 1000.0)
    assert fake.log == []  # no second calibration


def test_layer_count_holds_twice_the_l2():
    """``--layers auto`` rotates through enough layers that their non-flush working sets hold
    twice the L2 (at least one, at most MAX_LAYERS); an explicit count is kept, a count below
    one refused, on the CLI too."""
    from dataclasses import replace

    from replayssm_quant.precision import ModelShape

    mod = _module()
    tiny = ModelShape("tiny-m", "mamba2", 4, 16, 32, 1)
    w = mod.Workload(tiny, 2, replace(PRESETS["nvfp4-read/fp16-sr"], L=4), 4, device="cpu")
    b = mod.working_set(w)
    ckpt = w.cache.ckpt.data.numel() * w.cache.ckpt.data.element_size()
    read = w.cache.read.data.numel() * w.cache.read.data.element_size()
    assert read < b < ckpt < mod.cache_bytes(w)  # read copy and ring, not the checkpoint
    conv = mod.Workload(tiny, 2, PRESETS["fp32"], 4, device="cpu")
    assert mod.working_set(conv) == mod.cache_bytes(conv)  # read and written: the state once
    assert mod.layer_count("auto", w, l2_bytes=10 * b) == 20
    assert mod.layer_count("auto", w, l2_bytes=10 * b + 1) == 21
    assert mod.layer_count("auto", w, l2_bytes=1) == 1
    assert mod.layer_count("auto", w, l2_bytes=b * mod.MAX_LAYERS) == mod.MAX_LAYERS
    assert mod.layer_count("auto", w, l2_bytes=0) == 1
    assert mod.layer_count(3, w) == 3
    with pytest.raises(ValueError, match="positive"):
        mod.layer_count(0, w)
    assert mod._layers_arg("auto") == "auto" and mod._layers_arg("5") == 5
    for bad in ("0", "-2", "many"):
        with pytest.raises(Exception, match="positive count or 'auto'"):
            mod._layers_arg(bad)


def test_flush_timing_runs_the_windows_flush(monkeypatch):
    """The flush timed alone is the window's flush step: every call finds each row's cursor
    at L-1, flushes and moves it on (its flush index counts the flushes), and the reset in
    front of it is timed apart and taken off; ``advance=False`` times the step that holds the
    cursors instead (CPU dry run on a tiny shape, where every timed function runs twice)."""
    from dataclasses import replace

    from replayssm_quant.precision import ModelShape

    mod = _module()
    seen = []
    real = mod.Workload.step

    def step(self, i, **kw):
        seen.append((i, kw.get("advance", True), self.cache.cursor.tolist()))
        return real(self, i, **kw)

    monkeypatch.setattr(mod.Workload, "step", step)
    times = iter([5.0, 2.0])
    monkeypatch.setattr(mod, "time_graph", lambda fn, reps, repeat=1: (fn(), fn(), next(times))[2])
    tiny = ModelShape("tiny-m", "mamba2", 4, 16, 32, 1)
    cfg = replace(PRESETS["nvfp4-read/fp16-sr"], L=4)
    w = mod.Workload(tiny, 3, cfg, steps=cfg.L, device="cpu")
    fi = w.cache.flush_index.clone()
    assert mod.time_flush([w], 1) == 3.0  # the flush graph's 5 less the reset's 2
    assert seen == [(3, True, [3, 3, 3])] * 2  # the reset graph runs no step
    assert (w.cache.flush_index == fi + 2).all() and (w.cache.cursor == 3).all()
    seen.clear()
    times = iter([4.0])
    assert mod.time_flush([w], 1, advance=False) == 4.0
    assert seen == [(3, False, [3, 3, 3])] * 2
    assert (w.cache.flush_index == fi + 2).all()  # held: no flush counted
    times = iter([6.0, 1.0])
    assert mod.measure_flush(tiny, 3, cfg, 1, device="cpu") == 5.0 * 1e6


def test_nonflush_timing_runs_the_windows_nonflush_steps(monkeypatch):
    """The non-flush step is timed directly: every call sets the cursors back to 0 and runs
    the window's steps 0..L-2 (none flushes), the reset timed apart and taken off, the time
    given per step and layer; ``measure`` reports it beside the derived form (CPU dry run)."""
    from dataclasses import replace

    from replayssm_quant.precision import ModelShape

    mod = _module()
    seen = []
    real = mod.Workload.step

    def step(self, i, **kw):
        seen.append((i, kw.get("advance", True), self.cache.cursor.tolist()))
        return real(self, i, **kw)

    monkeypatch.setattr(mod.Workload, "step", step)
    times = iter([9.0, 3.0])
    monkeypatch.setattr(mod, "time_graph", lambda fn, reps, repeat=1: (fn(), fn(), next(times))[2])
    tiny = ModelShape("tiny-m", "mamba2", 4, 16, 32, 1)
    cfg = replace(PRESETS["nvfp4-read/fp16-sr"], L=4)
    ws = [mod.Workload(tiny, 3, cfg, steps=cfg.L, device="cpu") for _ in range(2)]
    fi = [w.cache.flush_index.clone() for w in ws]
    assert mod.time_nonflush(ws, 1) == (9.0 - 3.0) / (3 * 2)  # per step and layer
    # twice (the dry run calls each function twice): steps 0, 1, 2 on both layers, in turn
    assert [(i, c) for i, _, c in seen] == [(i, [i] * 3) for i in range(3) for _ in ws] * 2
    for w, f in zip(ws, fi, strict=True):
        assert (w.cache.flush_index == f).all()  # no row flushed
        assert (w.cache.cursor == 0).all()  # the reset graph, timed last, set them back
    monkeypatch.undo()
    m = mod.measure(tiny, 3, cfg, 1, device="cpu")
    assert m["nonflush_us"] > 0 and m["nonflush_derived_us"] == m["nonflush_derived_us"]


def test_measure_runs_each_step_over_every_layer(monkeypatch):
    """With several layers each step of the graph runs on every layer's own cache in turn, and
    the time is per layer; staggered cursors spread the rows over the window and leave only the
    window average (CPU dry run on a tiny shape)."""
    from dataclasses import replace

    from replayssm_quant.precision import ModelShape

    mod = _module()
    seen, cursors = [], []
    real = mod.Workload.step

    slots = set()

    def step(self, i, **kw):
        seen.append((id(self.cache), i, kw.get("advance", True)))
        slots.add(self.slots.data_ptr())
        if i == 0:
            cursors.append(self.cache.cursor.tolist())
        return real(self, i, **kw)

    monkeypatch.setattr(mod.Workload, "step", step)
    tiny = ModelShape("tiny-m", "mamba2", 4, 16, 32, 1)
    cfg = replace(PRESETS["nvfp4-read/fp16-sr"], L=2)
    m = mod.measure(tiny, 3, cfg, 1, device="cpu", layers=3)
    assert m["layers"] == 3 and m["window_us"] > 0 and m["flush_us"] > 0
    assert len({c for c, _, _ in seen}) == 3
    assert len(slots) == 1  # one slots tensor for every layer, as a served step has
    window = [(c, i) for c, i, adv in seen if adv]
    for i in range(cfg.L):  # one window, every step index on all three layers, step by step
        assert len({c for c, j in window if j == i}) == 3
    assert [i for _, i in window[:6]] == [0, 0, 0, 1, 1, 1]
    assert max(i for _, i in window) == cfg.L - 1
    assert all(c == [0, 0, 0] for c in cursors)  # aligned: every row flushes on one step
    seen.clear()
    cursors.clear()
    s = mod.measure(tiny, 3, cfg, 1, device="cpu", layers=2, stagger=True)
    assert s["layers"] == 2 and s["window_us"] > 0
    assert s["nonflush_us"] != s["nonflush_us"] and s["flush_us"] != s["flush_us"]  # NaN
    assert cursors[0] == [0, 1, 0]  # row i at i mod L
    assert not [1 for _, _, adv in seen if not adv]  # no separate flush graph
    seen.clear()
    conv = mod.measure(tiny, 3, PRESETS["fp32"], 1, device="cpu", layers=2)
    assert conv["layers"] == 2 and conv["window_us"] == conv["flush_us"]
    assert sorted({i for _, i, _ in seen}) == list(range(mod.LAYERED_CONV_STEPS))
    assert mod.measure_verify(tiny, 2, cfg, 3, 1, device="cpu", layers=2) > 0


def test_targets_judge_each_timing_mode_apart():
    """Rows timed over several layers (decode.py --layers) feed the HBM batch-1 check only,
    never the one-layer checks, and a one-layer sweep never feeds the HBM check."""
    mod = _targets_module()
    layered = [{**r, "mode": "layers"} for r in _sweep_rows(batch=1, replay_us=560.0)]
    plain = _sweep_rows(batch=1, replay_us=450.0)
    v = mod.evaluate(layered + plain)
    by = {x.target: x for x in v}
    assert set(by) == {"batch1-no-regression", "batch1-no-regression-hbm"}
    assert by["batch1-no-regression"].met and not by["batch1-no-regression-hbm"].met
    assert "replay-fp32 0.89" in by["batch1-no-regression-hbm"].detail
    wide = [{**r, "mode": "layers"} for r in _sweep_rows()]
    assert mod.evaluate(wide) == []  # no target judges layered batch-256 rows
    md = mod.markdown(v)
    assert "### batch1-no-regression-hbm" in md


def test_decode_markdown_names_the_layers():
    """A layered sweep's decode.md says so and gives each row's layer count."""
    mod = _module()
    rows = [{**r, "layers": 30 if r["config"] == "fp32" else 70} for r in _sweep_rows(batch=1)]
    meta = dict(device="test", copy_bandwidth=4.2e12, torch="t", triton="t", argv=["decode.py"],
                layers="auto")
    md = mod.markdown_table(rows, meta)
    assert "`--layers auto`" in md and "| fp32 | 500.0 |" in md and md.count(" 70 |") == 3
    plain = mod.markdown_table(_sweep_rows(batch=1), dict(meta, layers=1))
    assert "layers" not in plain


def test_precompile_covers_every_small_timed_batch(monkeypatch):
    """A sweep compiles its steps at batch 1, 64 and every smaller timed batch (batch 4's
    one-launch tiles are not batch 1's), so the main process finds them in Triton's cache;
    a job without batches keeps the default ones."""
    mod = _module()
    assert mod.compile_batches([256, 1, 64, 512]) == (1, 64)
    assert mod.compile_batches([4, 256, 2]) == (1, 2, 4, 64)
    seen = []

    def fake_compile(job):
        seen.append(job)
        return job, 0.0, None

    monkeypatch.setattr(mod, "compile_job", fake_compile)
    job = ("qwen3.5-4b", PRESETS["replay-fp32"], {}, 0, "cpu")
    mod.precompile([job], 1, batches=(4,))
    mod.precompile([job], 1)
    assert seen[0] == (*job, (4,)) and seen[1] == job


def test_compile_job_runs_a_window_at_each_batch(monkeypatch):
    """``compile_job`` runs a window of steps at each batch its job names, else at
    ``COMPILE_BATCHES``; an error comes back as text for the main process to report."""
    mod = _module()
    made = []

    class FakeWorkload:
        def __init__(self, shape, batch, cfg, steps, device):
            made.append(batch)

        def step(self, i, **kw):
            if kw.get("boom"):
                raise ValueError("bad knob")

    monkeypatch.setattr(mod, "Workload", FakeWorkload)
    cfg = PRESETS["replay-fp32"]
    assert mod.compile_job(("qwen3.5-4b", cfg, {}, 0, "cpu", (2, 4)))[2] is None
    assert made == [2, 4]
    mod.compile_job(("qwen3.5-4b", cfg, {}, 0, "cpu"))
    assert made[2:] == list(mod.COMPILE_BATCHES)
    assert "bad knob" in mod.compile_job(("qwen3.5-4b", cfg, {"boom": True}, 0, "cpu"))[2]
