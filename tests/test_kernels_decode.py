"""Decode kernels (Triton, interpreted on the CPU) against the pure-torch reference.

Each step starts kernel and reference from identical states, so narrow formats can be compared
per step: RN and SR checkpoints must agree except where float32 reduction order moves a value
across a rounding boundary (rare, and then by one grid step).
"""

import copy
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl

from replayssm_quant import formats as F
from replayssm_quant.kernels.core.cache import cache_from_reference
from replayssm_quant.kernels.core.ring import advance_rows, flush_list
from replayssm_quant.kernels.gdn import gdn_decode_step
from replayssm_quant.kernels.mamba2 import mamba2_decode_step
from replayssm_quant.precision import PRESETS, parse_config
from replayssm_quant.ssm import gdn, mamba2
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

SLOTS = torch.tensor([3, -1, 0, 2], dtype=torch.int32)  # one padding row
NSLOTS = 5


def _small_L(cfg):
    return cfg if cfg.L == 1 else replace(cfg, L=4)


def _clone(state):
    out = copy.copy(state)
    for k, v in vars(state).items():
        if isinstance(v, torch.Tensor):
            setattr(out, k, v.clone())
        elif isinstance(v, F.QTensor):
            setattr(out, k, F.QTensor(v.fmt, v.data.clone(),
                                      None if v.row_scale is None else v.row_scale.clone(),
                                      None if v.block_scale is None else v.block_scale.clone(),
                                      v.nan_count))
    return out


def _close_state(a: F.QTensor, b: F.QTensor, cfg_fmt) -> None:
    da, db = F.dequantize(a), F.dequantize(b)
    if cfg_fmt.name == "fp32":
        assert torch.allclose(da, db, rtol=1e-5, atol=1e-6, equal_nan=True)
        return
    rowmax = db.abs().amax(-1, keepdim=True).nan_to_num(0).clamp_min(1e-30)
    # float32-rounding-level differences (e.g. a row scale one ulp apart) count as equal
    same = ((da - db).abs() <= 1e-5 * rowmax) | (torch.isnan(da) & torch.isnan(db))
    frac = 1 - same.float().mean().item()
    assert frac < 0.02, f"{frac:.3%} of stored {cfg_fmt.name} elements differ"
    # where they differ, by at most one grid step of the format (relative to the row)
    step = 2.0 ** -cfg_fmt.mantissa * (2 if cfg_fmt.name != "nvfp4" else 4)
    ok = (da - db).abs() <= step * torch.maximum(db.abs(), rowmax / 8) + 1e-6
    assert (ok | same).all()


def _stagger(kind, ref, inp) -> None:
    """Two reference-only steps on a subset of the rows, so the rows' cursors differ (slot 3
    two records ahead of slot 0, which is one ahead of slot 2) and they flush on different
    steps: the flush list, not a shared cursor, must route them."""
    for t, live in enumerate(([0], [0, 2])):
        sl = torch.full_like(SLOTS, -1)
        sl[live] = SLOTS[live]
        if kind == "mamba2":
            a = {k: (v[:, t] if v is not None and v.dim() > 1 else v) for k, v in inp.items()}
            mamba2.decode_step(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], sl)
        else:
            a = {k: v[:, t].contiguous() for k, v in inp.items()}
            gdn.decode_step(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], sl)


def _poison_stale_records(cache) -> None:
    """NaN in every ring record at or past its row's cursor: records a step must not read."""
    for s in SLOTS[SLOTS >= 0].tolist():
        c = int(cache.cursor[s])
        for t in cache.ring.values():
            t[s, :, c:] = float("nan")


def _run(kind, cfg, steps=5, seed=0, nan_at=None, stagger=False, head_dim=16,
         act=torch.float32, poison_ring=False, nan_state=False, **kw):
    g = torch.Generator().manual_seed(seed)
    if kind == "mamba2":
        H, P, N, G = 4, head_dim, 32, 2
        ref = mamba2.init_mamba2_state(cfg, NSLOTS, H, P, N, G, seed=11, layer=3, act_dtype=act)
        inp = mamba2_inputs(len(SLOTS), steps, H, P, N, G, generator=g)
        S0 = torch.randn(NSLOTS, H, P, N, generator=g) * 0.3
    else:
        HV, V, K, HK = 4, head_dim, 32, 2
        ref = gdn.init_gdn_state(cfg, NSLOTS, HV, V, K, HK, seed=11, layer=3, act_dtype=act)
        inp = gdn_inputs(len(SLOTS), steps, HV, V, K, HK, generator=g)
        S0 = torch.randn(NSLOTS, HV, V, K, generator=g) * 0.3
    if nan_state:  # one element of slot 3 (row 0): byte 1 of its fp8 row's third word
        S0[3, 1, 5, 9] = float("nan")
    mamba2.load_state(ref, torch.arange(NSLOTS), S0) if kind == "mamba2" else \
        gdn.load_state(ref, torch.arange(NSLOTS), S0)
    if stagger:
        _stagger(kind, ref, mamba2_inputs(len(SLOTS), 2, H, P, N, G, generator=g)
                 if kind == "mamba2" else gdn_inputs(len(SLOTS), 2, HV, V, K, HK, generator=g))
        assert len(set(ref.cursor[SLOTS[SLOTS >= 0].long()].tolist())) == 3
    for key in ("x", "Bm", "C", "q", "k", "v"):  # bf16 activations: values the ring holds
        if key in inp:
            inp[key] = inp[key].to(act).float()
    if nan_at is not None:
        key = "x" if kind == "mamba2" else "v"
        inp[key][0, nan_at] = float("nan")
    for t in range(steps):
        ker = _clone(ref)
        cache = cache_from_reference(ker)
        if poison_ring:
            _poison_stale_records(cache)
        poison = torch.full((len(SLOTS), 4, P if kind == "mamba2" else V), float("nan"))
        if kind == "mamba2":
            a = {k: (v[:, t] if v is not None and v.dim() > 1 else v) for k, v in inp.items()}
            y_ref = mamba2.decode_step(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
            y = mamba2_decode_step(cache, a["x"].contiguous(), a["dt"].contiguous(), a["A"],
                                   a["Bm"].contiguous(), a["C"].contiguous(), a["D"], SLOTS,
                                   out=poison, **{"block_p": 16, **kw})
        else:
            a = {k: v[:, t].contiguous() for k, v in inp.items()}
            y_ref = gdn.decode_step(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
            y = gdn_decode_step(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS,
                                out=poison, **{"block_v": 16, **kw})
        valid = SLOTS >= 0
        assert torch.isnan(y[~valid]).all(), "padding rows must not be written"
        yv, rv = y[valid], y_ref[valid]
        if nan_at is None and not nan_state:
            assert torch.isfinite(yv).all(), "every valid output element must be written"
            rel = ((yv - rv).norm() / rv.norm()).item()
            assert rel < 1e-5, f"step {t}: output rel err {rel:.2e}"
        else:
            assert torch.equal(torch.isnan(yv), torch.isnan(rv))
        assert torch.equal(ker.cursor, ref.cursor)
        assert torch.equal(ker.flush_index.long(), ref.flush_index.long())
        _close_state(ker.ckpt, ref.ckpt, cfg.ckpt)
        if cfg.read is not None:
            _close_state(ker.read, ref.read, cfg.read)
    return ref, ker


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("one_launch", [True, False])
def test_decode_step_matches_reference(kind, name, one_launch):
    """Every preset, as one launch per step (``one_launch``: conventional and flushing
    programs advance the cursors through the ticket) and as the large-batch launches."""
    _run(kind, _small_L(PRESETS[name]), one_launch=one_launch)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr"])
@pytest.mark.parametrize("one_launch", [True, False])
def test_rows_flushing_on_different_steps(kind, name, one_launch):
    _run(kind, _small_L(PRESETS[name]), stagger=True, one_launch=one_launch)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr", "fp8-read/fp32"])
@pytest.mark.parametrize("one_launch", [True, False])
def test_stale_ring_records_are_never_read(kind, name, one_launch):
    """Ring records at or past the cursor hold NaN before every step: the output and state
    still match the reference. A one-launch step loads the ring before its cursor arrives
    and must drop those records, not multiply them by zero weights."""
    _run(kind, _small_L(PRESETS[name]), stagger=True, poison_ring=True, one_launch=one_launch)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "shared-nvfp4"])
def test_ring_products_of_two_groups_per_program(kind, name):
    """The ring-products launch with two groups (Mamba-2) / key heads (GDN) per program, on
    rows flushing on different steps with NaN in every stale ring record."""
    _run(kind, _small_L(PRESETS[name]), stagger=True, poison_ring=True, one_launch=False,
         fuse_prep=False, prep_groups=2)


def test_prep_groups_choice():
    """One wave of ring-products programs: one group per program up to 2048 programs, then
    doubling while the groups divide (GDN steps reading an fp32 state from batch 256: every
    key head of a row); a count that does not divide them is refused."""
    from replayssm_quant.kernels.tuning.rules import prep_groups_default

    assert prep_groups_default(256, 8) == 1 and prep_groups_default(512, 8) == 2
    assert prep_groups_default(256, 16) == 2 and prep_groups_default(1024, 16) == 8
    assert prep_groups_default(4096, 3) == 1
    from replayssm_quant.kernels.plan import step_plan
    from replayssm_quant.kernels.tuning.gdn_rules import gdn_prep_groups_default

    # GDN steps reading an fp32 state take a whole row's key heads from batch 256 on
    fp32, narrow = PRESETS["replay-fp32"], PRESETS["nvfp4-read/fp16-sr"]
    assert gdn_prep_groups_default(fp32, 256, 16) == 16 and gdn_prep_groups_default(fp32, 512, 12) == 4
    assert gdn_prep_groups_default(fp32, 64, 16) == prep_groups_default(64, 16)
    assert gdn_prep_groups_default(narrow, 256, 16) == prep_groups_default(256, 16) == 2
    assert step_plan("qwen3.5-4b", fp32, 256).prep_grid == (256, 1, 1)
    assert step_plan("qwen3.5-4b", narrow, 256).prep_grid == (256, 8, 1)
    assert step_plan("nemotron-3-super-120b", fp32, 256).prep_grid == (256, 8)
    cfg = _small_L(PRESETS["replay-fp32"])
    for kind in ("mamba2", "gdn"):
        for bad in (3, 4, 0):  # groups / key heads are 2 in these layers
            with pytest.raises(ValueError, match="prep_groups must be a power of two"):
                _run(kind, cfg, steps=1, one_launch=False, prep_groups=bad)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_one_launch_ticket_is_rearmed(kind):
    """One cache stepped through two flushes as one launch per step: every row's counter is 0
    after every step (each row's last program re-arms it), the cursors and flush indices
    follow."""
    cfg = _small_L(PRESETS["nvfp4-read/fp16-sr"])
    g = torch.Generator().manual_seed(3)
    if kind == "mamba2":
        ref = mamba2.init_mamba2_state(cfg, NSLOTS, 4, 16, 32, 2, seed=11)
        inp = mamba2_inputs(len(SLOTS), 2 * cfg.L, 4, 16, 32, 2, generator=g)
    else:
        ref = gdn.init_gdn_state(cfg, NSLOTS, 4, 16, 32, 2, seed=11)
        inp = gdn_inputs(len(SLOTS), 2 * cfg.L, 4, 16, 32, 2, generator=g)
    cache = cache_from_reference(ref)
    assert cache.ticket.shape == (NSLOTS,)
    live = SLOTS[SLOTS >= 0].long()
    for t in range(2 * cfg.L):
        if kind == "mamba2":
            a = {k: (v[:, t].contiguous() if v is not None and v.dim() > 1 else v)
                 for k, v in inp.items()}
            mamba2_decode_step(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS,
                               block_p=8, one_launch=True)
        else:
            a = {k: v[:, t].contiguous() for k, v in inp.items()}
            gdn_decode_step(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS, block_v=8,
                            one_launch=True)
        assert not cache.ticket.any()
        assert cache.cursor[live].tolist() == [(t + 1) % cfg.L] * 3
        assert cache.flush_index[live].tolist() == [(t + 1) // cfg.L] * 3


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name,fold,rows", [
    ("replay-fp32", "dot", 16), ("replay-fp32", "records", 8), ("nvfp4-read/fp16-sr", "records", 8),
    ("nvfp4-read/fp8-sr", "records", 4), ("shared-fp8", "records", 8), ("fp8-read/fp32", "dot", 16)])
def test_one_launch_flush_in_row_passes_matches_reference(kind, name, fold, rows):
    """A one-launch program that flushes its rows in passes (``step_flush_rows``, a loop of
    passes each folded record by record or as one bf16x3 product), on 32-row programs (Mamba-2
    also on whole heads of 16 + 8 rows, and with the ring products from their own launch,
    ``fuse_prep=False``): the same outputs, counters and states as the reference, rows
    flushing on different steps, stale ring records NaN. A GDN read copy's flush recomputes
    the u records one by one, so the bf16x3 fold is refused there."""
    cfg = _small_L(PRESETS[name])
    act = torch.bfloat16 if fold == "dot" else torch.float32
    kw = dict(one_launch=True, step_flush_rows=rows, step_flush_fold=fold, act=act)
    if kind == "gdn":
        if fold == "dot" and cfg.recompute_u:
            with pytest.raises(ValueError, match="recomputes them"):
                _run("gdn", cfg, steps=1, head_dim=32, block_v=32, **kw)
            return
        _run("gdn", cfg, stagger=True, head_dim=32, block_v=32, poison_ring=True, **kw)
        return
    _run("mamba2", cfg, stagger=True, head_dim=32, block_p=32, fuse_prep=False,
         poison_ring=True, **kw)
    if rows <= 8:
        _run("mamba2", cfg, stagger=True, head_dim=24, block_p=None, whole_head=True, **kw)


def test_step_flush_knobs_are_checked():
    """Row passes need one launch, a power of two dividing the program's row passes, and for
    the bf16x3 fold 16+ rows over a bf16 ring; the defaults pass only programs of more than
    16 rows, 16 rows as one product for a plain fp32 checkpoint, else 8 record by record."""
    from replayssm_quant.kernels.knobs import check_step_flush
    from replayssm_quant.kernels.tuning.mamba2_rules import step_flush_default

    assert check_step_flush(None, None, False, 64, 0, torch.bfloat16) == (0, "records")
    with pytest.raises(ValueError, match="one_launch=True"):
        check_step_flush(8, None, False, 64, 0, torch.bfloat16)
    with pytest.raises(ValueError, match="power of two"):
        check_step_flush(12, None, True, 64, 0, torch.bfloat16)
    with pytest.raises(ValueError, match="power of two"):
        check_step_flush(32, None, True, 64, 16, torch.bfloat16)
    with pytest.raises(ValueError, match=">= 16"):
        check_step_flush(8, "dot", True, 64, 0, torch.bfloat16)
    with pytest.raises(ValueError, match="bf16 ring"):
        check_step_flush(16, "dot", True, 64, 0, torch.float32)
    with pytest.raises(ValueError, match="step_flush_fold"):
        check_step_flush(16, "both", True, 64, 0, torch.bfloat16)
    assert check_step_flush(None, "dot", True, 64, 16, torch.bfloat16) == (16, "dot")
    fp32, nv = PRESETS["replay-fp32"], PRESETS["nvfp4-read/fp16-sr"]
    assert step_flush_default(fp32, 64, 0, torch.bfloat16) == (16, "dot")
    assert step_flush_default(fp32, 64, 0, torch.float32) == (8, "records")
    assert step_flush_default(nv, 64, 16, torch.bfloat16) == (8, "records")
    assert step_flush_default(fp32, 16, 0, torch.bfloat16) == (None, None)
    assert step_flush_default(nv, 16, 0, torch.bfloat16) == (None, None)


def test_one_launch_choice():
    """One launch by default at small batch unless a persistent-flush knob is set; asking for
    it with a knob of the flush it replaces is refused."""
    from replayssm_quant.kernels.tuning import DEFAULT_TABLE
    from replayssm_quant.kernels.tuning.rules import resolve_one_launch

    ONE_LAUNCH_MAX_BATCH = DEFAULT_TABLE["one_launch.max_batch"].value
    ONE_LAUNCH_MAX_BATCH_CONV = DEFAULT_TABLE["one_launch.max_batch_conv"].value
    ONE_LAUNCH_MAX_STATE = DEFAULT_TABLE["one_launch.max_state"].value

    assert resolve_one_launch(None, 1) and resolve_one_launch(None, ONE_LAUNCH_MAX_BATCH)
    assert not resolve_one_launch(None, ONE_LAUNCH_MAX_BATCH + 1)
    # a step whose state is too large to flush serially on its own tiles takes three
    # launches, unless its flush is light
    assert resolve_one_launch(None, 2, step_state=ONE_LAUNCH_MAX_STATE)
    assert not resolve_one_launch(None, 2, step_state=ONE_LAUNCH_MAX_STATE + 1)
    assert resolve_one_launch(None, 2, step_state=ONE_LAUNCH_MAX_STATE + 1, light_flush=True)
    assert not resolve_one_launch(None, ONE_LAUNCH_MAX_BATCH + 1, light_flush=True)
    assert resolve_one_launch(True, 4, step_state=ONE_LAUNCH_MAX_STATE + 1)
    assert resolve_one_launch(None, ONE_LAUNCH_MAX_BATCH_CONV, conventional=True)
    assert not resolve_one_launch(None, ONE_LAUNCH_MAX_BATCH_CONV + 1, conventional=True)
    assert not resolve_one_launch(None, 1, (None, "records"))
    assert resolve_one_launch(True, 512) and not resolve_one_launch(False, 1)
    with pytest.raises(ValueError, match="flush knobs"):
        resolve_one_launch(True, 1, (16,))
    # programs that flush in row passes: one launch up to a larger batch, whatever the state
    from replayssm_quant.kernels.tuning.mamba2_rules import flush_passes_default

    ONE_LAUNCH_PASSES_MAX_BATCH = DEFAULT_TABLE["one_launch.passes_max_batch"].value

    big = ONE_LAUNCH_MAX_STATE * 8
    assert resolve_one_launch(None, ONE_LAUNCH_PASSES_MAX_BATCH, step_state=big, passes=True)
    assert not resolve_one_launch(None, ONE_LAUNCH_PASSES_MAX_BATCH + 1, passes=True)
    assert not resolve_one_launch(None, 4, step_state=big, passes=False)
    assert not resolve_one_launch(None, 4, (None, "records"), step_state=big, passes=True)
    assert flush_passes_default(PRESETS["replay-fp32"], 80)
    assert flush_passes_default(PRESETS["nvfp4-read/fp16-sr"], 64)
    assert not flush_passes_default(PRESETS["nvfp4-read/fp16-sr"], 80)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_one_launch_with_a_separate_advance(kind):
    """``one_launch`` with ``fuse_advance=False``: the step's work in one launch, the cursors
    moved by their own launch: the same outputs, counters and states as the reference, rows
    flushing on different steps."""
    cfg = _small_L(PRESETS["nvfp4-read/fp16-sr"])
    _run(kind, cfg, stagger=True, one_launch=True, fuse_advance=False)
    _run(kind, PRESETS["fp16-sr"], steps=2, one_launch=True, fuse_advance=False)



@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("fuse_prep", [False, True])
def test_ring_products_launch_or_fused(kind, fuse_prep):
    """The ring products and flush list from their own launch (``fuse_prep=False``, the
    large-batch path) or formed inside the non-flush launch (small batches): the same
    outputs, counters and states as the reference, rows flushing on different steps."""
    for name in ("replay-fp32", "nvfp4-read/fp16-sr"):
        _run(kind, _small_L(PRESETS[name]), stagger=True, fuse_prep=fuse_prep, one_launch=False)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("fuse_prep", [False, True])
def test_programmatic_launch_matches_reference(kind, fuse_prep):
    """The kernels built for programmatic dependent launch (``pdl=True``: the non-flush
    programs read the ring products after their state product and a wait, Mamba-2's NVFP4
    prescales formed in the program, the flush waits first), with and without the
    ring-products launch: the same outputs, counters and states as the reference, rows
    flushing on different steps. The GDN read-copy presets take the UT-transform flush."""
    for name in ("replay-fp32", "nvfp4-read/fp16-sr", "nvfp4-read/fp32"):
        _run(kind, _small_L(PRESETS[name]), stagger=True, fuse_prep=fuse_prep, one_launch=False,
             pdl=True)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("one_launch", [True, False])
def test_early_loads_match_reference(kind, one_launch):
    """``early_loads=True``: the non-flush output formed before the cursor is known, from all
    of the ring's records with the stale ones selected away, here NaN-poisoned: the same
    outputs, counters and states as the reference, rows flushing on different steps, in one
    launch (flushing rows then discard it) and with the separate launches."""
    for name in ("replay-fp32", "nvfp4-read/fp16-sr"):
        _run(kind, _small_L(PRESETS[name]), stagger=True, one_launch=one_launch,
             early_loads=True, poison_ring=True)


def test_programmatic_launch_choice():
    """``pdl`` defaults to what the device has (none off CUDA, none before sm_90) at every
    batch; asked for on the interpreter's CPU tensors it builds the same kernels, whose waits are
    no-ops there; a string names one launch edge, anything else is refused."""
    from replayssm_quant.kernels.knobs import pdl_edges_of, resolve_pdl
    from replayssm_quant.kernels.plan import TARGETS

    cpu = torch.device("cpu")
    assert resolve_pdl(None, cpu) is False
    assert resolve_pdl(None, TARGETS["h200"]) is True and resolve_pdl(None, TARGETS["a100"]) is False
    assert resolve_pdl(True, cpu) is True and resolve_pdl(False, cpu) is False
    assert resolve_pdl("prep", cpu) is True and pdl_edges_of("prep") == ("prep",)
    assert pdl_edges_of(None) == pdl_edges_of(True) == ("prep", "flush")
    with pytest.raises(ValueError, match="pdl"):
        resolve_pdl("both", cpu)


@pytest.mark.parametrize("name", ["nvfp4-read/fp16-sr", "nvfp4-read/fp32"])
@pytest.mark.parametrize("g_value", [-30.0, -1.0e4, float("-inf")])
@pytest.mark.parametrize("fold", ["records", "dot"])
def test_gdn_read_copy_flush_strong_decay(name, g_value, fold):
    """Heads whose decay since the checkpoint underflows (g = -30 per record: e^-60 after two),
    is zero in float32 (g = -1e4) or is an exact zero (g = -inf): the non-flush steps' decay
    weights (``log_decay_suffixes``, no -inf - -inf) and the GDN read-copy flush, replaying
    the window record by record or solving it with the UT transform (``log_decay_segments``),
    give the reference's outputs and states."""
    cfg = _small_L(PRESETS[name])
    g = torch.Generator().manual_seed(7)
    HV, V, K, HK = 4, 16, 32, 2
    ref = gdn.init_gdn_state(cfg, NSLOTS, HV, V, K, HK, seed=11, layer=3)
    gdn.load_state(ref, torch.arange(NSLOTS), torch.randn(NSLOTS, HV, V, K, generator=g) * 0.3)
    steps = cfg.L + 1
    inp = gdn_inputs(len(SLOTS), steps, HV, V, K, HK, generator=g)
    inp["g"][:, :, :2] = g_value  # two heads decay hard, two as drawn
    for t in range(steps):
        ker = _clone(ref)
        cache = cache_from_reference(ker)
        a = {k: v[:, t].contiguous() for k, v in inp.items()}
        y_ref = gdn.decode_step(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        y = gdn_decode_step(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS, block_v=16,
                            out=torch.full((len(SLOTS), HV, V), float("nan")), flush_fold=fold)
        valid = SLOTS >= 0
        assert torch.isfinite(y[valid]).all()
        rel = ((y[valid] - y_ref[valid]).norm() / y_ref[valid].norm()).item()
        assert rel < 1e-5, f"step {t}: output rel err {rel:.2e}"
        _close_state(ker.ckpt, ref.ckpt, cfg.ckpt)
        _close_state(ker.read, ref.read, cfg.read)


@triton.jit
def _advance_rows_kernel(slots_ptr, cur_ptr, fi_ptr, nrows, L: tl.constexpr, RB: tl.constexpr):
    advance_rows(slots_ptr, cur_ptr, fi_ptr, tl.program_id(0), tl.num_programs(0), nrows, L, RB)


def test_advance_rows_covers_every_row_once():
    """The strided advance of the flush programs: 3 programs over 150 rows in blocks of 16
    move each live row's cursor once (wrapping at L, counting the flush) and leave padding
    rows' slots alone."""
    g = torch.Generator().manual_seed(5)
    n, L = 150, 4
    slots = torch.randperm(n + 10, generator=g)[:n].to(torch.int32)
    slots[torch.rand(n, generator=g) < 0.2] = -1
    cur = torch.randint(0, L, (n + 10,), generator=g, dtype=torch.int32)
    fi = torch.randint(0, 1000, (n + 10,), generator=g, dtype=torch.int32)
    want_cur, want_fi = cur.clone(), fi.clone()
    live = slots[slots >= 0].long()
    flushing = cur[live] == L - 1
    want_cur[live] = torch.where(flushing, 0, cur[live] + 1)
    want_fi[live] = fi[live] + flushing.int()
    _advance_rows_kernel[(3,)](slots, cur, fi, n, L=L, RB=16)
    assert torch.equal(cur, want_cur) and torch.equal(fi, want_fi)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["fp32", "replay-fp32", "nvfp4-read/fp16-sr"])
def test_tile_first_grid_matches_reference(kind, name):
    """The (tiles, heads, rows) launch grid (``tile_first``) reads the same rows and heads."""
    cfg = _small_L(PRESETS[name])
    _run(kind, cfg, stagger=cfg.L > 1, tile_first=True)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr", "shared-fp8", "nvfp4-read/fp8-sr"])
def test_records_flush_fold_matches_reference(kind, name):
    """The flush that folds record by record (``flush_fold="records"``), with rows flushing
    on different steps and a NaN input: same outputs and checkpoints as the reference."""
    cfg = _small_L(PRESETS[name])
    _run(kind, cfg, stagger=True, flush_fold="records")
    ref, ker = _run(kind, cfg, steps=4, nan_at=1, flush_fold="records")
    assert int(ker.nan_count.sum()) > 0 and int(ref.nan_count) > 0


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["nvfp4-read/fp16-sr", "fp8-read/fp32"])
def test_dot_flush_fold_matches_reference(kind, name):
    """The flush that folds the window with matrix products (``flush_fold="dot"``; for GDN
    read copies the u's come from the UT transform built by the prep launch), rows flushing
    on different steps and a NaN input."""
    cfg = _small_L(PRESETS[name])
    _run(kind, cfg, stagger=True, flush_fold="dot")
    ref, ker = _run(kind, cfg, steps=4, nan_at=1, flush_fold="dot")
    assert int(ker.nan_count.sum()) > 0 and int(ref.nan_count) > 0


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr", "shared-fp8"])
def test_bf16x3_flush_fold_matches_reference(kind, name):
    """The dot fold on tensor cores with exact products (``flush_precision="bf16x3"``: the
    fp32 operand as three bf16 pieces against the bf16 ring's B_j / k_j), with a bf16 ring,
    rows flushing on different steps and a NaN input; an fp32 ring is refused."""
    cfg = _small_L(PRESETS[name])
    kw = dict(flush_fold="dot", flush_precision="bf16x3", act=torch.bfloat16)
    _run(kind, cfg, stagger=True, **kw)
    ref, ker = _run(kind, cfg, steps=4, nan_at=1, **kw)
    assert int(ker.nan_count.sum()) > 0 and int(ref.nan_count) > 0
    with pytest.raises(ValueError, match="needs a bf16 ring"):
        _run(kind, cfg, steps=cfg.L, flush_fold="dot", flush_precision="bf16x3")


def test_default_fold_precision():
    """Exact tensor-core products only where they are exact and measured faster: the dot fold
    without u recompute (an fp32 or fp8 checkpoint), 16+ row tiles, a bf16 ring."""
    from replayssm_quant.kernels.tuning.rules import default_fold_precision

    fp32, bf16 = PRESETS["replay-fp32"], torch.bfloat16
    assert default_fold_precision(fp32, False, 16, bf16) == "bf16x3"
    assert default_fold_precision(fp32, True, 16, bf16) == "ieee"  # record fold
    assert default_fold_precision(fp32, False, 8, bf16) == "ieee"  # below an MMA's rows
    assert default_fold_precision(fp32, False, 16, torch.float16) == "ieee"
    assert default_fold_precision(PRESETS["shared-fp8"], False, 16, bf16) == "bf16x3"
    assert default_fold_precision(PRESETS["shared-fp8"], False, 8, bf16) == "ieee"
    for name in ("nvfp4-read/fp32", "nvfp4-read/fp16-sr"):
        assert default_fold_precision(PRESETS[name], False, 16, bf16) == "ieee"


def test_misaligned_nvfp4_state_is_refused():
    """NVFP4 rows are read as int32 words: a cache cut at an odd byte offset is refused
    instead of faulting on the device."""
    from replayssm_quant.kernels.core.cache import StateTensors

    cfg = PRESETS["nvfp4-read/fp32"]
    cache = cache_from_reference(mamba2.init_mamba2_state(cfg, 2, 4, 16, 32, 2))
    raw = torch.zeros(cache.read.data.numel() + 1, dtype=torch.uint8)
    cache.read = StateTensors("nvfp4", raw[1:].view(cache.read.data.shape),
                              cache.read.row_scale, cache.read.block_scale)
    x, dt = torch.randn(1, 4, 16), torch.rand(1, 4)
    A, B = -torch.rand(4), torch.randn(1, 2, 32)
    with pytest.raises(ValueError, match="4-byte boundary"):
        mamba2_decode_step(cache, x, dt, A, B, B, None, torch.zeros(1, dtype=torch.int32))


def _one_row_step(kind, cfg, **kw):
    """One decode step of one row on a small fresh cache (4 heads x 16 rows x 32 columns,
    2 groups / key heads), with step knobs ``kw``."""
    slot = torch.zeros(1, dtype=torch.int32)
    if kind == "gdn":
        cache = cache_from_reference(gdn.init_gdn_state(cfg, 2, 4, 16, 32, 2))
        q, v = torch.randn(1, 2, 32), torch.randn(1, 4, 16)
        return gdn_decode_step(cache, q, q, v, -torch.rand(1, 4), torch.rand(1, 4), slot, **kw)
    cache = cache_from_reference(mamba2.init_mamba2_state(cfg, 2, 4, 16, 32, 2))
    x, dt = torch.randn(1, 4, 16), torch.rand(1, 4)
    A, B = -torch.rand(4), torch.randn(1, 2, 32)
    return mamba2_decode_step(cache, x, dt, A, B, B, None, slot, **kw)


def test_flush_fold_is_checked():
    with pytest.raises(ValueError, match="flush_fold must be one of"):
        _one_row_step("mamba2", PRESETS["replay-fp32"], flush_fold="rank1")


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_sr_bits_match_reference(kind):
    """Conventional fp16-sr step: kernel and reference draw the same SR words, but their fp32
    states can differ by an ulp (GDN's u has a dot product whose order differs; Mamba-2's
    decay ``exp(dt * A)`` is not correctly rounded, and torch's and the kernel's exp differ in
    the last bit for some heads), so a few elements may land on the other SR neighbour
    (``_run`` checks that those are one grid step apart). The words themselves are pinned
    bit for bit by ``test_sr_stream.py``."""
    ref, ker = _run(kind, PRESETS["fp16-sr"], steps=2)
    assert (ker.ckpt.data != ref.ckpt.data).float().mean() < 1e-3


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr", "fp32", "shared-fp8"])
@pytest.mark.parametrize("one_launch", [True, False])
def test_nan_inputs_are_reported(kind, name, one_launch):
    ref, ker = _run(kind, _small_L(PRESETS[name]), steps=4, nan_at=1, one_launch=one_launch)
    assert int(ker.nan_count.sum()) == int(ref.nan_count) > 0  # every NaN written, counted


def test_rejects_bad_inputs():
    cfg = PRESETS["replay-fp32"]
    ref = mamba2.init_mamba2_state(cfg, 2, 4, 16, 32, 2)
    cache = cache_from_reference(ref)
    x, dt = torch.randn(1, 4, 16), torch.rand(1, 4)
    A, B = -torch.rand(4), torch.randn(1, 2, 32)
    with pytest.raises(ValueError, match="slots must be int32"):
        mamba2_decode_step(cache, x, dt, A, B, B, None, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="dt must be fp32"):
        mamba2_decode_step(cache, x, dt.double(), A, B, B, None, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="cache has"):
        mamba2_decode_step(cache, torch.randn(1, 4, 8), dt, A, B, B, None,
                           torch.zeros(1, dtype=torch.int32))


@triton.jit
def _flush_list_kernel(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L: tl.constexpr,
                       RB: tl.constexpr):
    flush_list(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L, RB)


def test_flush_list_compacts_across_blocks():
    """The flush list over more rows than one block (RB = 16, 53 rows): the flushing rows in
    order with their next flush index, their count first; padding rows and other cursors
    left out."""
    g = torch.Generator().manual_seed(3)
    n, L = 53, 4
    slots = torch.randperm(n, generator=g).to(torch.int32)
    slots[torch.rand(n, generator=g) < 0.2] = -1
    cur = torch.randint(0, L, (n,), generator=g, dtype=torch.int32)
    fi = torch.randint(0, 1000, (n,), generator=g, dtype=torch.int32)
    out = torch.full((2 * n + 1,), -7, dtype=torch.int32)
    _flush_list_kernel[(1,)](slots, cur, fi, out, n, L=L, RB=16)
    rows = [i for i in range(n) if slots[i] >= 0 and cur[slots[i]] == L - 1]
    assert 3 < len(rows) < n
    assert out[0].item() == len(rows)
    assert out[1:1 + 2 * len(rows):2].tolist() == rows
    assert out[2:2 + 2 * len(rows):2].tolist() == [fi[slots[i]].item() + 1 for i in rows]


@pytest.mark.parametrize("P,N,want", [(64, 128, 64), (80, 128, 32), (128, 256, 32), (48, 128, 16),
                                      (8, 128, 8)])
def test_mamba2_tile_rows_pad_head_dim_little(P, N, want):
    """The decode tile is a power of two that pads head_dim by at most a quarter (head_dim 80
    of Nemotron-3-Nano: 32 rows, not 64)."""
    from replayssm_quant.kernels.tuning.mamba2_rules import block_p_default

    b = block_p_default(P, N)
    assert b == want and b & (b - 1) == 0
    assert -(-P // b) * b <= 1.25 * P or b == 16


def test_flush_pipelining_only_for_plain_fp32_checkpoints():
    """The Mamba-2 flush loop is pipelined for a plain fp32 checkpoint only (3 stages of
    cp.async loads, 2 of TMA loads); SR and read-copy flushes keep Triton's default (None).
    GDN's tensor-core fold: 3 stages over cp.async loads of an fp32 checkpoint, 2 over TMA
    loads or an fp8 checkpoint, Triton's default for the record folds."""
    from replayssm_quant.kernels.tuning.gdn_rules import gdn_flush_stages
    from replayssm_quant.kernels.tuning.mamba2_rules import flush_stages_for

    fp32 = PRESETS["replay-fp32"]
    assert flush_stages_for(fp32) == 3 and flush_stages_for(fp32, True) == 2
    for name in ("nvfp4-read/fp32", "nvfp4-read/fp16-sr", "shared-fp8", "shared-nvfp4"):
        assert flush_stages_for(PRESETS[name]) is None, name
    assert gdn_flush_stages("bf16x3", False, fp32) == 3
    assert gdn_flush_stages("bf16x3", False, fp32, True) == 2
    assert gdn_flush_stages("bf16x3", False, PRESETS["shared-fp8"]) == 2
    assert gdn_flush_stages("bf16x3", True, fp32) is None
    assert gdn_flush_stages("ieee", False, fp32) is None


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_tma_flush_matches_reference(kind):
    """The fp32 checkpoint's flush with its tiles moved by tensor descriptors (``flush_tma``,
    the default on sm_90+): equal to the reference with rows flushing on different steps, on
    both folds, and a NaN input counted and kept."""
    cfg = _small_L(PRESETS["replay-fp32"])
    rows = {"flush_block_p": 8} if kind == "mamba2" else {"flush_block_v": 8}
    _run(kind, cfg, stagger=True, flush_tma=True, **rows)
    _run(kind, cfg, stagger=True, flush_tma=True, flush_fold="dot", flush_precision="bf16x3",
         act=torch.bfloat16, **rows)
    ref, ker = _run(kind, cfg, steps=4, nan_at=1, flush_tma=True, flush_fold="records", **rows)
    assert int(ker.nan_count.sum()) == int(ref.nan_count) > 0


def test_flush_tma_resolves_where_it_applies():
    """TMA by default wherever it applies (an fp32 checkpoint without a read copy, whole
    flush tiles, the persistent flush); asking for it elsewhere is refused with the reason."""
    from replayssm_quant.kernels.core.cache import StateTensors
    from replayssm_quant.kernels.core.memory import resolve_flush_tma, state_descriptor

    cpu = torch.device("cpu")
    fp32, nv = PRESETS["replay-fp32"], PRESETS["nvfp4-read/fp32"]
    assert resolve_flush_tma(None, fp32, 80, 16, False, cpu)
    assert not resolve_flush_tma(None, fp32, 80, 32, False, cpu)  # 80 rows: no whole tiles
    assert not resolve_flush_tma(None, fp32, 64, 16, True, cpu)  # one launch
    assert not resolve_flush_tma(None, nv, 64, 16, False, cpu)
    assert not resolve_flush_tma(None, PRESETS["shared-fp8"], 64, 16, False, cpu)
    assert not resolve_flush_tma(False, fp32, 64, 16, False, cpu)
    for args, match in (((nv, 64, 16, False), "fp32 checkpoint without a read copy"),
                        ((fp32, 80, 32, False), "whole flush tiles"),
                        ((fp32, 64, 16, True), "one_launch")):
        with pytest.raises(ValueError, match=match):
            resolve_flush_tma(True, *args, cpu)
    assert state_descriptor(None, 16, False) is None
    page = torch.zeros(3, 2 * 32 * 32 + 4)  # vLLM-style: one strided page per slot
    st = StateTensors("fp32", page[:, :2 * 32 * 32].view(3, 2, 32, 32))
    d = state_descriptor(st, 8, True)
    assert list(d.shape) == [3, 64, 32] and list(d.strides) == [page.stride(0), 32, 1]
    assert list(d.block_shape) == [1, 8, 32]
    with pytest.raises(ValueError, match="fp32"):
        state_descriptor(StateTensors("fp16", torch.zeros(2, 2, 4, 32, dtype=torch.float16)),
                         4, True)
    with pytest.raises(ValueError, match="contiguous"):
        state_descriptor(StateTensors("fp32", torch.zeros(2, 4, 2, 32).transpose(1, 2)), 4,
                         True)
    # a page whose checkpoint starts off a 16-byte boundary: the default falls back to the
    # cp.async loads, asking for TMA is refused
    odd = torch.zeros(3, 2 * 32 * 32 + 8)[:, 1:1 + 2 * 32 * 32].view(3, 2, 32, 32)
    assert not resolve_flush_tma(None, fp32, 32, 8, False, cpu, odd)
    assert resolve_flush_tma(None, fp32, 32, 8, False, cpu, st.data)
    with pytest.raises(ValueError, match="16-byte"):
        resolve_flush_tma(True, fp32, 32, 8, False, cpu, odd)


def test_launch_defaults_follow_the_measured_table():
    """Step programs: one warp when they read an fp8 / NVFP4 copy, small SR tiles for the
    conventional step; the Mamba-2 flush knobs come from the measured table, and configs
    outside it keep the plain defaults."""
    from replayssm_quant.kernels.tuning.gdn_rules import gdn_flush_knobs, gdn_step_knobs
    from replayssm_quant.kernels.tuning.mamba2_rules import mamba2_flush_knobs, mamba2_step_knobs

    assert mamba2_step_knobs(PRESETS["replay-fp32"], 64, 128) == (64, 1)
    assert mamba2_step_knobs(PRESETS["replay-fp32"], 80, 128) == (32, 1)
    assert mamba2_step_knobs(PRESETS["fp32"], 64, 128) == (16, 1)
    assert mamba2_step_knobs(PRESETS["fp32"], 8, 16) == (8, 1)
    assert mamba2_step_knobs(PRESETS["fp16-sr"], 64, 128) == (8, 2)
    assert mamba2_step_knobs(parse_config("ckpt=bf16,L=1"), 64, 128) == (64, 4)
    assert gdn_step_knobs(PRESETS["fp32"], 128) == (16, 1)
    assert gdn_step_knobs(PRESETS["fp16-sr"], 128) == (8, 2)
    assert gdn_step_knobs(PRESETS["bf16-sr"], 128) == (32, 8)
    assert gdn_step_knobs(PRESETS["replay-fp32"], 128) == (32, 1)
    for name in ("nvfp4-read/fp32", "nvfp4-read/fp16-sr", "shared-fp8", "shared-nvfp4",
                 "fp8-read/fp32"):
        assert mamba2_step_knobs(PRESETS[name], 64, 128) == (64, 1), name
        assert gdn_step_knobs(PRESETS[name], 128) == ((32 if "fp8" in name else 64), 1), name
    assert mamba2_flush_knobs(PRESETS["nvfp4-read/fp8-sr"]) == ("records", 8, 1)
    assert mamba2_flush_knobs(PRESETS["shared-fp8"]) == ("dot", 16, 1)
    assert mamba2_flush_knobs(PRESETS["shared-nvfp4"]) == ("records", 8, 1)
    assert gdn_flush_knobs(PRESETS["fp8-read/fp32"]) == ("records", 16, 1)
    assert mamba2_flush_knobs(PRESETS["replay-fp32"]) == ("dot", 16, 1)
    assert gdn_flush_knobs(PRESETS["replay-fp32"]) == ("dot", 16, 1)
    assert gdn_flush_knobs(PRESETS["shared-nvfp4"]) == ("records", 8, 1)
    assert gdn_flush_knobs(PRESETS["shared-fp8"]) == ("dot", 16, 1)
    assert gdn_flush_knobs(PRESETS["nvfp4-read/fp32"]) == ("records", 16, 2)
    assert mamba2_flush_knobs(PRESETS["nvfp4-read/fp16-sr"]) == ("records", 16, 2)
    assert gdn_flush_knobs(PRESETS["nvfp4-read/fp16-sr"]) == ("records", 16, 4)
    assert gdn_flush_knobs(PRESETS["nvfp4-read/fp8-sr"], batch=64) == ("records", 16, 4)
    assert gdn_flush_knobs(PRESETS["nvfp4-read/fp16-sr"], batch=63) == ("records", 32, 8)
    assert gdn_flush_knobs(PRESETS["nvfp4-read/fp32"], batch=8) == ("records", 16, 2)
    custom = replace(PRESETS["nvfp4-read/fp16-sr"], ckpt=F.canonical_format("bf16"))
    assert mamba2_flush_knobs(custom) == ("dot", 32, 8)
    assert mamba2_flush_knobs(PRESETS["nvfp4-read/fp32"]) == ("records", 8, 1)
    assert mamba2_flush_knobs(PRESETS["fp8-read/fp32"]) == ("records", 8, 1)


def test_persistent_grid_is_one_wave_of_resident_programs():
    """Programs per SM by the sm_90 rules: registers per warp in 256-register units from a
    sub-partition's quarter of the file (168 registers, one warp: 12; 255: 8; 160 at four
    warps: 3), threads and shared memory; an explicit ``flush_per_sm`` wins, and the
    interpreter runs four programs."""
    from replayssm_quant.kernels.core.persistent import persistent_programs, programs_per_sm

    assert programs_per_sm(168, 1) == 12
    assert programs_per_sm(151, 1) == 12  # three 152-register warps per scheduler, not 13 per SM
    assert programs_per_sm(96, 1) == programs_per_sm(88, 1) == 20  # not 21 and 23
    assert programs_per_sm(255, 1) == 8
    assert programs_per_sm(128, 1) == 16
    assert programs_per_sm(72, 1) == 28
    assert programs_per_sm(160, 4) == 3
    assert programs_per_sm(238, 8) == 1
    assert programs_per_sm(16, 1) == 32  # the per-SM program limit
    assert programs_per_sm(32, 32) == 2  # threads: 2048 per SM
    assert programs_per_sm(32, 1, shared=100_000) == 2  # shared memory
    cpu = torch.device("cpu")
    assert persistent_programs(None, cpu, 1000, None, (), {}) == 4
    assert persistent_programs(None, cpu, 3, 7, (), {}) == 3


def test_resident_programs_fall_back_when_triton_cannot_tell():
    """A kernel object without Triton's warmup internals gets the old grid with a warning."""
    from replayssm_quant.kernels.core import persistent

    class Bare:
        pass

    k = Bare()
    with pytest.warns(RuntimeWarning, match="persistent grid"):
        n = persistent.resident_programs(k, torch.device("cuda", 0), (), {"BPF": 8})
    assert n == persistent.FALLBACK_PER_SM
    assert persistent.resident_programs(k, torch.device("cuda", 0), (), {"BPF": 8}) == n
    persistent._RESIDENT.clear()


def test_resident_programs_keyed_on_specialized_arguments_only():
    """A row count Triton does not specialize on (``do_not_specialize``) does not make a new
    grid-size query: a new batch size inside a CUDA-graph capture asks nothing new. An
    argument Triton does specialize on (divisible by 16 or not) does."""
    from replayssm_quant.kernels.core import persistent

    class Bare:
        arg_names = ["x_ptr", "seed", "nrows", "stride"]
        do_not_specialize = ["seed", 2]

    k, dev, t = Bare(), torch.device("cuda", 0), torch.zeros(4)
    try:
        with pytest.warns(RuntimeWarning, match="persistent grid"):
            persistent.resident_programs(k, dev, (t, 3, 1, 16), {"BPF": 8})
        assert len(persistent._RESIDENT) == 1
        for seed, nrows in ((5, 17), (7, 48), (0, 256)):
            persistent.resident_programs(k, dev, (t, seed, nrows, 16), {"BPF": 8})
        assert len(persistent._RESIDENT) == 1
        with pytest.warns(RuntimeWarning, match="persistent grid"):
            persistent.resident_programs(k, dev, (t, 3, 1, 24), {"BPF": 8})
        assert len(persistent._RESIDENT) == 2
    finally:
        persistent._RESIDENT.clear()


def test_resident_table_names_each_sized_kernel():
    from replayssm_quant.kernels.core import persistent

    class Kernel:
        def fn(self):
            pass

    k = Kernel()
    key = (k, 0, (("BPF", 16), ("L", 16), ("num_warps", 1)), ())
    persistent._RESIDENT[key] = 12
    try:
        assert ("fn", {"BPF": 16, "num_warps": 1}, 12) in persistent.resident_table()
        # with the compiled kernel's registers and shared memory where it was compiled here
        persistent._COMPILED[key] = {"regs": 168, "shared": 8200}
        assert ("fn", {"BPF": 16, "num_warps": 1, "regs": 168, "shared": 8200}, 12) in \
            persistent.resident_table()
    finally:
        del persistent._RESIDENT[key]
        persistent._COMPILED.pop(key, None)


def test_grid_order_defaults_follow_the_measured_table():
    """The Hopper table's grid orders: conventional steps, multi-tile Mamba-2 heads and
    non-flush steps reading the state itself tile-first; narrow reads row-first."""
    from replayssm_quant.kernels.tuning.gdn_rules import gdn_tile_first
    from replayssm_quant.kernels.tuning.mamba2_rules import mamba2_tile_first

    assert mamba2_tile_first(0, 64, 64) and mamba2_tile_first(17, 80, 32)
    assert not mamba2_tile_first(17, 64, 64) and mamba2_tile_first(17, 64, 64, narrow=False)
    assert gdn_tile_first(0) and not gdn_tile_first(17) and gdn_tile_first(17, narrow=False)


def test_small_grid_rows_only_shrink_small_replay_grids():
    """Non-flush tiles shrink when the grid would be short of programs (batch 1): narrow
    reads to 16 rows below 512 programs, fp32 reads (and every read of a one-launch step) to
    8 rows below 1024; all keep their rows at serving batch sizes, and conventional steps
    never change."""
    from replayssm_quant.kernels.tuning.rules import small_grid_rows

    narrow, fp32 = PRESETS["nvfp4-read/fp16-sr"], PRESETS["replay-fp32"]
    assert small_grid_rows(narrow, 64, 64, 128, 1) == 16       # Super, batch 1: 512 programs
    assert small_grid_rows(narrow, 64, 128, 64, 1) == 16       # Qwen3.5-122B, batch 1
    assert small_grid_rows(narrow, 64, 128, 64, 4) == 64       # 4 x 64 x 2 = 512 programs
    assert small_grid_rows(narrow, 64, 64, 128, 256) == 64
    assert small_grid_rows(fp32, 64, 64, 128, 1) == 8          # Super, batch 1: 1024 programs
    assert small_grid_rows(fp32, 32, 128, 64, 1) == 8          # Qwen3.5-122B: 64 x 16 programs
    assert small_grid_rows(fp32, 32, 128, 64, 2) == 16         # 2 x 64 x 8 = 1024 programs
    assert small_grid_rows(fp32, 32, 128, 64, 8) == 32
    assert small_grid_rows(fp32, 64, 64, 128, 256) == 64
    assert small_grid_rows(PRESETS["fp32"], 32, 64, 128, 1) == 32
    # one launch per step: the tiles also flush, so every read goes down to 8 rows
    assert small_grid_rows(narrow, 64, 64, 128, 1, one_launch=True) == 8
    assert small_grid_rows(narrow, 64, 128, 64, 1, one_launch=True) == 8
    assert small_grid_rows(narrow, 64, 128, 64, 4, one_launch=True) == 32
    assert small_grid_rows(PRESETS["fp32"], 32, 64, 128, 1, one_launch=True) == 32


def test_gdn_ut_flush_refuses_the_faulting_tf32x3_tile():
    """The UT-transform flush with TF32x3 products on 64-row, 8-warp tiles faults on the
    H200 (probe_r43_tf32x3_tiles.log): that tile is refused with a message before any
    launch, its neighbours pass, and a small-tile TF32x3 UT flush still matches the
    reference."""
    from replayssm_quant.kernels.knobs import check_ut_tile

    with pytest.raises(ValueError, match="flush_warps=4"):
        check_ut_tile(True, "tf32x3", 64, 8)
    for args in ((True, "tf32x3", 32, 8), (True, "tf32x3", 64, 4), (True, "ieee", 64, 8),
                 (False, "tf32x3", 64, 8)):
        check_ut_tile(*args)
    cfg = _small_L(PRESETS["nvfp4-read/fp16-sr"])
    _run("gdn", cfg, steps=cfg.L, flush_fold="dot", flush_precision="tf32x3", flush_block_v=16,
         flush_warps=8)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_lut_decode_matches_reference(kind):
    """The 16-entry table decode of NVFP4 copies (``lut=True``) reads the same values."""
    _run(kind, _small_L(PRESETS["nvfp4-read/fp16-sr"]), steps=3, lut=True)


@pytest.mark.parametrize("mode", ["words", "e4m3", "mma"])
def test_mamba2_nvfp4_decodes_match_reference(mode):
    """The NVFP4 decodes of the Mamba-2 non-flush step (``nvfp4_decode``: through E4M3 bytes,
    the default, fp32 bit patterns, or E4M3 bytes times the block scale in fp16 into a
    tensor-core product with C's pieces from the ring-products launch) read the same
    values, for a read copy and for an NVFP4 checkpoint, with fp32 and bf16 activations, a
    NaN input and a NaN in the stored state; an unknown mode is refused, and the tensor-core
    product where no ring-products launch runs."""
    kw = dict(nvfp4_decode=mode)
    if mode == "mma":
        kw.update(fuse_prep=False, one_launch=False)
    for name in ("nvfp4-read/fp16-sr", "shared-nvfp4"):
        cfg = _small_L(PRESETS[name])
        _run("mamba2", cfg, stagger=True, **kw)
        ref, ker = _run("mamba2", cfg, steps=4, nan_at=1, **kw)
        assert int(ker.nan_count.sum()) > 0 and int(ref.nan_count) > 0
        if mode == "mma":
            _run("mamba2", cfg, steps=3, act=torch.bfloat16, **kw)
            _run("mamba2", cfg, steps=2, nan_state=True, **kw)
    with pytest.raises(ValueError, match="nvfp4_decode must be one of"):
        _one_row_step("mamba2", cfg, nvfp4_decode="lut")
    if mode == "mma":
        for bad in (dict(fuse_prep=True), dict(one_launch=True)):
            with pytest.raises(ValueError, match="ring-products launch"):
                _one_row_step("mamba2", cfg, nvfp4_decode="mma", **bad)


def test_gdn_nvfp4_tensor_core_products_match_reference():
    """``nvfp4_decode="mma"``: a GDN step's S k and S q of an NVFP4 source from one
    tensor-core product of the decoded rows (codes times block scale in fp16) with the fp16
    pieces of k and q that the ring-products launch writes. A read copy and an NVFP4
    checkpoint, fp32 and bf16 activations, flushes on different steps, a NaN input and a NaN
    in the stored state (its block scale NaN: the reference's rows NaN, no others); refused
    where no ring-products launch runs, and for an unknown mode."""
    kw = dict(nvfp4_decode="mma", fuse_prep=False, one_launch=False)
    for name in ("nvfp4-read/fp16-sr", "shared-nvfp4"):
        cfg = _small_L(PRESETS[name])
        _run("gdn", cfg, stagger=True, **kw)
        _run("gdn", cfg, steps=3, act=torch.bfloat16, **kw)
        ref, ker = _run("gdn", cfg, steps=4, nan_at=1, **kw)
        assert int(ker.nan_count.sum()) > 0 and int(ref.nan_count) > 0
        _run("gdn", cfg, steps=2, nan_state=True, **kw)
    cfg = PRESETS["nvfp4-read/fp16-sr"]
    for bad in (dict(fuse_prep=True), dict(one_launch=True)):
        with pytest.raises(ValueError, match="ring-products launch"):
            _one_row_step("gdn", cfg, nvfp4_decode="mma", **bad)
    with pytest.raises(ValueError, match="nvfp4_decode must be one of"):
        _one_row_step("gdn", cfg, nvfp4_decode="e4m3")
    with pytest.raises(ValueError, match="asks for another decode"):
        _one_row_step("gdn", cfg, nvfp4_decode="mma", lut=True)


@triton.jit
def _pieces_kernel(v_ptr, out_ptr, scale_ptr, N: tl.constexpr):
    from replayssm_quant.kernels.core.products import mma_vector_pieces

    mma_vector_pieces(v_ptr, out_ptr, scale_ptr, 3, N, True)


def test_mma_vector_pieces_hold_the_vector():
    """Three fp16 pieces (columns 3-5, zeros after) times the stored factor give back every
    fp32 entry, in the order the E4M3 word decode puts a row's nibbles in (entry 8 w +
    nibble at row 8 w + position): exactly from 2^-16 of the largest entry up (24 bits in
    three 11-bit pieces; two would not do), and below that to within 2^-39 of the largest
    (fp16's smallest step after the prescale), far under an fp32 dot product's rounding. A
    non-finite entry keeps its value in the first piece, zeros in the others."""
    g = torch.Generator().manual_seed(5)
    N = 32
    v = torch.randn(N, generator=g) * torch.exp2(torch.randint(-24, 12, (N,), generator=g).float())
    out = torch.full((N, 16), float("nan"), dtype=torch.float16)
    scale = torch.full((1,), float("nan"))
    _pieces_kernel[(1,)](v, out, scale, N=N)
    pos = torch.arange(N)
    want = v[(pos // 8) * 8 + 2 * (pos % 4) + (pos % 8) // 4].double()  # e2m1_word_nibble
    assert torch.equal(out[:, 6:], torch.zeros(N, 10, dtype=torch.float16))
    assert out[:, :3].isnan().all()  # other columns are not written
    back = out[:, 3:6].double().sum(1) * scale.double() / 64
    top = want.abs().max()
    large = want.abs() >= top * 2.0**-16
    assert large.sum() >= 8 and (~large).sum() >= 8
    assert torch.equal(back[large], want[large])
    assert ((back - want).abs() <= top * 2.0**-39).all()
    two = out[:, 3:5].double().sum(1) * scale.double() / 64
    assert not torch.equal(two[large], want[large])
    row7, row9 = int((pos == 7).nonzero()), int((pos == 9).nonzero())  # entries 7 and 10
    v[7], v[10] = float("inf"), float("nan")
    _pieces_kernel[(1,)](v, out, scale, N=N)
    assert out[row7, 3] == float("inf") and torch.isnan(out[row9, 3])
    assert (out[[row7, row9], 4:6] == 0).all()
    back = out[:, 3:6].double().sum(1) * scale.double() / 64
    finite = torch.isfinite(back)
    assert finite.sum() == N - 2 and torch.equal(back[large & finite], want[large & finite])


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("mode", ["cvt", "words"])
def test_fp8_decodes_match_reference(kind, mode):
    """Both decodes of an fp8 read source (``fp8_decode``: byte tiles through the fp8
    conversion, the default, or int32 words into fp32 bit patterns) read the same values,
    for a read copy and an fp8 checkpoint, across staggered flushes; a NaN in the stored
    state makes exactly the reference's outputs NaN (the words path decodes NaN bytes as
    numbers and must flag them); an unknown mode is refused."""
    for name in ("fp8-read/fp32", "shared-fp8"):
        cfg = _small_L(PRESETS[name])
        _run(kind, cfg, stagger=True, fp8_decode=mode)
        ref, _ = _run(kind, cfg, steps=2, nan_state=True, fp8_decode=mode)
        y_nan = ref.read if cfg.read is not None else ref.ckpt
        assert torch.isnan(F.dequantize(y_nan)).any()
    with pytest.raises(ValueError, match="fp8_decode must be one of"):
        _one_row_step(kind, PRESETS["fp8-read/fp32"], fp8_decode="bytes")


def test_default_decode_builds_no_table():
    """Without ``lut`` the kernels get a placeholder pointer: the first decode step copies
    nothing from host memory, so it may run inside a CUDA-graph capture."""
    from replayssm_quant.formats import E2M1_VALUES
    from replayssm_quant.kernels.core.codes import lut_table

    y = torch.zeros(3)
    assert lut_table(False, y) is y
    table = lut_table(True, y)
    assert table.tolist() == list(E2M1_VALUES) + [-v for v in E2M1_VALUES]


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_register_caps_reach_the_launches(kind):
    """``maxnreg`` / ``flush_maxnreg`` cap the step's and the flush's registers (a launch
    option: the results are the reference's either way); bad caps are refused before any
    launch."""
    from replayssm_quant.kernels.core.memory import register_cap

    assert register_cap(None) == {} and register_cap(64) == {"maxnreg": 64}
    for bad in (8, 300, 64.0, True, "64"):
        with pytest.raises(ValueError, match="maxnreg"):
            register_cap(bad)
    _run(kind, _small_L(PRESETS["nvfp4-read/fp16-sr"]), steps=3, maxnreg=64, flush_maxnreg=72)
    _run(kind, PRESETS["fp16-sr"], steps=2, maxnreg=64)


@pytest.mark.parametrize("name", ["nvfp4-read/fp16-sr", "fp8-read/fp32", "replay-fp32"])
def test_whole_head_non_flush_matches_reference(name):
    """A head dim that is no power of two (24: 16 + 8 rows) in one program per head, by default
    at the default tile rows (for an fp32 read not in one-launch steps), matches the
    reference; so do the padded tiles it replaces."""
    from replayssm_quant.kernels.tuning.mamba2_rules import whole_head_default, whole_head_rows

    assert whole_head_rows(80, 128) == (64, 16) and whole_head_rows(64, 128) is None
    assert whole_head_rows(24, 32) == (16, 8) and whole_head_rows(200, 128) is None
    cfg = _small_L(PRESETS[name])
    assert whole_head_default(cfg)  # every read at batch > 4
    assert whole_head_default(cfg, one_launch=True) == (name != "replay-fp32")
    assert whole_head_default(cfg, one_launch=True, passes=True)  # flushed in row passes
    assert not whole_head_default(PRESETS["fp32"])
    for one_launch in (True, False):  # flushes on the step's two row passes, or apart
        _run("mamba2", cfg, steps=cfg.L + 1, head_dim=24, block_p=None, whole_head=True,
             one_launch=one_launch)
    _run("mamba2", cfg, steps=2, head_dim=24, block_p=None, whole_head=False)


@pytest.mark.parametrize("name", ["nvfp4-read/fp16-sr", "fp8-read/fp32", "shared-nvfp4"])
def test_gdn_narrow_non_flush_where_tiles_do_not_divide_the_value_rows(name):
    """A narrow source's non-flush program drops its row mask only where its tiles divide V
    (``tile_rows``); with V = 24 and 16-row tiles the last tile is half past the head, and
    every step and flush, one launch or apart, still matches the reference."""
    cfg = _small_L(PRESETS[name])
    for one_launch in (True, False):
        _run("gdn", cfg, steps=cfg.L + 1, head_dim=24, one_launch=one_launch)


@pytest.mark.parametrize("name", ["nvfp4-read/fp32", "shared-nvfp4"])
def test_mamba2_nvfp4_non_flush_where_tiles_do_not_divide_the_head(name):
    """An NVFP4 source's Mamba-2 non-flush program drops its row mask only where its tiles
    divide P (``tile_rows``); with P = 24 on 16-row tiles the last tile is a third past the
    head, and with P = 28 in one program (16 + 16 rows) the second pass is a quarter past it.
    Every step and flush, one launch or apart, still matches the reference."""
    from replayssm_quant.kernels.tuning.mamba2_rules import whole_head_rows

    assert whole_head_rows(28, 32) == (16, 16)
    cfg = _small_L(PRESETS[name])
    for one_launch in (True, False):
        _run("mamba2", cfg, steps=cfg.L + 1, head_dim=24, block_p=16, whole_head=False,
             one_launch=one_launch)
        _run("mamba2", cfg, steps=cfg.L + 1, head_dim=28, block_p=None, whole_head=True,
             one_launch=one_launch)
