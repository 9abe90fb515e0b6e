"""The launch plan of a decode step (``kernels.plan``): the decode steps launch exactly what
their plan says, the plan's defaults on the H200 are the measured ones, bad knobs fail before
any launch, and ``replayssm-quant plan`` prints it."""

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.kernels import gdn as kg
from replayssm_quant.kernels import mamba2 as km
from replayssm_quant.kernels.core import ring
from replayssm_quant.kernels.gdn import launch as gdn_launch
from replayssm_quant.kernels.mamba2 import launch as mamba2_launch
from replayssm_quant.kernels.plan import TARGETS, StepKnobs, Target, resolve_target, step_plan
from replayssm_quant.precision import PRESETS

from .test_kernels_decode import SLOTS, _clone, _run, _small_L

KERNELS = ("_mamba2_conv_kernel", "_mamba2_prep_kernel", "_mamba2_nonflush_kernel",
           "_mamba2_flush_kernel", "_advance_kernel", "_gdn_conv_kernel", "_gdn_prep_kernel",
           "_gdn_nonflush_kernel", "_gdn_flush_kernel")


class _Recorder:
    """Stands in for a Triton kernel: logs (name, grid, constexpr kwargs) and launches it."""

    def __init__(self, fn, name: str, log: list):
        self.fn, self.name, self.log = fn, name, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append((self.name, tuple(grid), kwargs))
            return self.fn[grid](*args, **kwargs)
        return launch

    def __getattr__(self, attr):
        return getattr(self.fn, attr)


@pytest.fixture
def launches(monkeypatch):
    log: list = []
    for mod in (mamba2_launch, gdn_launch, ring):
        for name in KERNELS:
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, _Recorder(getattr(mod, name), name, log))
    return log


def _plan(kind, cfg, **knobs):
    """The plan of ``_run``'s layer (heads 4, groups / key heads 2, d 32, 16 rows)."""
    cap = cfg.L if cfg.L > 1 else 0
    cpu = Target.of(torch.device("cpu"))
    if kind == "mamba2":
        return km.mamba2_step_plan(cfg, cap, 4, 16, 32, 2, len(SLOTS), cpu,
                                   StepKnobs.of(kind, **{"block_p": 16, **knobs}),
                                   ring_dtype=torch.float32)
    return kg.gdn_step_plan(cfg, cap, 4, 2, 16, 32, len(SLOTS), cpu,
                            StepKnobs.of(kind, block_v=16, **knobs), ring_dtype=torch.float32)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name,knobs", [
    ("fp32", {}),
    ("fp32", {"one_launch": False}),
    ("replay-fp32", {}),
    ("replay-fp32", {"one_launch": False}),
    ("nvfp4-read/fp16-sr", {"one_launch": False, "flush_warps": 2}),
    ("shared-nvfp4", {"one_launch": False, "fuse_prep": False, "fuse_advance": False}),
    ("fp8-read/fp32", {"one_launch": False, "flush_fold": "dot"}),
])
def test_decode_step_launches_its_plan(launches, kind, name, knobs):
    """Every launch of a step (kernel, grid, rows, warps, and the flush's fold, products,
    stages, TMA and cursor advance) is the plan's, in the plan's order."""
    cfg = _small_L(PRESETS[name])
    plan = _plan(kind, cfg, **knobs)
    _run(kind, cfg, steps=1, **knobs)
    assert [n for n, _, _ in launches] == [ln["kernel"] for ln in plan.launches()]
    rows_key, frows_key = ("BP", "BPF") if kind == "mamba2" else ("BV", "BVF")
    for name_, grid, kw in launches:
        if name_.endswith(("_conv_kernel", "_nonflush_kernel")):
            assert grid == plan.grid and kw[rows_key] == plan.rows
            assert kw["num_warps"] == plan.warps and kw["TILE_FIRST"] == plan.tile_first
            assert kw["ADVANCE"] == plan.ticket
        if name_.endswith("_nonflush_kernel"):
            assert kw["FUSED_PREP"] == plan.fused_prep and kw["ONE_LAUNCH"] == plan.one_launch
            assert kw["PDL"] == plan.step_pdl and kw.get("BP2", 0) == plan.rows2
        if name_.endswith("_prep_kernel"):
            assert grid == plan.prep_grid and kw["PDL"] == plan.prep_pdl
        if name_.endswith("_flush_kernel"):
            f = plan.flush
            assert kw[frows_key] == f.rows and kw["num_warps"] == f.warps
            assert kw["RECORDS"] == (f.fold == "records") and kw["FOLD_PREC"] == f.precision
            assert kw["STAGES"] == f.stages and kw["TMA"] == f.tma
            assert kw["ADVANCE"] == f.advances_cursor and kw["PDL"] == f.pdl
    assert plan.separate_advance == (launches[-1][0] == "_advance_kernel")


def test_h200_defaults_are_the_measured_ones():
    """The plans the H200 sweeps ran (the Hopper table in kernels/tuning): batch 256 takes
    three launches with the FP32 flush on 16-row one-warp tiles through TMA (2 stages, bf16x3 products);
    Nemotron-3-Nano's 80 rows as one 64 + 16 program per head; batch 1 is one launch."""
    p = step_plan("nemotron-3-super", "replay-fp32", 256)
    assert [ln["launch"] for ln in p.launches()] == [
        "ring products + flush list", "non-flush step", "flush (persistent)"]
    assert (p.rows, p.warps, p.tile_first) == (64, 1, True)
    f = p.flush
    assert (f.fold, f.rows, f.warps, f.precision, f.stages, f.tma) == ("dot", 16, 1, "bf16x3", 2, True)
    assert f.tiles == 256 * 128 * 4 and f.pdl and p.step_pdl and p.prep_pdl
    nano = step_plan("nemotron-3-nano-4b", "replay-fp32", 256)
    assert (nano.rows, nano.rows2, nano.tiles) == (64, 16, 1)
    assert nano.tile_first and nano.grid == (1, 96, 256)  # heads before rows: it reads fp32
    nano4 = step_plan("nemotron-3-nano-4b", "nvfp4-read/fp16-sr", 256)
    assert nano4.rows2 == 16 and not nano4.tile_first and nano4.grid == (256, 96, 1)
    q = step_plan("qwen3.5-4b", "nvfp4-read/fp16-sr", 256)
    assert (q.flush.fold, q.flush.rows, q.flush.warps, q.flush.recompute_u, q.flush.ut) == (
        "records", 16, 4, True, False)
    assert q.decode == "words" and step_plan("nemotron-3-super", "nvfp4-read/fp16-sr", 256).decode == "e4m3"
    assert q.prep_groups == 2 and q.prep_grid == (256, 8, 1)
    one = step_plan("qwen3.5-122b", "nvfp4-read/fp16-sr", 1)
    assert one.one_launch and one.flush is None and one.rows == 8 and one.fused_prep
    assert [ln["kernel"] for ln in one.launches()] == ["_gdn_nonflush_kernel"]
    conv = step_plan("qwen3.5-4b", "fp32", 256)  # no SR: no counters, so no advance
    assert [ln["kernel"] for ln in conv.launches()] == ["_gdn_conv_kernel"]
    assert not step_plan("qwen3.5-4b", "fp32", 1).ticket and not conv.separate_advance
    sr = step_plan("qwen3.5-4b", "fp16-sr", 256)  # the flush index is the SR key
    assert [ln["kernel"] for ln in sr.launches()] == ["_gdn_conv_kernel", "_advance_kernel"]
    assert step_plan("qwen3.5-4b", "fp16-sr", 1).ticket  # the conventional step, one launch
    # one launch at batch 2 on every paper shape; at batch 4 on GDN only where the step's
    # state is small enough to flush serially (Qwen3.5-4B) or the flush is GDN's plain fp32
    # one; Mamba-2 up to batch 8, its programs flushing in row passes, except an SR
    # checkpoint on Nano-4B's 80-row heads
    assert all(step_plan(s, "nvfp4-read/fp16-sr", 2).one_launch for s in (
        "nemotron-3-super", "nemotron-3-nano-4b", "qwen3.5-4b", "qwen3.5-122b"))
    assert step_plan("qwen3.5-4b", "nvfp4-read/fp16-sr", 4).one_launch
    assert not step_plan("qwen3.5-122b", "fp8-read/fp32", 4).one_launch
    for s, c, b in (("nemotron-3-super", "nvfp4-read/fp16-sr", 4), ("nemotron-3-nano-4b", "shared-fp8", 8),
                    ("nemotron-3-super", "replay-fp32", 8), ("nemotron-3-nano-4b", "replay-fp32", 4)):
        pb = step_plan(s, c, b)
        assert pb.one_launch and pb.flush is None and pb.step_flush_rows
        assert [ln["kernel"] for ln in pb.launches()] == ["_mamba2_nonflush_kernel"]
    sp = step_plan("nemotron-3-super", "replay-fp32", 8)
    assert (sp.rows, sp.step_flush_rows, sp.step_flush_fold) == (64, 16, "dot")
    assert "16 rows a pass" in sp.launches()[0]["knobs"]["flush"]
    assert sp.summary() == "nonflush+flush 1024x(64x128) w1 passes 16 dot"
    np_ = step_plan("nemotron-3-nano-4b", "replay-fp32", 4)  # whole heads, 64 + 16 rows
    assert (np_.rows, np_.rows2, np_.step_flush_rows, np_.step_flush_fold) == (64, 16, 16, "dot")
    assert (step_plan("nemotron-3-super", "fp8-read/fp32", 4).step_flush_rows,
            step_plan("nemotron-3-super", "fp8-read/fp32", 4).step_flush_fold) == (8, "records")
    assert not any(step_plan(s, c, b).one_launch for s, c, b in (
        ("nemotron-3-super", "replay-fp32", 9), ("nemotron-3-super", "replay-fp32", 16)))
    # batch 1 and 2: programs of 8-16 rows flush at once, as before the passes
    assert not any(step_plan(s, "replay-fp32", b).step_flush_rows for s in (
        "nemotron-3-super", "nemotron-3-nano-4b") for b in (1, 2))
    assert not step_plan("nemotron-3-nano-4b", "nvfp4-read/fp8-sr", 8).one_launch
    # a head of 16 rows or fewer would flush at once: one launch only up to batch 4, as before
    tiny = km.mamba2_step_plan(PRESETS["replay-fp32"], 16, 2, 16, 32, 1, 8, TARGETS["h200"])
    assert not tiny.one_launch and tiny.flush is not None
    assert step_plan("nemotron-3-nano-4b", "nvfp4-read/fp16-sr", 8).flush.maxnreg == 168
    b4 = step_plan("nemotron-3-nano-4b", "nvfp4-read/fp16-sr", 4)
    assert b4.flush is not None and b4.fused_prep and [ln["launch"] for ln in b4.launches()] == [
        "non-flush step", "flush (persistent)"]
    assert step_plan("qwen3.5-122b", "replay-fp32", 4).one_launch
    # early loads: a Mamba-2 step reading fp32 at batch 1 only
    assert step_plan("nemotron-3-super", "replay-fp32", 1).early_loads
    assert step_plan("nemotron-3-super", "replay-fp32", 1).launches()[0]["knobs"]["early_loads"]
    assert not any(step_plan(s, c, b).early_loads for s, c, b in (
        ("nemotron-3-super", "replay-fp32", 4), ("nemotron-3-super", "nvfp4-read/fp32", 1),
        ("nemotron-3-super", "shared-fp8", 1), ("nemotron-3-super", "fp32", 1),
        ("qwen3.5-4b", "replay-fp32", 1)))
    assert not step_plan("nemotron-3-super", "replay-fp32", 1, early_loads=False).early_loads
    # fp8 sources: GDN decodes int32 words at batch 1 and from 256, Mamba-2 never by default
    for c in ("fp8-read/fp32", "shared-fp8"):
        assert [step_plan("qwen3.5-4b", c, b).decode for b in (1, 4, 64, 256, 512)] == [
            "words8", "", "", "words8", "words8"]
        assert not any(step_plan("nemotron-3-super", c, b).decode for b in (1, 256))
    assert step_plan("qwen3.5-4b", "fp8-read/fp32", 1).launches()[0]["knobs"]["fp8_decode"] == "words"
    assert step_plan("qwen3.5-4b", "fp8-read/fp32", 1, fp8_decode="cvt").decode == ""
    assert step_plan("nemotron-3-super", "shared-fp8", 256, fp8_decode="words").decode == "words8"
    assert step_plan("qwen3.5-4b", "nvfp4-read/fp32", 1, fp8_decode="words").decode == "words"
    assert step_plan("qwen3.5-4b", "replay-fp32", 1, fp8_decode="words").decode == ""
    # register caps by default: GDN's fp8 word decode and Nano-4B's NVFP4 whole head, 80, in
    # steps of separate launches; an explicit None or number wins
    for c in ("fp8-read/fp32", "shared-fp8"):
        assert [step_plan("qwen3.5-122b", c, b).maxnreg for b in (1, 4, 64, 256, 512)] == [
            None, None, None, 80, 80]
        assert step_plan("qwen3.5-4b", c, 256, fp8_decode="cvt").maxnreg is None
        assert step_plan("qwen3.5-4b", c, 256, block_v=16).maxnreg is None
        assert not any(step_plan("nemotron-3-super", c, b).maxnreg for b in (1, 256))
    for c in ("nvfp4-read/fp16-sr", "shared-nvfp4"):
        assert [step_plan("nemotron-3-nano-4b", c, b).maxnreg for b in (1, 4, 64, 256, 512)] == [
            None, None, None, 80, 80]
        assert step_plan("nemotron-3-nano-4b", c, 256, nvfp4_decode="words").maxnreg is None
        assert step_plan("nemotron-3-nano-4b", c, 256, whole_head=False).maxnreg is None
        assert step_plan("nemotron-3-super", c, 256).maxnreg is None
        assert step_plan("qwen3.5-4b", c, 256).maxnreg is None
    assert step_plan("nemotron-3-nano-4b", "replay-fp32", 256).maxnreg is None
    assert step_plan("qwen3.5-4b", "fp8-read/fp32", 256, maxnreg=None).maxnreg is None
    assert step_plan("nemotron-3-nano-4b", "shared-nvfp4", 256, maxnreg=96).maxnreg == 96
    assert step_plan("qwen3.5-4b", "shared-fp8", 256).launches()[1]["maxnreg"] == 80
    # GDN's record replays of a read copy on their default tiles: 16 rows on 4 warps capped
    # at 64 for an SR checkpoint's copies from batch 64 (32 rows on 8 warps, no cap, below),
    # 16 rows on 2 warps at 128 for an NVFP4 copy of an fp32 checkpoint, one warp at 168
    # for an fp8 copy from batch 64; an explicit knob wins
    for shape in ("qwen3.5-4b", "qwen3.5-122b"):
        for c, tiles, caps in (
                ("fp8-read/fp32", [(16, 1)] * 4, [None, None, 168, 168]),
                ("fp8-read/fp32@L8", [(16, 1)] * 4, [None, None, 168, 168]),
                ("nvfp4-read/fp32", [(16, 2)] * 4, [128] * 4),
                ("nvfp4-read/fp16-sr", [(32, 8), (32, 8), (16, 4), (16, 4)], [None, None, 64, 64]),
                ("nvfp4-read/fp8-sr", [(32, 8), (32, 8), (16, 4), (16, 4)], [None, None, 64, 64])):
            cfg = PRESETS[c.split("@")[0]]
            if "@" in c:
                cfg = dataclasses.replace(cfg, L=8)
            plans = [step_plan(shape, cfg, b).flush for b in (16, 63, 64, 512)]
            assert [(f.rows, f.warps) for f in plans] == tiles, c
            assert [f.maxnreg for f in plans] == caps, c
            assert step_plan(shape, cfg, 256, flush_maxnreg=None).flush.maxnreg is None
            assert step_plan(shape, cfg, 256, flush_maxnreg=96).flush.maxnreg == 96
            assert step_plan(shape, cfg, 256, flush_warps=8).flush.maxnreg is None
            assert step_plan(shape, cfg, 256, flush_block_v=8).flush.maxnreg is None
        for c in ("replay-fp32", "shared-nvfp4", "shared-fp8"):
            assert step_plan(shape, c, 256).flush.maxnreg is None
    flush = [x for x in step_plan("qwen3.5-4b", "fp8-read/fp32", 256).launches()
             if x["launch"] == "flush (persistent)"]
    assert flush[0]["maxnreg"] == 168
    for c in ("fp8-read/fp32", "nvfp4-read/fp8-sr", "nvfp4-read/fp32", "shared-nvfp4",
              "replay-fp32"):
        assert step_plan("nemotron-3-super", c, 256).flush.maxnreg is None
    # Mamba-2's NVFP4 copy of an fp16-SR checkpoint: 16 rows on 2 warps capped at 168 at
    # every batch of a persistent flush; other tiles or an explicit cap take no default
    for shape in ("nemotron-3-super", "nemotron-3-nano-4b"):
        for cfg in (PRESETS["nvfp4-read/fp16-sr"],
                    dataclasses.replace(PRESETS["nvfp4-read/fp16-sr"], L=8)):
            plans = [step_plan(shape, cfg, b).flush for b in (16, 64, 256, 512)]
            assert [(f.fold, f.rows, f.warps, f.maxnreg) for f in plans] == [
                ("records", 16, 2, 168)] * 4
            assert step_plan(shape, cfg, 256, flush_maxnreg=None).flush.maxnreg is None
            assert step_plan(shape, cfg, 256, flush_maxnreg=96).flush.maxnreg == 96
            assert step_plan(shape, cfg, 256, flush_block_p=4).flush.maxnreg is None
            assert step_plan(shape, cfg, 256, flush_warps=1).flush.maxnreg is None
            assert step_plan(shape, cfg, 256, flush_fold="dot").flush.maxnreg is None
    assert step_plan("nemotron-3-nano-4b", "nvfp4-read/fp16-sr", 1).flush is None  # one launch
    assert step_plan("nemotron-3-super", "nvfp4-read/fp16-sr", 256, flush_maxnreg=None).flush \
        .rows == 16
    assert step_plan("qwen3.5-4b", "fp8-read/fp32", 1).flush is None  # one launch
    # programmatic launch at every multi-launch batch on sm_90, never on an A100
    assert step_plan("nemotron-3-super", "replay-fp32", 64).step_pdl
    a100 = step_plan("nemotron-3-super", "replay-fp32", 64, "a100")
    assert not a100.step_pdl and not a100.flush.tma and a100.flush.stages == 3


def test_bad_knobs_fail_before_any_launch(launches):
    """A knob the step refuses raises from the plan, so nothing is launched."""
    cfg = _small_L(PRESETS["replay-fp32"])
    for kind, knobs in (("mamba2", {"flush_fold": "both", "one_launch": False}),
                        ("gdn", {"flush_precision": "fp64", "one_launch": False}),
                        ("mamba2", {"one_launch": True, "flush_warps": 2}),
                        ("gdn", {"prep_groups": 3, "one_launch": False}),
                        ("mamba2", {"maxnreg": 8})):
        with pytest.raises(ValueError):
            _run(kind, cfg, steps=1, **knobs)
    assert launches == []
    with pytest.raises(TypeError, match="flush_wraps"):  # a misspelt knob, Triton path
        _run("gdn", cfg, steps=1, flush_wraps=2)


def test_misspelt_knob_fails_on_the_reference_path(monkeypatch):
    """Where a step runs the pure-torch reference (no GPU, no interpreter), a knob name the
    plan does not take still fails instead of passing silently."""
    monkeypatch.setattr(mamba2_launch, "runs_reference", lambda t: True)
    monkeypatch.setattr(gdn_launch, "runs_reference", lambda t: True)
    cfg = _small_L(PRESETS["replay-fp32"])
    for kind in ("mamba2", "gdn"):
        with pytest.raises(TypeError, match="unknown launch knob"):
            _run(kind, cfg, steps=1, flush_wraps=2)
    StepKnobs.of("gdn", flush_warps=2, block_v=16)  # real knobs pass
    with pytest.raises(ValueError, match="sm_90"):
        step_plan("qwen3.5-4b", "replay-fp32", 8, "a100", pdl=True)
    with pytest.raises(ValueError, match="batch"):
        step_plan("qwen3.5-4b", "replay-fp32", 0)


def test_plan_summary_names_every_launch():
    """``StepPlan.summary`` (a column of benchmarks/decode.py's rows): one field per launch
    with its programs, tile, warps and the flush's fold, products, stages, TMA and PDL."""
    assert step_plan("nemotron-3-super", "replay-fp32", 256).summary() == (
        "prep 2048 | nonflush 32768x(64x128) w1 pdl | flush (16x128) w1 dot bf16x3 s2 tma pdl")
    assert step_plan("nemotron-3-super", "replay-fp32", 256, pdl=False).summary() == (
        "prep 2048 | nonflush 32768x(64x128) w1 | flush (16x128) w1 dot bf16x3 s2 tma")
    assert step_plan("qwen3.5-4b", "replay-fp32", 64).summary() == (
        "prep 1024 | nonflush 8192x(32x128) w1 pdl | flush (16x128) w1 dot bf16x3 s2 tma pdl")
    assert step_plan("nemotron-3-nano-4b", "nvfp4-read/fp16-sr", 256).summary().startswith(
        "prep 2048 | nonflush 24576x(64+16x128) w1 pdl | flush (16x128) w2 records ieee s-")
    assert step_plan("qwen3.5-4b", "fp32", 256).summary() == "conv 65536x(16x128) w1"
    assert step_plan("qwen3.5-4b", "fp16-sr", 256).summary() == "conv 131072x(8x128) w2 | advance 1"
    assert step_plan("qwen3.5-4b", "nvfp4-read/fp16-sr", 1).summary() == "nonflush+flush 512x(8x128) w1"


def test_targets_parse():
    assert resolve_target("H200") is TARGETS["h200"]
    t = resolve_target("sm_100:148")
    assert t.capability == (10, 0) and t.sms == 148 and t.programmatic_launch and t.tma
    assert not resolve_target("sm_80").programmatic_launch
    assert not TARGETS["interpreter"].cuda and TARGETS["interpreter"].tma
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_target("cuda")
    for bad in ("v100", "sm_x", "sm_90:many"):
        with pytest.raises(ValueError, match="unknown target"):
            resolve_target(bad)


def test_plan_command():
    runner = CliRunner()
    r = runner.invoke(app, ["plan", "qwen3.5-4b", "-c", "replay-fp32", "-b", "256", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert len(rows) == 1 and rows[0]["batch"] == 256 and rows[0]["flush"]["tma"] is True
    assert [ln["kernel"] for ln in rows[0]["launches"]][-1] == "_gdn_flush_kernel"
    assert rows[0]["flush_bytes"] > rows[0]["nonflush_bytes"] > 0
    r = runner.invoke(app, ["plan", "nemotron-3-nano", "-b", "256", "-k", "flush_warps=2",
                            "-k", "flush_fold=records"])
    assert r.exit_code == 0 and "fold=records" in r.output and "64+16 x 128" in r.output
    for args, msg in ((["plan", "nope"], "unknown shape"),
                      (["plan", "qwen3.5-4b", "-k", "whole_head=True"], "unknown knob 'whole_head'"),
                      (["plan", "qwen3.5-4b", "-k", "warps"], "NAME=VALUE"),
                      (["plan", "qwen3.5-4b", "--target", "tpu"], "unknown target"),
                      (["plan", "qwen3.5-4b", "-c", "ckpt=fp99"], "")):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["fp32", "bf16-sr"])
def test_conventional_cache_without_a_ring(kind, name):
    """A conventional cache may hold no ring at all (the vLLM plugin's pages): the step plans
    and runs without one and matches the reference."""
    from replayssm_quant.kernels.core.cache import cache_from_reference
    from replayssm_quant.ssm import gdn, mamba2
    from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

    cfg = PRESETS[name]
    g = torch.Generator().manual_seed(5)
    if kind == "mamba2":
        ref = mamba2.init_mamba2_state(cfg, 5, 4, 16, 32, 2, seed=11, layer=3)
        a = {k: (v[:, 0].contiguous() if v is not None and v.dim() > 1 else v)
             for k, v in mamba2_inputs(len(SLOTS), 1, 4, 16, 32, 2, generator=g).items()}
        cache = cache_from_reference(_clone(ref))
        cache.ring.clear()
        y = km.mamba2_decode_step(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
        y_ref = mamba2.decode_step(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
    else:
        ref = gdn.init_gdn_state(cfg, 5, 4, 16, 32, 2, seed=11, layer=3)
        a = {k: v[:, 0].contiguous() for k, v in gdn_inputs(len(SLOTS), 1, 4, 16, 32, 2, generator=g).items()}
        cache = cache_from_reference(_clone(ref))
        cache.ring.clear()
        y = kg.gdn_decode_step(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        y_ref = gdn.decode_step(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
    valid = SLOTS >= 0
    assert torch.allclose(y[valid], y_ref[valid], rtol=1e-5, atol=1e-6)


def test_log_plans_once_per_distinct_step(monkeypatch, caplog):
    """With ``log_plans`` every distinct step (shape, config, batch, plan) is logged once,
    the line naming the layer and the plan's summary; repeated steps add nothing, and
    nothing is logged while it is off (the default)."""
    from replayssm_quant.kernels import plan as kp

    monkeypatch.setattr(kp, "_log", {"on": False})
    monkeypatch.setattr(kp, "_logged", set())
    cfg = _small_L(PRESETS["replay-fp32"])
    with caplog.at_level("INFO", logger="replayssm_quant.kernels.plan"):
        _run("mamba2", cfg, steps=1, one_launch=False)
        assert not caplog.records
        kp.log_plans()
        _run("mamba2", cfg, steps=2, one_launch=False)  # the same step twice: one line
        _run("gdn", cfg, steps=1, one_launch=False)
        _run("mamba2", cfg, steps=1)  # one launch: another plan
        kp.log_plans(False)
        _run("gdn", cfg, steps=1)
    lines = [r.getMessage() for r in caplog.records]
    want = [_plan("mamba2", cfg, one_launch=False), _plan("gdn", cfg, one_launch=False),
            _plan("mamba2", cfg)]
    assert len(lines) == 3, lines
    for line, p in zip(lines, want, strict=True):
        assert line.startswith(f"{p.kind} step, 4 heads x 16 x 32 (2 ") and line.endswith(p.summary())
        assert f"batch {len(SLOTS)} on " in line and str(cfg) in line


def test_step_knobs_checked_once_where_a_step_is_called():
    """``StepKnobs.of`` gathers a step's keyword knobs: the defaults, each kind's own names,
    and refusals of an unknown name or a value that needs no layer to check."""
    from replayssm_quant.kernels.knobs import DEFAULT, GdnKnobs, Mamba2Knobs

    m, g = StepKnobs.of("mamba2"), StepKnobs.of("gdn", block_v=16)
    assert isinstance(m, Mamba2Knobs) and isinstance(g, GdnKnobs) and g.block_v == 16
    assert m.maxnreg is DEFAULT and m.early_loads is None and g.early_loads is False
    assert m.persistent_flush_knobs() == (None,) * 8
    assert StepKnobs.of("gdn", flush_block_v=8).persistent_flush_knobs()[0] == 8
    with pytest.raises(TypeError, match="unexpected keyword argument 'whole_head'"):
        StepKnobs.of("gdn", whole_head=True)
    with pytest.raises(TypeError, match="unknown launch knob"):
        StepKnobs.of("mamba2", block_v=16)
    for kind, knobs, msg in (("mamba2", {"maxnreg": 8}, "maxnreg must be"),
                             ("gdn", {"flush_maxnreg": True}, "maxnreg must be"),
                             ("mamba2", {"nvfp4_decode": "lut"}, "nvfp4_decode must be"),
                             ("gdn", {"nvfp4_decode": "words", "lut": True}, "lut=True"),
                             ("gdn", {"pdl": "both"}, "pdl must be")):
        with pytest.raises(ValueError, match=msg):
            StepKnobs.of(kind, **knobs)


def test_planner_reads_the_table_of_the_targets_family(monkeypatch):
    """``tuning.table_for``: a CUDA target's family table (Hopper for sm_90), the default table
    for every other target; the planner passes the target's table to its rules, so a changed
    entry in one family's table changes only that family's plans."""
    from dataclasses import replace as dc_replace

    from replayssm_quant.kernels.tuning import DEFAULT_TABLE, FAMILY_TABLES, HOPPER, table_for

    assert table_for(TARGETS["h200"]) is HOPPER and table_for(TARGETS["h100"]) is HOPPER
    for name in ("interpreter", "a100"):
        assert table_for(TARGETS[name]) is DEFAULT_TABLE
    assert table_for(resolve_target("sm_100")) is DEFAULT_TABLE and table_for(None) is DEFAULT_TABLE
    args = ("qwen3.5-4b", "nvfp4-read/fp16-sr", 4)
    assert step_plan(*args, "h200").one_launch and step_plan(*args, "a100").one_launch
    edited = {**HOPPER, "one_launch.max_batch": dc_replace(HOPPER["one_launch.max_batch"], value=2)}
    monkeypatch.setitem(FAMILY_TABLES, 9, edited)
    assert not step_plan(*args, "h200").one_launch and step_plan(*args, "a100").one_launch
