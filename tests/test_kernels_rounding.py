"""Kernel rounding device functions against the reference rounding of ``formats`` (run under
TRITON_INTERPRET=1 on the CPU): every element bit for bit, with exact ties, subnormals,
saturation, infinities and NaN in the inputs. The element-rounding tests also run compiled on
a GPU (``TRITON_INTERPRET=0 pytest tests/test_kernels_rounding.py -k round``), where some
roundings take hardware conversions the interpreter does not model."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from replayssm_quant import formats as F
from replayssm_quant.kernels.core.codes import e2m1_rn_code
from replayssm_quant.kernels.core.products import rows_dot
from replayssm_quant.kernels.core.rounding import philox, round_grid_rn_value, round_to
from replayssm_quant.kernels.core.state_io import count_nans, split_dot

N = 4096
# compiled kernels need device tensors; the interpreter runs on the CPU
DEV = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available() else "cpu"


def _round(x: torch.Tensor, r: torch.Tensor, code: int, sr: bool, tile: int,
           wide: bool = True) -> torch.Tensor:
    """``round_to`` over x in tiles of ``tile`` (NaN-poisoned output), on DEV, back on the CPU."""
    out = torch.full((N,), float("nan"), device=DEV)
    _round_kernel[(1,)](x.to(DEV), r.to(DEV), out, FMT=code, SR=sr, N=N, TILE=tile, WIDE=wide)
    return out.cpu()


@triton.jit
def _round_kernel(x_ptr, r_ptr, out_ptr, FMT: tl.constexpr, SR: tl.constexpr,
                  N: tl.constexpr, TILE: tl.constexpr, WIDE: tl.constexpr = True):
    for t in tl.static_range(N // TILE):
        i = t * TILE + tl.arange(0, TILE)
        tl.store(out_ptr + i, round_to(tl.load(x_ptr + i), tl.load(r_ptr + i), FMT, SR, WIDE))


@triton.jit
def _rn_value_kernel(x_ptr, out_ptr, MANT: tl.constexpr, EMIN: tl.constexpr,
                     MAXF: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, round_grid_rn_value(tl.load(x_ptr + i), MANT, EMIN, MAXF))


@triton.jit
def _philox_kernel(c_ptr, out_ptr, seed, N: tl.constexpr):
    i = tl.arange(0, N)
    c = [tl.load(c_ptr + k * N + i) for k in tl.static_range(4)]
    r0, r1, r2, r3 = philox(seed, c[0], c[1], c[2], c[3])
    tl.store(out_ptr + i, r0)
    tl.store(out_ptr + N + i, r1)
    tl.store(out_ptr + 2 * N + i, r2)
    tl.store(out_ptr + 3 * N + i, r3)


@pytest.mark.parametrize("seed", [0, 1234567, 2**31 - 1])
def test_philox_matches_reference_stream(seed):
    """The kernels' Philox (wide products) equals the reference generator word for word."""
    g = torch.Generator().manual_seed(seed % 1000)
    c = torch.randint(0, 2**32, (4, 256), generator=g, dtype=torch.int64)
    c[:, :4] = torch.tensor([0, 2**32 - 1, 1, 2**31]).view(1, 4)
    out = torch.full((4, 256), -1, dtype=torch.int64).to(torch.uint32)
    _philox_kernel[(1,)](c.to(torch.uint32), out, seed, N=256)
    ref = torch.stack(F.philox4x32(c[0], c[1], c[2], c[3], seed))
    assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, ref)


def _inputs(seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(N, generator=g) * 2 - 1) * torch.exp2(
        torch.randint(-30, 18, (N,), generator=g).float())
    x[:512] = torch.randint(-64, 64, (512,), generator=g).float() * 0.25  # E2M1 ties
    x[512:1024] = torch.randint(-2**14, 2**14, (512,), generator=g).float() * 2.0**-25
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0,
                             65520.0, 65536.0, 1e30, 2.0**-130, 2.0**-149, 448.0, 464.0, 6.0,
                             7.0, 5.0])
    x[1024:1024 + len(specials)] = specials
    x = x * scale
    r = torch.randint(0, 2**32, (N,), generator=g, dtype=torch.int64).to(torch.uint32)
    r[:64] = 0
    r[64:128] = 2**32 - 1
    return x, r


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("name,code,wide", [("fp16", 1, True), ("fp16", 1, False), ("bf16", 2, True),
                                            ("fp8e4m3", 3, True)])
@pytest.mark.parametrize("rounding", ["rn", "sr"])
@pytest.mark.parametrize("seed", [0, 1])
def test_round_to_matches_reference_bits(name, code, wide, rounding, seed):
    """Every path against the reference, with 32-bit words and (SR) with the 8-bit words of
    fp16 / bf16 targets (a byte on top, bit 23 set), whose integer forms take them as is."""
    x, r = _inputs(seed)
    words = [r, (r & 0xFF000000) | 0x800000] if rounding == "sr" else [r]
    for w in words:
        out = _round(x, w, code, rounding == "sr", 512, wide)
        ref = F.round_elements(x, F.FORMATS[name], rounding, w if rounding == "sr" else None)
        assert _same(out, ref)
        assert bool((torch.signbit(out) == torch.signbit(ref)).all())


_FAST_PATH_SPECIALS = {  # one per tile: values outside (or at the edges of) the integer forms
    "fp16": [0.0, 3e-6, -2.0**-20, 70000.0, -65535.0, 3.3e38, -3.39e38, float("inf"),
             -float("inf"), float("nan")],
    "bf16": [0.0, 3e-6, -2.0**-20, 70000.0, -65535.0, 3.3e38, -3.39e38, float("inf"),
             -float("inf"), float("nan")],
    "fp8e4m3": [0.0, -0.0, 2.0**-9, -3e-3, 1e-3, -2.0**-10, 460.0, -1e30, 3.4e38, float("inf"),
                -float("inf"), float("nan"), 2.0**-149],
}


@pytest.mark.parametrize("name,code,wide", [("fp16", 1, True), ("fp16", 1, False), ("bf16", 2, True),
                                            ("fp8e4m3", 3, True)])
def test_sr_fast_and_full_tile_paths(name, code, wide):
    """fp16 / bf16 / fp8 SR round a tile in a few integer instructions when all its values
    are in the plain range and run the full recipe otherwise: tiles of plain values only, and
    tiles that each hold one value of another kind (zero, a value below the format's smallest
    step or normal, above its maximum, near the fp32 maximum, inf, NaN), every element
    against the reference."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, generator=g) * 0.1 + 0.5
    x[256:512] *= -1.0
    specials = _FAST_PATH_SPECIALS[name]
    r = torch.randint(0, 2**32, (N,), generator=g, dtype=torch.int64).to(torch.uint32)
    for i, v in enumerate(specials):  # tiles 1.. of 256 hold one special each
        x[256 * (i + 1) + 17 * i] = v
        r[256 * (i + 1) + 17 * i] = 0  # u = 0: rounds up wherever it can
    out = _round(x, r, code, True, 256, wide)
    ref = F.round_elements(x, F.FORMATS[name], "sr", r)
    assert _same(out, ref)
    assert bool((torch.signbit(out) == torch.signbit(ref)).all())


@pytest.mark.parametrize("name,mant,emin,maxf", [("e2m1", 1, 0, 6.0), ("fp8e4m3", 3, -6, 448.0),
                                                 ("fp16", 10, -14, 65504.0)])
@pytest.mark.parametrize("scale", [1.0, 64.0, 2.0**-8])
def test_rn_value_equals_reference_values(name, mant, emin, maxf, scale):
    x, _ = _inputs(7, scale)
    out = torch.full((N,), -1.0)
    _rn_value_kernel[(1,)](x, out, MANT=mant, EMIN=emin, MAXF=maxf, N=N)
    fmt = F.FORMATS["fp8e4m3"] if name == "fp8e4m3" else F.FORMATS["fp16"]
    if name == "e2m1":
        ref = F.round_elements(x, F.canonical_format("nvfp4"), "rn")
    else:
        ref = F.round_elements(x, fmt, "rn")
    assert _same(out, ref)  # equal values (a zero's sign is not kept)


def test_row_scales_are_correctly_rounded_divisions():
    """Scale divisions are IEEE divisions on every device (torch's CUDA division by a Python
    scalar multiplies by the reciprocal instead, one ulp off for about a fifth of values)."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(64, 32, generator=g) * torch.exp2(torch.randint(-20, 10, (64, 1), generator=g))
    amax = x.abs().amax(-1)
    q = F.quantize(x, "nvfp4")
    exact = (amax.double() / F.NVFP4_ROW_DIVISOR).float()
    assert torch.equal(q.row_scale, exact)
    q8 = F.quantize(x, "fp8e4m3")
    assert torch.equal(q8.row_scale, (amax.double() / 448.0).float())


@triton.jit
def _rows_dot_kernel(p_ptr, rs_ptr, bs_ptr, va_ptr, vb_ptr, ya_ptr, yb_ptr,
                     BR: tl.constexpr, N: tl.constexpr):
    rows = tl.arange(0, BR)
    ya, yb = rows_dot(p_ptr, rs_ptr, bs_ptr, rows, rows < BR, va_ptr, vb_ptr, va_ptr,
                      4, BR, N, True, False)
    tl.store(ya_ptr + rows, ya)
    tl.store(yb_ptr + rows, yb)


@pytest.mark.parametrize("vec_scale", [1.0, 3e30, 1e-30, 2.0 ** -140, 0.0, "inf", "nan"])
def test_nvfp4_rows_dot_matches_float64(vec_scale):
    """The NVFP4 row dot decodes E2M1 codes as value * 2^-126 and scales the vector by a power
    of two instead (``pow2_prescale``): over the whole float range of the vector (huge, tiny,
    subnormal, zero, with inf or NaN) it must equal the float64 dot of the dequantized rows
    up to float32 rounding, and propagate inf / NaN like the dequantized product."""
    g = torch.Generator().manual_seed(7)
    BR, n = 8, 64
    x = torch.randn(BR, n, generator=g) * torch.logspace(-3, 3, BR)[:, None]
    q = F.quantize(x, "nvfp4")
    S = F.dequantize(q).double()
    va = torch.randn(n, generator=g)
    vb = torch.randn(n, generator=g) * 1e3
    if isinstance(vec_scale, str):
        va[5] = float(vec_scale)
    else:
        va = va * vec_scale
    ya, yb = (torch.full((BR,), -7.0) for _ in range(2))  # poisoned
    _rows_dot_kernel[(1,)](q.data.contiguous(), q.row_scale.contiguous(),
                           q.block_scale.contiguous(), va, vb, ya, yb, BR=BR, N=n)
    for y, v in ((ya, va), (yb, vb)):
        want = S @ v.double()
        fin = torch.isfinite(want)
        assert torch.equal(torch.isnan(y), torch.isnan(want))
        assert torch.equal(y[~fin & ~torch.isnan(want)], want[~fin & ~torch.isnan(want)].float())
        mag = (S.abs() @ v.double().abs())[fin]
        # a vector of subnormals: products are rounded at the subnormal spacing 2^-149 before
        # the block and row scales (and the prescale's 2^1) multiply them
        eff = (q.block_scale.double() * q.row_scale.double()[:, None]).amax(1)[fin]
        tol = 1e-6 * mag + n * 2.0 ** -148 * eff + 4 * 2.0 ** -149  # + the output's own spacing
        assert ((y[fin].double() - want[fin]).abs() <= tol).all(), (y, want)


@triton.jit
def _rows_dot_one_kernel(p_ptr, rs_ptr, bs_ptr, va_ptr, ya_ptr, BR: tl.constexpr, N: tl.constexpr,
                         E4M3: tl.constexpr):
    rows = tl.arange(0, BR)
    ya, _ = rows_dot(p_ptr, rs_ptr, bs_ptr, rows, rows < BR, va_ptr, va_ptr, va_ptr,
                     4, BR, N, False, False, E4M3=E4M3)
    tl.store(ya_ptr + rows, ya)


@pytest.mark.parametrize("e4m3", [True, False])
@pytest.mark.parametrize("vec_scale", [1.0, 3e30, 1e-30, 2.0 ** -140, 0.0, "inf", "nan"])
def test_nvfp4_rows_dot_one_vector_matches_float64(vec_scale, e4m3):
    """The one-vector NVFP4 row dot of the Mamba-2 non-flush step, both decodes (through E4M3
    bytes, ``e2m1_words_fp16``, and fp32 bit patterns): the float64 dot of the dequantized
    rows up to float32 rounding over the vector's whole float range, inf / NaN propagated."""
    g = torch.Generator().manual_seed(11)
    BR, n = 8, 64
    x = torch.randn(BR, n, generator=g) * torch.logspace(-3, 3, BR)[:, None]
    x[0, :16] = torch.tensor([*F.E2M1_VALUES, *(-v for v in F.E2M1_VALUES)])  # every code
    q = F.quantize(x, "nvfp4")
    S = F.dequantize(q).double()
    va = torch.randn(n, generator=g)
    if isinstance(vec_scale, str):
        va[5] = float(vec_scale)
    else:
        va = va * vec_scale
    y = torch.full((BR,), -7.0)  # poisoned
    _rows_dot_one_kernel[(1,)](q.data.contiguous(), q.row_scale.contiguous(),
                               q.block_scale.contiguous(), va, y, BR=BR, N=n, E4M3=e4m3)
    want = S @ va.double()
    fin = torch.isfinite(want)
    assert torch.equal(torch.isnan(y), torch.isnan(want))
    assert torch.equal(y[~fin & ~torch.isnan(want)], want[~fin & ~torch.isnan(want)].float())
    mag = (S.abs() @ va.double().abs())[fin]
    eff = (q.block_scale.double() * q.row_scale.double()[:, None]).amax(1)[fin]
    tol = 1e-6 * mag + n * 2.0 ** -148 * eff + 4 * 2.0 ** -149
    assert ((y[fin].double() - want[fin]).abs() <= tol).all(), (y, want)


@triton.jit
def _rows_dot_fp32_kernel(s_ptr, va_ptr, vb_ptr, ya_ptr, yb_ptr, nrows,
                          BR: tl.constexpr, N: tl.constexpr):
    rows = tl.arange(0, BR)
    ya, yb = rows_dot(s_ptr, s_ptr, s_ptr, rows, rows < nrows, va_ptr, vb_ptr, va_ptr,
                      0, BR, N, True, False)
    tl.store(ya_ptr + rows, ya)
    tl.store(yb_ptr + rows, yb)


@pytest.mark.parametrize("BR,n", [(8, 128), (32, 128), (4, 64)])
def test_fp32_rows_dot_matches_float64(BR, n):
    """Both row products of fp32 state rows (the FP32 non-flush step's two mat-vecs) against
    float64: masked rows read zeros, NaN and inf propagate."""
    g = torch.Generator().manual_seed(3)
    S = torch.randn(BR, n, generator=g) * torch.logspace(-2, 2, BR)[:, None]
    S[1, n - 3] = float("nan")
    S[2, 5] = float("inf")
    va, vb = torch.randn(n, generator=g), torch.randn(n, generator=g)
    ya, yb = (torch.full((BR,), -7.0) for _ in range(2))  # poisoned
    live = BR - 1  # the last row is masked
    _rows_dot_fp32_kernel[(1,)](S, va, vb, ya, yb, live, BR=BR, N=n)
    for y, v in ((ya, va), (yb, vb)):
        want = S.double() @ v.double()
        want[live:] = 0.0
        assert torch.equal(torch.isnan(y), torch.isnan(want))
        fin = torch.isfinite(want)
        assert torch.equal(y[~fin & ~torch.isnan(want)], want[~fin & ~torch.isnan(want)].float())
        mag = S.double().abs() @ v.double().abs()
        mag[live:] = 0.0
        assert ((y[fin].double() - want[fin]).abs() <= 1e-6 * mag[fin] + 1e-30).all()


@triton.jit
def _e2m1_code_kernel(t_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, e2m1_rn_code(tl.load(t_ptr + i)))


def test_e2m1_rn_code_matches_reference_codes():
    """The direct RN E2M1 encoder against the reference (round onto the grid, NaN -> 0,
    encode): every tie, both neighbours of each tie, both zeros, subnormals, saturation,
    infinities, NaN and random values."""
    grid = torch.tensor(F.E2M1_VALUES)
    mids = (grid[1:] + grid[:-1]) / 2
    edge = torch.cat([grid, mids, torch.nextafter(mids, torch.zeros_like(mids)),
                      torch.nextafter(mids, torch.full_like(mids, 10.0)),
                      torch.tensor([0.0, 1e-45, 1e-40, 5.9999, 6.0001, 7.0, 8.0, 1e30,
                                    float("inf"), float("nan")])])
    g = torch.Generator().manual_seed(3)
    t = torch.cat([edge, -edge, torch.randn(4096, generator=g) * 3,
                   torch.rand(1024, generator=g) * 1.2])
    n = triton.next_power_of_2(t.numel())
    t = torch.cat([t, torch.zeros(n - t.numel())])
    out = torch.full((n,), -1, dtype=torch.int32)
    _e2m1_code_kernel[(1,)](t, out, N=n)
    v = F.round_elements(t, F.canonical_format("nvfp4"), "rn")
    v = torch.where(torch.isnan(v), torch.zeros_like(v), v)
    want = F.encode_e2m1(v).to(torch.int32)
    bad = (out != want).nonzero().flatten()
    assert bad.numel() == 0, [(t[i].item(), out[i].item(), want[i].item()) for i in bad[:8]]


@triton.jit
def _split_dot_kernel(a_ptr, b_ptr, out_ptr, TERMS: tl.constexpr, M: tl.constexpr,
                      K: tl.constexpr, NC: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, NC)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * NC + n[None, :])
    acc = split_dot(a, b, tl.zeros((M, NC), dtype=tl.float32), TERMS)
    tl.store(out_ptr + m[:, None] * NC + n[None, :], acc)


@pytest.mark.parametrize("terms,src", [(3, "fp32"), (2, "fp16"), (1, "bf16")])
def test_split_dot_products_are_exact(terms, src):
    """``split_dot`` with enough bf16 pieces for the state's format rounds only in the fp32
    accumulation: against float64 its error stays within K fp32 roundings of sum |a b|; one
    piece fewer is visibly worse (the test can fail)."""
    g = torch.Generator().manual_seed(7)
    M, K, NC = 16, 64, 16
    a = torch.randn(M, K, generator=g) * torch.logspace(-3, 3, K)[None, :]
    a = a.to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[src]).float()
    b = torch.randn(K, NC, generator=g).to(torch.bfloat16).float()
    exact = a.double() @ b.double()
    bound = K * 2.0**-24 * (a.double().abs() @ b.double().abs())

    def run(t):
        out = torch.full((M, NC), float("nan"))
        _split_dot_kernel[(1,)](a, b, out, TERMS=t, M=M, K=K, NC=NC)
        return (out.double() - exact).abs()

    assert bool((run(terms) <= bound).all())
    if terms > 1:
        assert not bool((run(terms - 1) <= bound).all())
    a[0, 3], a[1, 5] = float("nan"), -float("nan")
    if terms > 1:  # fp32 / fp16 states: a NaN whose top 16 bits alone would be inf
        a.view(torch.int32)[2, 7] = 0x7F800001
    nans = 3 if terms > 1 else 2
    out = run(terms)
    assert bool(out[:nans].isnan().all()) and bool(out[nans:].isfinite().all())


def test_fp16_sr_subnormal_tiles():
    """fp16 SR of tiles holding zeros and values in fp16's subnormal range (2^-24 .. 2^-14,
    the per-element carry of ``round_fp16_sr_wide``; the full recipe of ``round_fp16_sr``),
    next to tiles that also hold a value below 2^-24 (the full recipe): every element against
    the reference, random words of all 32 bits and the extreme words 0 and 2^32 - 1."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, generator=g) * 0.05
    sign = torch.where(torch.rand(N, generator=g) < 0.5, -1.0, 1.0)
    sub = sign * (1 + torch.rand(N, generator=g)) * torch.exp2(
        -torch.randint(15, 25, (N,), generator=g).float())  # 2^-24 <= |sub| < 2^-13
    x[::7] = sub[::7]
    x[::11] = 0.0
    x[5::13] = -0.0
    x[3::29] = 2.0**-24 * torch.randint(1, 1024, (N,), generator=g)[3::29].float()  # grid points
    x[2048 + 100] = 2.0**-30  # the second half's tiles: one value below 2^-24
    x[3072 + 7] = -3e-9
    r = torch.randint(0, 2**32, (N,), generator=g, dtype=torch.int64).to(torch.uint32)
    r[::17] = 0
    r[1::19] = 2**32 - 1
    for tile, wide in ((256, True), (1024, True), (256, False)):
        out = _round(x, r, 1, True, tile, wide)
        ref = F.round_elements(x, F.FORMATS["fp16"], "sr", r)
        assert _same(out, ref), tile
        assert bool((torch.signbit(out) == torch.signbit(ref)).all()), tile


@pytest.mark.parametrize("rounding", ["rn", "sr"])
def test_fp8_subnormal_tiles(rounding):
    """e4m3 rounding of tiles holding zeros and values in its subnormal range (2^-9 .. 2^-6,
    the per-element carry of ``round_fp8_sr``), grid points, ties and values near 448, next
    to tiles that also hold a value below 2^-9 (the full recipe): every element and sign
    against the reference, random words and the extreme words 0 and 2^32 - 1."""
    g = torch.Generator().manual_seed(6)
    x = (torch.rand(N, generator=g) * 2 - 1) * 300.0
    sign = torch.where(torch.rand(N, generator=g) < 0.5, -1.0, 1.0)
    sub = sign * (1 + torch.rand(N, generator=g)) * torch.exp2(
        -torch.randint(7, 10, (N,), generator=g).float())  # 2^-9 <= |sub| < 2^-6
    x[::5] = sub[::5]
    x[::11] = 0.0
    x[5::13] = -0.0
    x[3::29] = 2.0**-9 * torch.randint(-64, 64, (N,), generator=g)[3::29].float()  # grid points
    x[4::31] = 2.0**-10 * (2 * torch.randint(-32, 32, (N,), generator=g)[4::31].float() + 1)  # ties
    x[6::37] = sign[6::37] * (440.0 + 20.0 * torch.rand(N, generator=g)[6::37])  # around 448
    x[2048 + 100] = 2.0**-12  # the second half's tiles: one value below 2^-9
    x[3072 + 7] = -3e-4
    r = torch.randint(0, 2**32, (N,), generator=g, dtype=torch.int64).to(torch.uint32)
    r[::17] = 0
    r[1::19] = 2**32 - 1
    for tile in (256, 1024):
        out = _round(x, r, 3, rounding == "sr", tile)
        ref = F.round_elements(x, F.FORMATS["fp8e4m3"], rounding, r if rounding == "sr" else None)
        assert _same(out, ref), tile
        assert bool((torch.signbit(out) == torch.signbit(ref)).all()), tile


@triton.jit
def _count_nans_kernel(S_ptr, q_ptr, out_ptr, NR, R: tl.constexpr, N: tl.constexpr):
    r = tl.arange(0, R)
    n = tl.arange(0, N)
    S = tl.load(S_ptr + r[:, None] * N + n[None, :])
    m = r < NR
    tl.store(out_ptr, count_nans(S, m))
    tl.store(out_ptr + 1, count_nans(S, m, tl.sum(S * tl.load(q_ptr + n)[None, :], axis=1)))
    tl.store(out_ptr + 2, count_nans(S, m, None, False))


@pytest.mark.parametrize("case", ["finite", "nans", "masked_nans", "infinities", "inf_and_nan"])
def test_count_nans_is_exact(case):
    """The NaN count of a state tile is exact whether or not its cheap sum is NaN: NaNs in
    valid rows counted, those of masked rows not, infinities of both signs (a NaN sum over a
    NaN-free tile) counted as none; with the tile's sum or a per-row output as the hint, and
    without the branch."""
    g = torch.Generator().manual_seed(7)
    R, Nc, NR = 16, 32, 11
    S = torch.randn(R, Nc, generator=g)
    q = torch.randn(Nc, generator=g)
    flat = S.view(-1)
    if case in ("nans", "inf_and_nan"):
        flat[torch.randperm(NR * Nc, generator=g)[:9]] = float("nan")
    if case == "masked_nans":
        S[NR:, ::3] = float("nan")
    if case in ("infinities", "inf_and_nan"):
        S[2, 5], S[7, 1], S[9, 9] = float("inf"), float("-inf"), float("inf")
    want = int(torch.isnan(S[:NR]).sum())
    out = torch.full((3,), -1, dtype=torch.int32)
    _count_nans_kernel[(1,)](S, q, out, NR, R=R, N=Nc)
    assert out.tolist() == [want] * 3
    assert (want > 0) == (case in ("nans", "inf_and_nan"))
