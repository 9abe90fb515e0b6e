"""The NVFP4 encode against the reference (run under TRITON_INTERPRET=1 on the CPU): the E2M1
encoders (``e2m1_rn_code``, ``e2m1_sr_code``, integer bit operations on the scaled value) over
fp32 bit patterns that cover every exponent up to 16 with each top-four mantissa pattern, the
ties and their neighbours, both zeros, subnormals, infinities and NaNs, with and without the
NaN select; and ``nvfp4_row_encode`` (codes, scales, dequantized values) on tiles that take
its finite fast path and on tiles that each hold one value sending it to the full recipe.
Also runs compiled on a GPU (``TRITON_INTERPRET=0``)."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from replayssm_quant import formats as F
from replayssm_quant.kernels.core.codes import e2m1_rn_code, e2m1_sr_code, nvfp4_row_encode

DEV = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available() else "cpu"
NVFP4 = F.canonical_format("nvfp4")


@triton.jit
def _codes_kernel(t_ptr, r_ptr, out_ptr, N: tl.constexpr, SR: tl.constexpr,
                  FINITE: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    t = tl.load(t_ptr + i)
    if SR:
        code = e2m1_sr_code(t, tl.load(r_ptr + i), FINITE)
    else:
        code = e2m1_rn_code(t, FINITE)
    tl.store(out_ptr + i, code)


def _patterns() -> torch.Tensor:
    """fp32 bit patterns: biased exponents 0..131 (up to 16) and 255, each top-four mantissa
    pattern, low mantissa bits 0 (E2M1 ties and grid points), 1, all ones and one random;
    both signs; NaN payloads."""
    g = torch.Generator().manual_seed(11)
    exps = torch.cat([torch.arange(0, 132), torch.tensor([255])])
    hi = torch.arange(16)
    low = torch.tensor([0, 1, 0x7FFFF, int(torch.randint(2, 0x7FFFF, (1,), generator=g))])
    bits = (exps[:, None, None] << 23) | (hi[None, :, None] << 19) | low[None, None, :]
    bits = bits.flatten()
    bits = torch.cat([bits, bits | (1 << 31), torch.tensor([0x7FC00000, 0xFFC00001, 0x7F800001])])
    return (bits & 0xFFFFFFFF).to(torch.int64)


def _want_codes(t: torch.Tensor, rounding: str, r: torch.Tensor | None) -> torch.Tensor:
    v = F.round_elements(t, NVFP4, rounding, r)
    return F.encode_e2m1(torch.where(torch.isnan(v), torch.zeros_like(v), v)).to(torch.int32)


def _run_codes(t: torch.Tensor, r: torch.Tensor, sr: bool, finite: bool) -> torch.Tensor:
    block = 1024
    n = triton.cdiv(t.numel(), block) * block
    tp = torch.cat([t, torch.zeros(n - t.numel())]).to(DEV)
    rp = torch.cat([r, torch.zeros(n - r.numel(), dtype=r.dtype)]).to(torch.uint32).to(DEV)
    out = torch.full((n,), -1, dtype=torch.int32, device=DEV)
    _codes_kernel[(n // block,)](tp, rp, out, N=block, SR=sr, FINITE=finite)
    return out.cpu()[:t.numel()]


def _check(t, got, want):
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(hex(int(t[i].view(torch.int32)) & 0xFFFFFFFF), got[i].item(),
                               want[i].item()) for i in bad[:8]]


@pytest.mark.parametrize("finite", [False, True])
def test_e2m1_rn_code_over_bit_patterns(finite):
    """RN codes bit for bit, ties to even included; FINITE drops the NaN select, so there
    NaN inputs are left out (the row encode never passes one)."""
    bits = _patterns()
    t = _as_f32(bits)
    if finite:
        t = t[~torch.isnan(t)]
    r = torch.zeros(t.shape, dtype=torch.int64)
    _check(t, _run_codes(t, r, False, finite), _want_codes(t, "rn", None))


def _as_f32(bits: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the fp32 values with those bits."""
    return (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("finite", [False, True])
def test_e2m1_sr_code_over_bit_patterns(finite):
    """SR codes bit for bit: each pattern with the words 0 and 2^32 - 1, words on either side
    of its rounding threshold (``u == frac`` must not round up) and random words."""
    bits = _patterns()
    t = _as_f32(bits)
    if finite:
        t, bits = t[~torch.isnan(t)], bits[~torch.isnan(t)]
    a = t.abs().double()
    e = torch.clamp(torch.floor(torch.log2(torch.where(a > 0, a, 1.0))), 0, 127)
    frac = (a * torch.exp2(1 - e)) % 1.0  # exact in float64 for every pattern here
    thr = torch.clamp(torch.floor(frac * 2**24), 0, 2**24 - 1).to(torch.int64) << 8
    g = torch.Generator().manual_seed(12)
    words = [torch.zeros_like(bits), torch.full_like(bits, 0xFFFFFFFF), thr,
             torch.clamp(thr - 256, min=0), thr | 0xFF, torch.clamp(thr + 256, max=0xFFFFFFFF),
             torch.randint(0, 2**32, bits.shape, generator=g, dtype=torch.int64)]
    for r in words:
        _check(t, _run_codes(t, r, True, finite), _want_codes(t, "sr", r))


@triton.jit
def _row_encode_kernel(x_ptr, r_ptr, p_ptr, s_ptr, rs_ptr, d_ptr, BR: tl.constexpr,
                       N: tl.constexpr, SR: tl.constexpr):
    rows = tl.arange(0, BR)
    n = tl.arange(0, N)
    x = tl.load(x_ptr + rows[:, None] * N + n[None, :])
    r = tl.load(r_ptr + rows[:, None] * N + n[None, :])
    packed, s, rs, deq = nvfp4_row_encode(x, r, BR, N, SR)
    NB: tl.constexpr = N // 16
    blk = tl.arange(0, NB)
    tl.store(p_ptr + rows[:, None, None] * (N // 2) + blk[None, :, None] * 8
             + tl.arange(0, 8)[None, None, :], packed)
    tl.store(s_ptr + rows[:, None] * NB + blk[None, :], s)
    tl.store(rs_ptr + rows, rs)
    tl.store(d_ptr + rows[:, None] * N + n[None, :], deq)


_TILE_SPECIALS = {  # each sends a tile to the full recipe, except the last two (fast path)
    "nan": (1, 5, float("nan")), "inf": (2, 40, float("inf")), "-inf": (0, 17, -float("inf")),
    "tiny_row": (3, None, 2.0**-110), "subnormal_row": (4, None, 1e-44),
    "zero_row": (5, None, 0.0), "row_at_2^-106": (6, None, 2.0**-106),
}


def _same(a, b):
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("rounding", ["rn", "sr"])
@pytest.mark.parametrize("case", ["plain"] + list(_TILE_SPECIALS))
def test_nvfp4_row_encode_matches_reference(case, rounding):
    """Packed codes, E4M3 block scales, row scales and dequantized values against
    ``formats.quantize`` / ``dequantize`` on an (8, 64) tile: plain values with zeros, a
    negative zero and a wide spread of magnitudes (the fast path), and the same tile with
    one special: a NaN, an inf, a row whose largest value is below 2^-106 (the ``1 / eff`` of
    its zero block overflows) or subnormal, an all-zero row, a row at exactly 2^-106."""
    g = torch.Generator().manual_seed(13)
    BR, N = 8, 64
    x = torch.randn(BR, N, generator=g) * torch.exp2(torch.randint(-20, 20, (BR, 1), generator=g))
    x[:, 3] = 0.0
    x[1, 7] = -0.0
    x[2] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 8) * torch.tensor(
        [1.0, -1.0]).repeat_interleave(8).repeat(4)  # near E2M1 ties once scaled
    if case != "plain":
        row, col, v = _TILE_SPECIALS[case]
        if col is None:  # a zero block and a small one: their 1 / eff is the largest
            x[row] = x[row] / x[row].abs().amax() * v if v else 0.0
            x[row, 16:32] = 0.0
            x[row, 32:48] *= 2.0**-20
            x[row, 33] = -0.0
        else:
            x[row, col] = v
    r = torch.randint(0, 2**32, (BR, N), generator=g, dtype=torch.int64)
    q = F.quantize(x, "nvfp4", rounding, r if rounding == "sr" else None)
    packed = torch.empty(BR, N // 2, dtype=torch.uint8, device=DEV)
    s = torch.empty(BR, N // 16, device=DEV)
    rs = torch.empty(BR, device=DEV)
    deq = torch.empty(BR, N, device=DEV)
    _row_encode_kernel[(1,)](x.to(DEV), r.to(torch.uint32).to(DEV), packed, s, rs, deq, BR=BR,
                             N=N, SR=rounding == "sr")
    assert torch.equal(packed.cpu(), q.data)
    assert _same(s.cpu(), q.block_scale.float())
    assert _same(rs.cpu(), q.row_scale)
    want = F.dequantize(q)
    assert _same(deq.cpu(), want)
    assert bool((torch.signbit(deq.cpu()) == torch.signbit(want)).all())
