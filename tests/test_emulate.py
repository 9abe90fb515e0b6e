"""emulate() is decode_step, token by token, bit for bit, for every preset; SR runs are keyed
by (seed, layer, sequence, flush index)."""

from __future__ import annotations

import pytest
import torch

from replayssm_quant.precision import PRESETS
from replayssm_quant.ssm import gdn, init_gdn_state, init_mamba2_state, load_state, mamba2
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


B, T = 2, 512
M2 = dict(num_heads=4, head_dim=8, d_state=32, n_groups=2)
GD = dict(num_v_heads=4, head_v_dim=8, head_k_dim=32, num_k_heads=2)
SR_PRESETS = [n for n, c in PRESETS.items() if c.uses_sr]


def data(kind: str, steps: int = T, seed: int = 0) -> tuple[torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    if kind == "mamba2":
        return torch.randn(B, 4, 8, 32, generator=g), mamba2_inputs(B, steps, *M2.values(),
                                                                    generator=g)
    return 0.5 * torch.randn(B, 4, 8, 32, generator=g), gdn_inputs(B, steps, *GD.values(),
                                                                   generator=g)


def decode_loop(kind: str, cfg, S0, inp, *, layer=0, seed=0, sr_sequence=None):
    """The serving path: a state, load_state, then one decode_step per token."""
    slots = torch.arange(B)
    if kind == "mamba2":
        st = init_mamba2_state(cfg, B, *M2.values(), layer=layer, seed=seed,
                               sr_sequence=sr_sequence)
    else:
        st = init_gdn_state(cfg, B, *GD.values(), layer=layer, seed=seed,
                            sr_sequence=sr_sequence)
    load_state(st, slots, S0)
    ys = []
    for t in range(inp["dt" if kind == "mamba2" else "g"].shape[1]):
        if kind == "mamba2":
            ys.append(mamba2.decode_step(st, inp["x"][:, t], inp["dt"][:, t], inp["A"],
                                         inp["Bm"][:, t], inp["C"][:, t], inp["D"], slots))
        else:
            ys.append(gdn.decode_step(st, *(inp[n][:, t] for n in ("q", "k", "v", "g", "beta")),
                                      slots))
    final = mamba2.state_value(st, inp["A"]) if kind == "mamba2" else gdn.state_value(st)
    return torch.stack(ys, 1), final


def emulate(kind: str, cfg, S0, inp, **kw):
    return (mamba2 if kind == "mamba2" else gdn).emulate(cfg, S0, **inp, **kw)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", list(PRESETS))
def test_emulate_is_decode_step_bitwise(kind: str, name: str) -> None:
    cfg = PRESETS[name]
    S0, inp = data(kind)
    y_e, s_e = emulate(kind, cfg, S0, inp, layer=3, seed=5)
    y_d, s_d = decode_loop(kind, cfg, S0, inp, layer=3, seed=5)
    assert torch.equal(y_e, y_d)
    assert torch.equal(s_e, s_d)
    assert torch.isfinite(y_e).all()


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", SR_PRESETS)
def test_sr_seeds(kind: str, name: str) -> None:
    cfg = PRESETS[name]
    S0, inp = data(kind, steps=48, seed=1)
    a = emulate(kind, cfg, S0, inp, seed=1)
    b = emulate(kind, cfg, S0, inp, seed=1)
    c = emulate(kind, cfg, S0, inp, seed=2)
    d = emulate(kind, cfg, S0, inp, seed=1, layer=1)
    e = emulate(kind, cfg, S0, inp, seed=1, sequence=torch.tensor([7, 9]))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for other in (c, d, e):
        assert not torch.equal(a[0], other[0])
    # the sequence key is the slot's sr_sequence entry
    f = decode_loop(kind, cfg, S0, inp, seed=1, sr_sequence=torch.tensor([7, 9]))
    assert torch.equal(e[0], f[0]) and torch.equal(e[1], f[1])


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_rn_ignores_seed(kind: str) -> None:
    cfg = PRESETS["shared-nvfp4"]
    S0, inp = data(kind, steps=40, seed=2)
    a = emulate(kind, cfg, S0, inp, seed=1)
    b = emulate(kind, cfg, S0, inp, seed=2, layer=4, sequence=torch.tensor([3, 1]))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_emulate_act_dtype_rounds_the_ring_inputs(kind: str) -> None:
    cfg = PRESETS["nvfp4-read/fp32"]
    S0, inp = data(kind, steps=40, seed=3)
    y16, _ = emulate(kind, cfg, S0, inp, act_dtype=torch.bfloat16)
    rounded = dict(inp)
    for n in ("x", "Bm", "k", "v"):
        if n in rounded:
            rounded[n] = inp[n].bfloat16()
    y_b, _ = emulate(kind, cfg, S0, rounded, act_dtype=torch.bfloat16)
    assert torch.equal(y16, y_b)
    y32, _ = emulate(kind, cfg, S0, inp)
    assert not torch.equal(y16, y32)
    torch.testing.assert_close(y16, y32, rtol=0.1, atol=0.1)
