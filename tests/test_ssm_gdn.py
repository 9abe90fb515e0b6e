"""GDN ReplaySSM reference: accuracy against the float64 delta rule, step equivalences, the
flush's u recomputation, NaN propagation and input validation."""

from __future__ import annotations

import pytest
import torch

from replayssm_quant.precision import PRESETS, parse_config
from replayssm_quant.ssm import gdn, init_gdn_state, load_state, read_checkpoint
from replayssm_quant.ssm.synthetic import gdn_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max over sequences of ||y - ref|| / ||ref||."""
    d = (y.double() - ref.double()).flatten(1).norm(dim=1)
    return float((d / ref.double().flatten(1).norm(dim=1)).max())


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def new_state(cfg, num_slots=2, Hv=4, V=16, K=32, Hk=2, **kw):
    return init_gdn_state(parse_config(cfg), num_slots, Hv, V, K, Hk, **kw)


def step_args(inp: dict, t: int) -> tuple:
    return tuple(inp[n][:, t] for n in ("q", "k", "v", "g", "beta"))


SHAPES = [  # (batch, Hv, V, K, Hk)
    (2, 4, 16, 32, 2),
    (3, 2, 8, 16, 1),
]


@pytest.mark.parametrize("L", [1, 4, 8, 16, 32])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_fp32_replay_matches_float64_recurrence(L: int, shape: int) -> None:
    B, Hv, V, K, Hk = SHAPES[shape]
    g = gen(100 * L + shape)
    inp = gdn_inputs(B, 2000, Hv, V, K, Hk, generator=g)
    S0 = 0.3 * torch.randn(B, Hv, V, K, generator=g)
    cfg = parse_config(f"ckpt=fp32,read=none,L={L}")
    o, S = gdn.emulate(cfg, S0, **inp)
    o_ref, S_ref = gdn.sequential_reference(S0, **inp)
    assert rel_err(o, o_ref) <= 1e-5
    assert rel_err(S, S_ref) <= 1e-5


def test_short_sequence_with_pending_records() -> None:
    inp = gdn_inputs(2, 37, 4, 16, 32, 2, generator=gen(1))
    o, S = gdn.emulate("ckpt=fp32,read=none,L=16", None, **inp)
    o_ref, S_ref = gdn.sequential_reference(None, **inp)
    assert rel_err(o, o_ref) <= 1e-5 and rel_err(S, S_ref) <= 1e-5


@pytest.mark.parametrize("name", [n for n, c in PRESETS.items() if c.L == 1])
def test_decode_step_l1_is_conventional_step_bitwise(name: str) -> None:
    cfg = PRESETS[name]
    inp = gdn_inputs(3, 40, 4, 16, 32, 2, generator=gen(2))
    S0 = 0.3 * torch.randn(3, 4, 16, 32, generator=gen(3))
    a, b = (new_state(cfg, num_slots=4, seed=7) for _ in range(2))
    slots = torch.tensor([2, 0, 3])
    for st in (a, b):
        load_state(st, slots, S0)
    batch_slots = torch.tensor([2, -1, 3])
    for t in range(40):
        oa = gdn.decode_step(a, *step_args(inp, t), batch_slots)
        ob = gdn.conventional_step(b, *step_args(inp, t), batch_slots)
        assert torch.equal(oa, ob)
        assert not oa[1].any()
    assert torch.equal(a.ckpt.data, b.ckpt.data)
    # the flush index is the SR key: only an SR checkpoint counts its writes
    assert a.flush_index.tolist() == ([0, 0, 40, 40] if cfg.uses_sr else [0] * 4)


def test_explicit_nonflush_and_flush_equal_decode_step() -> None:
    L = 4
    cfg = parse_config(f"ckpt=fp16:sr,read=nvfp4,L={L}")
    inp = gdn_inputs(2, 3 * L, 4, 16, 32, 2, generator=gen(4))
    a, b = new_state(cfg, seed=3), new_state(cfg, seed=3)
    slots = torch.arange(2)
    S0 = 0.3 * torch.randn(2, 4, 16, 32, generator=gen(5))
    load_state(a, slots, S0)
    load_state(b, slots, S0)
    for t in range(3 * L):
        fn = gdn.flush if t % L == L - 1 else gdn.nonflush_step
        assert torch.equal(gdn.decode_step(a, *step_args(inp, t), slots),
                           fn(b, *step_args(inp, t), slots))
    assert torch.equal(a.ckpt.data, b.ckpt.data) and torch.equal(a.read.data, b.read.data)
    assert a.flush_index.tolist() == [3, 3]
    with pytest.raises(ValueError, match="flush position"):
        gdn.flush(b, *step_args(inp, 0), slots)


def test_flush_recomputes_u_from_the_checkpoint() -> None:
    """With a narrow read copy, the checkpoint after a flush is the exact fold from the
    checkpoint, not the fold of the u's the non-flush steps computed from the read copy."""
    L = 8
    cfg = parse_config(f"ckpt=fp32,read=nvfp4,L={L}")
    assert cfg.recompute_u
    inp = gdn_inputs(2, L, 4, 16, 32, 2, decay_range=(0.99, 0.9999), generator=gen(6))
    S0 = torch.randn(2, 4, 16, 32, generator=gen(7))
    st = new_state(cfg)
    slots = torch.arange(2)
    load_state(st, slots, S0)
    S_c = read_checkpoint(st, slots).double()
    for t in range(L - 1):
        gdn.decode_step(st, *step_args(inp, t), slots)
    u_read = st.u[:, :, : L - 1].double()  # u's computed from the read copy
    o_flush = gdn.decode_step(st, *step_args(inp, L - 1), slots)
    ckpt = read_checkpoint(st, slots).double()
    one = {n: v for n, v in inp.items()}
    o_exact, S_exact = gdn.sequential_reference(S_c, **one)
    assert rel_err(ckpt, S_exact) <= 1e-5
    assert rel_err(o_flush, o_exact[:, -1]) <= 1e-5
    # the stale alternative: fold the read-copy u's (and continue the delta rule with them)
    k = inp["k"].double().repeat_interleave(2, dim=2)
    S = S_c.clone()
    for j in range(L):
        a = torch.exp(inp["g"][:, j].double())[..., None, None]
        if j < L - 1:
            u = u_read[:, :, j]
        else:
            sk = (S @ k[:, j, ..., None]).squeeze(-1)
            u = inp["beta"][:, j].double()[..., None] * (inp["v"][:, j].double() - a[..., 0] * sk)
        S = a * S + u[..., None] * k[:, j, :, None, :]
    assert rel_err(S, S_exact) > 1e-3  # the test can tell the two apart


@pytest.mark.parametrize("cfg", ["ckpt=fp32,read=none,L=4", "shared-nvfp4", "nvfp4-read/fp8-sr",
                                 "bf16-sr"])
def test_nan_is_counted_and_propagates(cfg: str) -> None:
    cfg = parse_config(cfg)
    T = 2 * cfg.L + 3
    inp = gdn_inputs(2, T, 4, 16, 32, 2, generator=gen(8))
    inp["v"][0, 2, 1, 5] = float("nan")
    st = new_state(cfg)
    slots = torch.arange(2)
    load_state(st, slots, torch.zeros(2, 4, 16, 32))
    os_ = torch.stack([gdn.decode_step(st, *step_args(inp, t), slots) for t in range(T)], 1)
    assert torch.isnan(os_[0, 2:, 1, 5]).all()
    assert torch.isfinite(os_[1]).all()
    assert torch.isfinite(os_[0, :, 0]).all()
    assert int(st.nan_count) > 0
    assert torch.isnan(gdn.state_value(st)[0, 1, 5]).all()


def test_nan_in_a_rejected_draft_does_not_leak() -> None:
    cfg = parse_config("ckpt=fp32,read=nvfp4,L=4")
    inp = gdn_inputs(1, 6, 4, 16, 32, 2, generator=gen(10))
    st = new_state(cfg, num_slots=1, spec_tokens=2)
    slots = torch.arange(1)
    load_state(st, slots, torch.randn(1, 4, 16, 32, generator=gen(11)))
    bad = {n: t.clone() for n, t in inp.items()}
    bad["k"][0, 1] = float("nan")
    o = gdn.verify(st, *(bad[n][:, :2] for n in ("q", "k", "v", "g", "beta")), slots)
    assert torch.isfinite(o[:, 0]).all() and torch.isnan(o[:, 1]).any()
    gdn.commit(st, torch.tensor([1]), slots)
    for t in range(1, 6):
        assert torch.isfinite(gdn.decode_step(st, *step_args(inp, t), slots)).all()
    assert int(st.nan_count) == 0


def test_errors() -> None:
    cfg = parse_config("ckpt=fp32,read=none,L=4")
    with pytest.raises(ValueError, match="multiple of num_k_heads"):
        init_gdn_state(cfg, 2, 6, 16, 32, 4)
    with pytest.raises(ValueError, match="multiple of 32"):
        init_gdn_state("nvfp4-read/fp32", 2, 4, 16, 48, 2)
    with pytest.raises(ValueError, match="spec_tokens"):
        init_gdn_state(cfg, 2, 4, 16, 32, 2, spec_tokens=-1)
    st = new_state(cfg, num_slots=3, spec_tokens=1)
    inp = gdn_inputs(2, 4, 4, 16, 32, 2, generator=gen(9))
    q, k, v, g, beta = step_args(inp, 0)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="q has shape"):
        gdn.decode_step(st, q, k, v, g, beta, torch.tensor([0]))
    with pytest.raises(ValueError, match="out of range"):
        gdn.decode_step(st, q, k, v, g, beta, torch.tensor([5, 0]))
    with pytest.raises(ValueError, match="more than once"):
        gdn.decode_step(st, q, k, v, g, beta, torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="k has shape"):  # K differs
        gdn.decode_step(st, q, k[..., :16], v, g, beta, slots)
    with pytest.raises(ValueError, match="v has shape"):  # Hv differs
        gdn.decode_step(st, q, k, v[:, :2], g, beta, slots)
    with pytest.raises(ValueError, match="beta has dtype"):
        gdn.decode_step(st, q, k, v, g, beta.double(), slots)
    with pytest.raises(ValueError, match="g has dtype"):
        gdn.decode_step(st, q, k, v, g.bfloat16(), beta, slots)
    with pytest.raises(ValueError, match="v has dtype"):
        gdn.decode_step(st, q, k, v.to(torch.int32), g, beta, slots)
    with pytest.raises(ValueError, match="L=1"):
        gdn.conventional_step(st, q, k, v, g, beta, slots)
    blk = tuple(inp[n][:, :3] for n in ("q", "k", "v", "g", "beta"))
    for _ in range(3):
        gdn.decode_step(st, q, k, v, g, beta, slots)  # cursor 3: 3 + 3 > 5
    with pytest.raises(ValueError, match="capacity"):
        gdn.verify(st, *blk, slots)
    with pytest.raises(ValueError, match="accepted"):
        gdn.commit(st, torch.tensor([1, 0]), slots)  # nothing was drafted
    with pytest.raises(ValueError, match="accepted"):
        gdn.commit(st, torch.tensor([0.0, 0.0]), slots)
    with pytest.raises(ValueError, match="S has shape"):
        gdn.emulate(cfg, torch.zeros(2, 4, 16, 31), **inp)
