"""The decode entry points on a device without Triton (a CPU with the interpreter off) run the
pure-torch reference over the cache's own tensors: same outputs as the reference, and the
cache moves with it (cursor, checkpoint, ring), for steps, flushes, verify and commit."""

import copy
from dataclasses import replace

import pytest
import torch

from replayssm_quant.kernels.core.cache import cache_from_reference, runs_reference
from replayssm_quant.kernels.gdn import gdn_commit, gdn_decode_step, gdn_verify
from replayssm_quant.kernels.mamba2 import mamba2_commit, mamba2_decode_step, mamba2_verify
from replayssm_quant.precision import PRESETS
from replayssm_quant.ssm import gdn, mamba2
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

SLOTS = torch.tensor([1, 0, -1], dtype=torch.int32)


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert runs_reference(torch.zeros(1))


def _same_state(a, b):
    assert torch.equal(a.cursor, b.cursor) and torch.equal(a.flush_index, b.flush_index)
    assert torch.equal(a.ckpt.data, b.ckpt.data)
    if a.read is not None:
        assert torch.equal(a.read.data, b.read.data)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", ["replay-fp32", "nvfp4-read/fp16-sr", "fp16-sr"])
def test_decode_entry_points_run_the_reference_without_triton(kind, name, no_interpreter):
    cfg = replace(PRESETS[name], L=min(PRESETS[name].L, 3))
    g = torch.Generator().manual_seed(3)
    T = 2
    if kind == "mamba2":
        ref = mamba2.init_mamba2_state(cfg, 2, 4, 8, 32, 2, spec_tokens=T, seed=1)
        mamba2.load_state(ref, torch.arange(2), torch.randn(2, 4, 8, 32, generator=g))
    else:
        ref = gdn.init_gdn_state(cfg, 2, 4, 8, 32, 2, spec_tokens=T, seed=1)
        gdn.load_state(ref, torch.arange(2), torch.randn(2, 4, 8, 32, generator=g))
    mine = copy.deepcopy(ref)
    cache = cache_from_reference(mine)
    for step in range(4):  # crosses a flush at L = 3
        if kind == "mamba2":
            a = mamba2_inputs(3, 1, 4, 8, 32, 2, generator=g)
            a = {k: v[:, 0] if v.dim() > 1 and k != "A" and k != "D" else v for k, v in a.items()}
            y_ref = mamba2.decode_step(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
            out = torch.full_like(y_ref, float("nan"))
            y = mamba2_decode_step(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS,
                                   out=out)
            assert y is out
        else:
            a = gdn_inputs(3, 1, 4, 8, 32, 2, generator=g)
            a = {k: v[:, 0] for k, v in a.items()}
            y_ref = gdn.decode_step(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
            y = gdn_decode_step(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        assert torch.equal(y, y_ref), step
        _same_state(mine, ref)
    if cfg.L == 1:
        return
    acc = torch.tensor([1, T, 0], dtype=torch.int32)
    if kind == "mamba2":
        a = mamba2_inputs(3, T, 4, 8, 32, 2, generator=g)
        y_ref = mamba2.verify(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
        y = mamba2_verify(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], SLOTS)
        mamba2.commit(ref, acc, SLOTS, a["A"])
        mamba2_commit(cache, acc, a["A"], SLOTS)
    else:
        a = gdn_inputs(3, T, 4, 8, 32, 2, generator=g)
        y_ref = gdn.verify(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        y = gdn_verify(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], SLOTS)
        gdn.commit(ref, acc, SLOTS)
        gdn_commit(cache, acc, SLOTS)
    assert torch.equal(y, y_ref)
    _same_state(mine, ref)


def test_advance_false_keeps_the_counters(no_interpreter):
    cfg = replace(PRESETS["replay-fp32"], L=2)
    st = mamba2.init_mamba2_state(cfg, 2, 4, 8, 32, 2)
    cache = cache_from_reference(st)
    a = mamba2_inputs(2, 1, 4, 8, 32, 2, generator=torch.Generator().manual_seed(0))
    a = {k: v[:, 0] if k not in ("A", "D") else v for k, v in a.items()}
    slots = torch.tensor([0, 1], dtype=torch.int32)
    mamba2_decode_step(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], slots,
                       advance=False)
    assert int(cache.cursor.abs().sum()) == 0 and int(cache.flush_index.abs().sum()) == 0
    mamba2_decode_step(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], slots)
    assert cache.cursor.tolist() == [1, 1]
