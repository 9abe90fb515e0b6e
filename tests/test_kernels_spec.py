"""Speculative verify + commit kernels against the reference (interpreted on the CPU)."""

from dataclasses import replace

import pytest
import torch

from replayssm_quant.kernels.core.cache import cache_from_reference
from replayssm_quant.kernels.gdn import gdn_commit, gdn_verify
from replayssm_quant.kernels.mamba2 import mamba2_commit, mamba2_verify
from replayssm_quant.precision import PRESETS
from replayssm_quant.ssm import gdn, mamba2
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

from .test_kernels_decode import _clone, _close_state

SLOTS = torch.tensor([1, 0, -1], dtype=torch.int32)


BF16 = torch.bfloat16


def _through(a: dict, act: torch.dtype, *keys: str) -> dict:
    """Inputs the kernel reads in ``act`` rounded through it for the reference too."""
    return {k: v.to(act).float() if k in keys else v for k, v in a.items()}


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name,L,chunk,act,tile_first,pdl", [
    ("replay-fp32", 4, 16, torch.float32, False, False),
    ("nvfp4-read/fp16-sr", 4, 32, torch.float32, True, True),
    ("shared-fp8", 4, 16, torch.float32, False, False),
    ("replay-fp32", 19, 32, torch.float32, False, True),
    ("replay-fp32", 4, 16, BF16, True, False), ("nvfp4-read/fp16-sr", 4, 32, BF16, False, True),
    ("shared-fp8", 4, 16, BF16, False, False), ("fp16-sr/L", 4, 16, BF16, False, False)])
def test_verify_commit_matches_reference(kind, name, L, chunk, act, tile_first, pdl):
    """Chunk 16 splits the state product in two; L = 19 puts more than 16 committed records
    in front of the drafts (two record chunks); bf16 activations take the exact bf16-split
    state product (``split_dot``: three pieces for fp32, two for fp16, one for fp8 / NVFP4);
    ``tile_first`` launches the (tiles, heads, rows) grid; ``pdl`` the kernels built for a
    programmatic launch (products read after the wait)."""
    if name == "fp16-sr/L":  # an fp16-SR checkpoint read directly (two bf16 pieces)
        cfg = replace(PRESETS["nvfp4-read/fp16-sr"], read=None, L=L)
    else:
        cfg = replace(PRESETS[name], L=L)
    T, rounds = 3, 4 if L == 4 else 9
    prec = "bf16x3" if act == BF16 else "auto"
    g = torch.Generator().manual_seed(5)
    if kind == "mamba2":
        H, P, N, G = 4, 16, 32, 2
        ref = mamba2.init_mamba2_state(cfg, 2, H, P, N, G, spec_tokens=T, seed=2, layer=1,
                                       act_dtype=act)
        mamba2.load_state(ref, torch.arange(2), torch.randn(2, H, P, N, generator=g) * 0.3)
    else:
        HV, V, K, HK = 4, 16, 32, 2
        ref = gdn.init_gdn_state(cfg, 2, HV, V, K, HK, spec_tokens=T, seed=2, layer=1,
                                 act_dtype=act)
        gdn.load_state(ref, torch.arange(2), torch.randn(2, HV, V, K, generator=g) * 0.3)
    for r in range(rounds):
        ker = _clone(ref)
        cache = cache_from_reference(ker)
        acc = torch.tensor([(r + 1) % (T + 1), T, 0], dtype=torch.int32)
        if kind == "mamba2":
            a = _through(mamba2_inputs(3, T, H, P, N, G, generator=g), act, "Bm", "C")
            y_ref = mamba2.verify(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
            y = mamba2_verify(cache, a["x"].to(act), a["dt"], a["A"], a["Bm"].to(act),
                              a["C"].to(act), a["D"], SLOTS, block_p=16, chunk=chunk,
                              dot_precision=prec, tile_first=tile_first, pdl=pdl)
            mamba2.commit(ref, acc, SLOTS, a["A"])
            mamba2_commit(cache, acc, a["A"], SLOTS)
        else:
            a = _through(gdn_inputs(3, T, HV, V, K, HK, generator=g), act, "q", "k", "v")
            y_ref = gdn.verify(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
            y = gdn_verify(cache, a["q"].to(act), a["k"].to(act), a["v"].to(act), a["g"],
                           a["beta"], SLOTS, block_v=16, chunk=chunk, dot_precision=prec,
                           tile_first=tile_first, pdl=pdl)
            gdn.commit(ref, acc, SLOTS)
            gdn_commit(cache, acc, SLOTS)
        v = SLOTS >= 0
        rel = ((y[v] - y_ref[v]).norm() / y_ref[v].norm()).item()
        assert rel < 1e-5, f"round {r}: verify outputs rel err {rel:.2e}"
        assert torch.equal(ker.cursor, ref.cursor)
        assert torch.equal(ker.flush_index.long(), ref.flush_index.long())
        _close_state(ker.ckpt, ref.ckpt, cfg.ckpt)
        if cfg.read is not None:
            _close_state(ker.read, ref.read, cfg.read)
        # the committed ring records agree
        for key in (("x", "dt", "B") if kind == "mamba2" else ("k", "u", "g")):
            rk, kk_ = getattr(ref, key), getattr(ker, key)
            for s in range(2):
                c = int(ref.cursor[s])
                assert torch.allclose(kk_[s, :, :c], rk[s, :, :c], rtol=1e-4, atol=1e-5), key


@pytest.mark.parametrize("kw,match", [({"chunk": 24}, "power of two"), ({"chunk": 8}, ">= 16"),
                                      ({"block_v": 8}, "block_v"),
                                      ({"dot_precision": "tf32"}, "dot_precision")])
def test_gdn_verify_checks_its_knobs(kw, match):
    cfg = replace(PRESETS["replay-fp32"], L=4)
    ref = gdn.init_gdn_state(cfg, 2, 4, 16, 32, 2, spec_tokens=3, seed=2, layer=1)
    a = gdn_inputs(3, 3, 4, 16, 32, 2, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=match):
        gdn_verify(cache_from_reference(ref), a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS,
                   **kw)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_verify_nan_drafts_are_reported(kind):
    """A NaN draft input gives NaN outputs from that draft on (never a finite number), and the
    commit that folds it counts the NaNs it writes into the checkpoint."""
    cfg = replace(PRESETS["nvfp4-read/fp16-sr"], L=2)
    T = 2
    g = torch.Generator().manual_seed(9)
    if kind == "mamba2":
        ref = mamba2.init_mamba2_state(cfg, 2, 4, 16, 32, 2, spec_tokens=T, seed=2, layer=1)
        a = mamba2_inputs(3, T, 4, 16, 32, 2, generator=g)
        a["x"][1, 0] = float("nan")
    else:
        ref = gdn.init_gdn_state(cfg, 2, 4, 16, 32, 2, spec_tokens=T, seed=2, layer=1)
        a = gdn_inputs(3, T, 4, 16, 32, 2, generator=g)
        a["v"][1, 0] = float("nan")
    cache = cache_from_reference(ref)
    acc = torch.tensor([T, T, 0], dtype=torch.int32)
    if kind == "mamba2":
        y = mamba2_verify(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
        mamba2_commit(cache, acc, a["A"], SLOTS)
    else:
        y = gdn_verify(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        gdn_commit(cache, acc, SLOTS)
    assert torch.isfinite(y[0]).all()
    assert torch.isnan(y[1]).any()
    assert int(cache.nan_count.sum()) > 0


@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr"])
def test_gdn_verify_commit_zero_decay(name):
    """Drafts and committed records with an exact zero decay (g = -inf) on two heads: the
    verify takes the -inf as ``VERIFY_G_FLOOR`` (exp 0 as well) in its prefix sums, the
    commit's UT solve uses segment sums (``log_decay_segments``): outputs, checkpoints, read
    copies and ring records match the reference instead of turning NaN."""
    cfg = replace(PRESETS[name], L=4)
    T = 3
    g = torch.Generator().manual_seed(5)
    HV, V, K, HK = 4, 16, 32, 2
    ref = gdn.init_gdn_state(cfg, 2, HV, V, K, HK, spec_tokens=T, seed=2, layer=1)
    gdn.load_state(ref, torch.arange(2), torch.randn(2, HV, V, K, generator=g) * 0.3)
    for r in range(4):
        ker = _clone(ref)
        cache = cache_from_reference(ker)
        acc = torch.tensor([(r + 1) % (T + 1), T, 0], dtype=torch.int32)
        a = gdn_inputs(3, T, HV, V, K, HK, generator=g)
        a["g"][:, 1:, :2] = float("-inf")  # from the second draft on, heads 0 and 1
        y_ref = gdn.verify(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        y = gdn_verify(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS, block_v=16,
                       chunk=16)
        gdn.commit(ref, acc, SLOTS)
        gdn_commit(cache, acc, SLOTS)
        v = SLOTS >= 0
        assert torch.isfinite(y[v]).all()
        rel = ((y[v] - y_ref[v]).norm() / y_ref[v].norm()).item()
        assert rel < 1e-5, f"round {r}: verify outputs rel err {rel:.2e}"
        assert int(cache.nan_count.sum()) == 0
        _close_state(ker.ckpt, ref.ckpt, cfg.ckpt)
        if cfg.read is not None:
            _close_state(ker.read, ref.read, cfg.read)
        for key in ("k", "u", "g"):  # the ring keeps the raw g, -inf included
            rk, kk_ = getattr(ref, key), getattr(ker, key)
            for s in range(2):
                c = int(ref.cursor[s])
                assert torch.allclose(kk_[s, :, :c], rk[s, :, :c], rtol=1e-4, atol=1e-5), key


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_verify_register_cap(kind):
    """The verify's register cap (``verify_maxnreg_default``: ``verify.maxnreg`` from batch
    256) is a launch option only: the default, uncapped (None), the default cap and a tight
    cap give the reference's outputs; a bad cap is refused before any launch."""
    from replayssm_quant.kernels.tuning import DEFAULT_TABLE
    from replayssm_quant.kernels.tuning.rules import verify_maxnreg_default

    VERIFY_MAXNREG = DEFAULT_TABLE["verify.maxnreg"].value
    VERIFY_CAP_MIN_BATCH = DEFAULT_TABLE["verify.cap_min_batch"].value

    assert verify_maxnreg_default(VERIFY_CAP_MIN_BATCH) == VERIFY_MAXNREG
    assert verify_maxnreg_default(VERIFY_CAP_MIN_BATCH - 1) is None
    cfg = replace(PRESETS["replay-fp32"], L=4)
    T = 3
    g = torch.Generator().manual_seed(3)
    if kind == "mamba2":
        ref = mamba2.init_mamba2_state(cfg, 2, 4, 16, 32, 2, spec_tokens=T, seed=2, layer=1)
        mamba2.load_state(ref, torch.arange(2), torch.randn(2, 4, 16, 32, generator=g) * 0.3)
        a = mamba2_inputs(3, T, 4, 16, 32, 2, generator=g)
        y_ref = mamba2.verify(_clone(ref), a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
        run = lambda **kw: mamba2_verify(cache_from_reference(_clone(ref)), a["x"], a["dt"],  # noqa: E731
                                         a["A"], a["Bm"], a["C"], a["D"], SLOTS, block_p=16, **kw)
    else:
        ref = gdn.init_gdn_state(cfg, 2, 4, 16, 32, 2, spec_tokens=T, seed=2, layer=1)
        gdn.load_state(ref, torch.arange(2), torch.randn(2, 4, 16, 32, generator=g) * 0.3)
        a = gdn_inputs(3, T, 4, 16, 32, 2, generator=g)
        y_ref = gdn.verify(_clone(ref), a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        run = lambda **kw: gdn_verify(cache_from_reference(_clone(ref)), a["q"], a["k"],  # noqa: E731
                                      a["v"], a["g"], a["beta"], SLOTS, block_v=16, **kw)
    v = SLOTS >= 0
    for kw in ({}, {"maxnreg": None}, {"maxnreg": VERIFY_MAXNREG}, {"maxnreg": 64}):
        y = run(**kw)
        assert ((y[v] - y_ref[v]).norm() / y_ref[v].norm()).item() < 1e-5, kw
    with pytest.raises(ValueError, match="maxnreg"):
        run(maxnreg=8)
