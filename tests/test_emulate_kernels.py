"""Emulator kernels (Triton, interpreted on the CPU) against the reference ``emulate``.

Kernel and reference compute the same arithmetic in a different float32 order (chunked
products, the UT transform for GDN's u), so round-to-nearest configs agree to float32 rounding
and narrow checkpoints agree element for element except where a value sits within rounding
noise of a grid boundary. Two effects are expected and bounded here:

* stochastic rounding uses the same random word on both sides, so a pre-rounding difference of
  one fp32 ulp flips an element with probability ~ulp/grid step; once flipped, an element feeds
  the next steps (GDN's ``S k`` spreads it along its row), so conventional fp16-sr diverges by a
  few percent of elements over a few hundred steps while outputs stay within 1e-4;
* an NVFP4 read copy made from an fp8 checkpoint sees many exact E2M1 ties, which a one-ulp
  change of the fp8 row scale decides either way: outputs differ by ~1e-2 there, the
  checkpoint does not.

The first window (before any fold) reads the quantized S0 on both sides and must match tightly.
"""

from __future__ import annotations

import pytest
import torch

from replayssm_quant.kernels import dispatch
from replayssm_quant.kernels.gdn.emulate import gdn_emulate
from replayssm_quant.kernels.mamba2.emulate import mamba2_emulate
from replayssm_quant.precision import PRESETS, parse_config
from replayssm_quant.ssm import gdn, mamba2
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# Interpreted Triton costs ~5 ms per conventional step, ~20 ms per SR step (Philox) and
# ~50 ms per window per program, so shapes stay tiny: two heads (one group), one row tile.
T_WINDOW = 155  # 9 full windows of 16 and 11 records left pending
T_CONV = 150  # conventional: the unrolled loop's 4-token groups and a tail of 2
T_CONV_SR = 50


def _case(kind: str, T: int, *, batch: int = 1, heads: int = 2, groups: int = 1,
          rows: int = 16, d: int = 32, seed: int = 0) -> tuple[torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    S0 = 0.3 * torch.randn(batch, heads, rows, d, generator=g)
    if kind == "mamba2":
        return S0, mamba2_inputs(batch, T, heads, rows, d, groups, generator=g)
    return S0, gdn_inputs(batch, T, heads, rows, d, groups, generator=g)


def _reference(kind: str, cfg, S0, inp: dict, **kw):
    return (mamba2 if kind == "mamba2" else gdn).emulate(cfg, S0, **inp, **kw)


def _kernel(kind: str, cfg, S0, inp: dict, **kw):
    return (mamba2_emulate if kind == "mamba2" else gdn_emulate)(cfg, S0, **inp, **kw)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _flips(s_ker: torch.Tensor, s_ref: torch.Tensor) -> float:
    """Fraction of state elements that differ by more than float32 noise (relative to their
    row): checkpoint elements that landed on another grid point."""
    rowmax = s_ref.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    return ((s_ker - s_ref).abs() > 1e-5 * rowmax).float().mean().item()


def _tolerance(cfg) -> tuple[float, float]:
    """(max output relative error, max fraction of differing state elements)."""
    if cfg.uses_sr:
        y_tol = 5e-2 if (cfg.read is not None and cfg.ckpt.name == "fp8e4m3") else 1e-3
        return y_tol, 0.1
    if cfg.ckpt.name == "fp32":
        return 1e-5, 0.0
    return 1e-3, 0.01  # RN narrow checkpoint: a value on a rounding boundary may flip


def _check(cfg, y, s, y_ref, s_ref) -> None:
    assert torch.isfinite(y).all() and torch.isfinite(s).all()
    first = slice(0, max(cfg.L - 1, 1))  # read the quantized S0 on both sides
    assert _rel(y[:, first], y_ref[:, first]) < 1e-5
    y_tol, flip_tol = _tolerance(cfg)
    assert _rel(y, y_ref) < y_tol, f"output rel err {_rel(y, y_ref):.2e}"
    if cfg.ckpt.name == "fp32":
        assert _rel(s, s_ref) < 1e-5
    assert _flips(s, s_ref) <= flip_tol, f"{_flips(s, s_ref):.3%} of state elements differ"


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name", list(PRESETS))
def test_matches_reference(kind: str, name: str) -> None:
    cfg = PRESETS[name]
    T = T_WINDOW if cfg.L > 1 else (T_CONV_SR if cfg.uses_sr else T_CONV)
    S0, inp = _case(kind, T)
    y_ref, s_ref = _reference(kind, cfg, S0, inp, layer=3, seed=5)
    y, s = _kernel(kind, cfg, S0, inp, layer=3, seed=5)
    assert y.shape == y_ref.shape and s.shape == s_ref.shape
    _check(cfg, y, s, y_ref, s_ref)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("name,T", [("nvfp4-read/fp16-sr", 37), ("fp16-sr", 9)])
def test_batch_rows_tiles_and_sequence_keys(kind: str, name: str, T: int) -> None:
    """Two sequences with explicit SR keys, four heads in two groups, and row tiles smaller
    than a head (two per head)."""
    cfg = PRESETS[name]
    rows = 16 if cfg.L == 1 else 32
    S0, inp = _case(kind, T, batch=2, heads=4, groups=2, rows=rows, seed=1)
    keys = torch.tensor([7, 0])
    block = {"block_p" if kind == "mamba2" else "block_v": rows // 2}
    y_ref, s_ref = _reference(kind, cfg, S0, inp, layer=2, seed=11, sequence=keys)
    y, s = _kernel(kind, cfg, S0, inp, layer=2, seed=11, sequence=keys, **block)
    _check(cfg, y, s, y_ref, s_ref)
    _, s_default = _reference(kind, cfg, S0, inp, layer=2, seed=11)
    assert _flips(s, s_default) > 0.2, "the SR sequence key must change the rounding"


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
@pytest.mark.parametrize("T", [0, 5, 16, 33])
def test_short_sequences(kind: str, T: int) -> None:
    """Empty, shorter than a window, exactly one window, two windows and one record."""
    cfg = PRESETS["nvfp4-read/fp32"]
    S0, inp = _case(kind, T, seed=2)
    y_ref, s_ref = _reference(kind, cfg, S0, inp)
    y, s = _kernel(kind, cfg, S0, inp)
    assert y.shape == y_ref.shape
    if T:
        assert _rel(y, y_ref) < 1e-5
    assert _rel(s, s_ref) < 1e-5


@pytest.mark.parametrize("name", ["nvfp4-read/fp16-sr", "shared-fp8"])
def test_gdn_segments_and_prefetch_change_nothing(monkeypatch, name: str) -> None:
    """GDN windows run in segments (records of one segment at a time, the checkpoint carried
    between launches) and may prefetch the next window: neither may change a bit. R k and R q
    may also come as one product (float32-rounding close). Segments of
    two windows over 71 tokens: two full segments, then the 7 pending records alone."""
    import replayssm_quant.kernels.gdn.emulate as emu

    cfg = PRESETS[name]
    S0, inp = _case("gdn", 71, seed=6)
    y1, s1 = gdn_emulate(cfg, S0, **inp, seed=9)
    LB = 16
    monkeypatch.setattr(emu, "_PREP_BYTES", 2 * 4 * (2 * LB * LB + 2 * LB) * 2)  # 2 heads
    y2, s2 = gdn_emulate(cfg, S0, **inp, seed=9)
    y3, s3 = gdn_emulate(cfg, S0, **inp, seed=9, prefetch=True)
    monkeypatch.setattr(emu, "_MERGE_RQ", False)  # R k and R q as two products
    y4, s4 = gdn_emulate(cfg, S0, **inp, seed=9)
    assert torch.equal(y1, y2) and torch.equal(s1, s2)
    assert torch.equal(y1, y3) and torch.equal(s1, s3)
    # one product or two: the same sums, in an order the matmul backend may block differently
    assert _rel(y4, y1) < 1e-6 and _flips(s4, s1) <= _tolerance(cfg)[1]
    y_ref, s_ref = _reference("gdn", cfg, S0, inp, seed=9)
    _check(cfg, y1, s1, y_ref, s_ref)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_act_dtype_and_no_initial_state(kind: str) -> None:
    """bf16 ring inputs (rounded on the way in, as the reference does) and S0 = None."""
    cfg = parse_config("ckpt=bf16:sr,read=fp8,L=8")
    _, inp = _case(kind, 29, seed=3)
    y_ref, s_ref = _reference(kind, cfg, None, inp, act_dtype=torch.bfloat16)
    y, s = _kernel(kind, cfg, None, inp, act_dtype=torch.bfloat16)
    _check(cfg, y, s, y_ref, s_ref)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_dispatch_keeps_cpu_on_the_reference(kind: str) -> None:
    cfg = PRESETS["nvfp4-read/fp8-sr"]
    S0, inp = _case(kind, 20, seed=4)
    ref = _reference(kind, cfg, S0, inp, seed=3)
    fn = dispatch.emulate_mamba2 if kind == "mamba2" else dispatch.emulate_gdn
    got = fn(cfg, S0, **inp, seed=3)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_dispatch_routes_device_tensors_to_the_kernels(monkeypatch) -> None:
    """With the device check forced, supported shapes run the kernels; d_k that is not a power
    of two, or L above the kernels' cap, run the reference."""
    import replayssm_quant.kernels.gdn.emulate as emu

    calls = []
    real = emu.gdn_emulate

    def spy(*a, **kw):
        calls.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(dispatch, "_use_triton", lambda t: True)
    monkeypatch.setattr(emu, "gdn_emulate", spy)
    S0, inp = _case("gdn", 3, seed=5)
    y, _ = dispatch.emulate_gdn(PRESETS["replay-fp32"], S0, **inp)
    assert len(calls) == 1 and _rel(y, _reference("gdn", PRESETS["replay-fp32"], S0, inp)[0]) < 1e-5
    dispatch.emulate_gdn("ckpt=fp32,read=bf16,L=48", S0, **inp)
    S0_odd, inp_odd = _case("gdn", 3, d=24, seed=5)
    dispatch.emulate_gdn(PRESETS["replay-fp32"], S0_odd, **inp_odd)
    assert len(calls) == 1


def test_rejects_bad_inputs() -> None:
    S0, inp = _case("gdn", 4)
    cfg = PRESETS["replay-fp32"]
    with pytest.raises(ValueError, match="g has dtype"):
        gdn_emulate(cfg, S0, **(inp | {"g": inp["g"].half()}))
    with pytest.raises(ValueError, match="power of two"):
        q, k = (torch.randn(1, 4, 1, 24) for _ in range(2))
        gdn_emulate(cfg, None, q, k, inp["v"], inp["g"], inp["beta"])
    with pytest.raises(ValueError, match="L <= 32"):
        gdn_emulate("ckpt=fp32,read=nvfp4,L=48", S0, **inp)
    with pytest.raises(ValueError, match="sr_sequence"):
        gdn_emulate(cfg, S0, **inp, sequence=torch.tensor([1, 2]))
    S0m, inpm = _case("mamba2", 4)
    with pytest.raises(ValueError, match="S0 has shape"):
        mamba2_emulate(cfg, S0m[:, :1], **inpm)
    with pytest.raises(ValueError, match="dt has dtype"):
        mamba2_emulate(cfg, S0m, **(inpm | {"dt": inpm["dt"].double()}))


@pytest.mark.parametrize("name", ["fp32", "fp16-sr", "bf16-sr"])
@pytest.mark.parametrize("T", [0, 1, 2, 3, 6, 13])
def test_gdn_conventional_short_sequences(name: str, T: int) -> None:
    """The conventional GDN scan runs four tokens per iteration: empty, single-token and odd
    sequences (the initial rounding alone for T = 0) match the reference."""
    cfg = PRESETS[name]
    S0, inp = _case("gdn", T)
    y_ref, s_ref = _reference("gdn", cfg, S0, inp, layer=1, seed=3)
    y, s = _kernel("gdn", cfg, S0, inp, layer=1, seed=3)
    assert y.shape == y_ref.shape and s.shape == s_ref.shape
    _check(cfg, y, s, y_ref, s_ref)
