"""Triton device functions shared by every kernel: exact rounding (RN / SR) onto the fp16, bf16,
fp8 and E2M1 grids, the Philox random stream, and NVFP4 / FP8 row encode and decode.

Each function follows ``replayssm_quant.formats`` step for step (see docs/numerics.md) so that
kernels reproduce the reference bits. Hopper has no hardware stochastic-rounding conversion,
so SR is done in software here.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .plan import Target

# A non-flush step's fp8 / NVFP4 read-copy rows are read once per step; marked first to leave
# L2, they leave the ring records (as large as the copy's rows on Qwen3.5: u in fp32) that
# every tile of a head reads in L2. Measured on the H200 at batch 256
# (reports/kernels/tune_r99_evict_*.log): the GDN fp8 non-flush step 93.6 -> 85.3 us on
# Qwen3.5-4B, 168.9 -> 160.7 us on 122B, NVFP4 on Nemotron-3-Nano-4B 97.3 -> 92-93 us; the
# same hint on the conventional step's and the flushes' state loads and stores made the
# conventional FP32 step 1.3-2.6% slower, so they carry none.
STREAM: tl.constexpr = tl.constexpr("evict_first")

# Format codes used as tl.constexpr by every kernel.
FMT_NONE = -1
FMT_FP32 = 0
FMT_FP16 = 1
FMT_BF16 = 2
FMT_FP8 = 3
FMT_NVFP4 = 4

FMT_CODES = {"fp32": FMT_FP32, "fp16": FMT_FP16, "bf16": FMT_BF16, "fp8e4m3": FMT_FP8,
             "nvfp4": FMT_NVFP4}

# Triton's interpreter runs no inline PTX and converts to fp8 by its own rounding: there the
# E4M3 decode and encode are computed in plain ops
_PTX = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def philox(seed, c0, c1, c2, c3):
    """Philox-4x32-10 of ``triton.language.random.philox`` (same key from ``seed``, same words),
    with each round's two products as 64-bit products: sm_90 then computes high and low half
    in one wide multiply instead of two, 20 instructions fewer per call."""
    seed = seed.to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = c0.to(tl.uint32, bitcast=True)
    c1 = c1.to(tl.uint32, bitcast=True)
    c2 = c2.to(tl.uint32, bitcast=True)
    c3 = c3.to(tl.uint32, bitcast=True)
    for _ in tl.static_range(10):
        pb = c2.to(tl.uint64) * 0xCD9E8D57
        pa = c0.to(tl.uint64) * 0xD2511F53
        c0 = (pb >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (pa >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = pb.to(tl.uint32)
        c3 = pa.to(tl.uint32)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def pow2(k):
    """2^k as fp32 for int32 k in [-126, 127] (exact: built from exponent bits)."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def with_sign_of(q, x):
    """|q| with the sign bit of x (copysign, -0 kept)."""
    qb = q.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    sb = x.to(tl.int32, bitcast=True) & -2147483648
    return (qb | sb).to(tl.float32, bitcast=True)


@triton.jit
def sr_words(seed, layer, sequence, flush_index, element, HALF: tl.constexpr = False):
    """SR words of the elements ``element``: Philox-4x32-10 with key seed and counter
    (element >> 2, sequence, flush_index, layer), output word ``element & 3``; with HALF
    (fp16 / bf16 targets) counter ``element >> 3`` and the low / high 16 bits of word
    ``(element >> 1) & 3`` for an even / odd element, moved to the top (``formats.sr_bits``).

    One Philox call serves four (eight) consecutive elements. ``element`` (rank 2 or 3) must
    hold consecutive indices along its last axis in runs aligned to the group (a ``(rows, d)``
    tile, or a ``(d // 16, rows, 16)`` chunked tile); ``sequence``, ``flush_index`` and
    ``layer`` are scalars. The group counters are the first of every group (splits of a
    ``(.., 2, 2[, 2])`` view: no reduction), and the words go back with joins, which compile
    to fewer layout conversions than a ``tl.min`` over the group or a select of broadcast
    words."""
    RANK: tl.constexpr = len(element.shape)
    GS: tl.constexpr = 8 if HALF else 4
    e = element.to(tl.uint32) >> (3 if HALF else 2)
    if HALF:
        if RANK == 2:
            e = tl.reshape(e, (element.shape[0], element.shape[1] // 8, 2, 2, 2))
        else:
            tl.static_assert(RANK == 3, "sr_words: element must have rank 2 or 3")
            e = tl.reshape(e, (element.shape[0], element.shape[1], element.shape[2] // 8, 2, 2, 2))
        g, _ = tl.split(e)
        g, _ = tl.split(g)
        g, _ = tl.split(g)
    else:
        if RANK == 2:
            e = tl.reshape(e, (element.shape[0], element.shape[1] // GS, 2, 2))
        else:
            tl.static_assert(RANK == 3, "sr_words: element must have rank 2 or 3")
            e = tl.reshape(e, (element.shape[0], element.shape[1], element.shape[2] // GS, 2, 2))
        g, _ = tl.split(e)
        g, _ = tl.split(g)
    z = g * 0
    r0, r1, r2, r3 = philox(seed, g, z + sequence.to(tl.uint32), z + flush_index.to(tl.uint32),
                            z + layer.to(tl.uint32))
    # join(join(r0, r2), join(r1, r3))[..., a, b] = r_{2a + b}: word k to element 4c + k
    w = tl.join(tl.join(r0, r2), tl.join(r1, r3))
    if HALF:  # [..., a, b, h]: half h of word 2a + b to element 8c + 2 (2a + b) + h
        w = tl.join(w << 16, w & 0xFFFF0000)
    return tl.reshape(w, element.shape)


@triton.jit
def sr_words_for(seed, layer, sequence, flush_index, element, FMT: tl.constexpr):
    """``sr_words`` with the word width SR onto format FMT takes (16 bits for fp16 / bf16)."""
    if FMT == 1:
        return sr_words(seed, layer, sequence, flush_index, element, True)
    elif FMT == 2:
        return sr_words(seed, layer, sequence, flush_index, element, True)
    else:
        return sr_words(seed, layer, sequence, flush_index, element, False)


@triton.jit
def round_grid(x, r, MANT: tl.constexpr, EMIN: tl.constexpr, MAXF: tl.constexpr,
               SR: tl.constexpr):
    """Round fp32 x onto a (MANT, EMIN) grid; saturate to MAXF; NaN stays NaN."""
    ax = tl.abs(x)
    e = ((ax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(e, EMIN), 127)
    t = ax * pow2(MANT - e)
    fl = tl.floor(t)
    frac = t - fl
    if SR:
        u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08
        up = u < frac
    else:
        odd = (fl - 2.0 * tl.floor(fl * 0.5)) == 1.0
        up = (frac > 0.5) | ((frac == 0.5) & odd)
    q = (fl + up.to(tl.float32)) * pow2(e - MANT)
    q = tl.minimum(q, MAXF)
    q = with_sign_of(q, x)
    return tl.where(x != x, x, q)


@triton.jit
def round_grid_rn_value(x, MANT: tl.constexpr, EMIN: tl.constexpr, MAXF: tl.constexpr):
    """``round_grid(.., SR=False)`` as a value (the sign of a zero is not kept), in about a
    third of the operations: clamp to +-MAXF (everything beyond saturates either way), then add
    and subtract a constant whose ulp is the grid step of x's binade, so the fp32 adder's
    round-to-nearest-even is the grid's. Readers that only use the value (the emulator's
    fake quantization) take this; stored codes keep the exact recipe."""
    t = tl.minimum(tl.maximum(x, -MAXF), MAXF)
    eb = (t.to(tl.int32, bitcast=True) >> 23) & 0xFF
    c = (((tl.maximum(eb, 127 + EMIN) + (23 - MANT)) << 23) | 0x400000).to(tl.float32,
                                                                          bitcast=True)
    q = (t + c) - c
    return tl.where(x != x, x, q)


@triton.jit
def round_fp16_sr(x, r):
    """``round_grid(x, r, 10, -14, 65504, True)`` in integers. Where the fp16 grid keeps fp32's
    exponent and nothing overflows (2^-14 <= |x| <= 65504), ``u < frac`` is ``(r >> 19) < low
    13 bits``, so adding ``8191 - (r >> 19)`` to the signed bits carries exactly when rounding
    up: four instructions. A tile holding any other value (zero, below 2^-14 with its fixed
    step 2^-24, above 65504, inf, NaN) runs the full recipe; one unsigned maximum over the
    tile decides. The conventional step rounds this way (72 registers at 8 rows x 2 warps);
    flushes take ``round_fp16_sr_wide``, whose tiles with zeros or values below 2^-14 (most
    tiles of ~10^3 state values) stay in integers."""
    bits = x.to(tl.int32, bitcast=True)
    fast = (bits + ((r >> 19) ^ 0x1FFF).to(tl.int32)) & -8192  # 8191 - (r >> 19)
    # (2|x| bits - 2^-14 bits) wraps below 2^-14: in range iff <= 2 (65504 - 2^-14) in bits
    key = (bits.to(tl.uint32, bitcast=True) << 1) - 0x71000000
    if tl.max(key, axis=None) <= 0x1DFFC000:
        q = fast.to(tl.float32, bitcast=True)
    else:
        q = _round_fp16_sr_full(x, r)
    return q


@triton.jit
def round_fp16_sr_wide(x, r):
    """``round_fp16_sr`` in integers for tiles whose values are zero or 2^-24 <= |x| <= 65504:
    ``s`` = 13 fp32 mantissa bits lie below the fp16 step from 2^-14 up, and below it
    ``s = 126 - biased exponent`` (up to 23, the step being 2^-24); ``u < frac`` is
    ``(r >> (32 - s)) < those bits``, so adding ``~r >> (32 - s)`` carries exactly when
    rounding up, and clearing the s bits leaves the rounded value (a zero stays a zero of
    its sign). About ten instructions per element; other tiles run the full recipe. The
    flushes take it: nvfp4-read/fp16-sr 4.5-5.5% faster on the four paper shapes, where the
    conventional step, bound by latency at 80 against 72 registers, was up to 6% slower
    (reports/kernels/tune_r54_fp16_sr.log)."""
    bits = x.to(tl.int32, bitcast=True)
    ab = bits & 0x7FFFFFFF
    # zero, or (|x| bits - 2^-24 bits) <= (65504 - 2^-24) in bits (wraps below 2^-24)
    key = tl.where(ab == 0, 0, ab - 0x33800000).to(tl.uint32, bitcast=True)
    if tl.max(key, axis=None) <= 0x13FFE000:
        s = tl.minimum(tl.maximum(126 - (ab >> 23), 13), 23)
        carry = (r ^ 0xFFFFFFFF) >> (32 - s).to(tl.uint32)  # ~r: the interpreter rejects ~ on uint32
        q = ((bits + carry.to(tl.int32, bitcast=True)) & (-1 << s)).to(tl.float32, bitcast=True)
    else:
        q = _round_fp16_sr_full(x, r)
    return q


@triton.jit
def _round_fp16_sr_full(x, r):
    """``round_fp16_sr`` for any value: the integer form in the normal range, the float recipe
    below 2^-14, saturation at 65504, NaN kept."""
    ab = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    qi = (ab + ((r >> 19) ^ 0x1FFF).to(tl.int32)) & -8192
    q = tl.minimum(qi, 0x477FE000).to(tl.float32, bitcast=True)
    small = ab < 0x38800000
    t = ab.to(tl.float32, bitcast=True) * 16777216.0
    fl = tl.floor(t)
    up = ((r >> 8).to(tl.float32) * 5.9604644775390625e-08) < (t - fl)
    q = tl.where(small, (fl + up.to(tl.float32)) * 5.960464477539063e-08, q)
    q = with_sign_of(q, x)
    return tl.where(x != x, x, q)


@triton.jit
def round_bf16(x, r, SR: tl.constexpr):
    """Round fp32 x to bf16 values (returned as fp32) by the integer form of the reference.
    SR adds the word's top 16 bits to the signed bits and truncates (three instructions) when
    no value of the tile can round past the largest bf16 (|x| <= 0x7F7F0000 in bits: no inf
    or NaN either); one unsigned maximum over the tile decides."""
    if SR:
        bits = x.to(tl.uint32, bitcast=True)
        if tl.max(bits << 1, axis=None) <= 0xFEFE0000:
            q = ((bits + (r >> 16)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        else:
            q = _round_bf16_full(x, r, SR)
    else:
        q = _round_bf16_full(x, r, SR)
    return q


@triton.jit
def _round_bf16_full(x, r, SR: tl.constexpr):
    """``round_bf16`` for any value: saturation at the largest bf16, NaN kept."""
    ax = tl.abs(x)
    bits = ax.to(tl.uint32, bitcast=True)
    if SR:
        bits = bits + (r >> 16)
    else:
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
    bits = bits & 0xFFFF0000
    bits = tl.minimum(bits, 0x7F7F0000)
    q = with_sign_of(bits.to(tl.float32, bitcast=True), x)
    return tl.where(x != x, x, q)


@triton.jit
def round_to(x, r, FMT: tl.constexpr, SR: tl.constexpr, WIDE: tl.constexpr = True):
    """Element rounding for an unscaled storage format (fp32 passes through); WIDE picks
    ``round_fp16_sr_wide`` for fp16 SR, else ``round_fp16_sr``."""
    if FMT == 1:
        if SR and WIDE:
            return round_fp16_sr_wide(x, r)
        elif SR:
            return round_fp16_sr(x, r)
        else:
            return round_grid(x, r, 10, -14, 65504.0, False)
    elif FMT == 2:
        return round_bf16(x, r, SR)
    elif FMT == 3:
        return round_fp8(x, r, SR)
    else:
        return x


@triton.jit
def round_fp8(t, r, SR: tl.constexpr):
    """``round_grid(t, r, 3, -6, 448, SR)``, the e4m3 grid. SR: ``round_fp8_sr``. RN on the GPU
    is the hardware conversion ``cvt.rn.satfinite.e4m3x2.f32`` and back (round to nearest
    even with subnormals, +-inf saturating to +-448, NaN kept, the sign of a zero kept: the
    recipe's results), about 2 instructions per element instead of ~20; the interpreter's
    fp8 conversion rounds ties away from zero, so there the recipe runs."""
    if SR:
        return round_fp8_sr(t, r)
    elif _PTX:
        return t.to(tl.float8e4nv).to(tl.float32)
    else:
        return round_grid(t, r, 3, -6, 448.0, False)


@triton.jit
def round_fp8_sr(t, r):
    """``round_grid(t, r, 3, -6, 448, True)`` in integers for tiles whose values are zero or
    finite from 2^-9 (the e4m3 grid's smallest step) up: ``s`` = 20 fp32 mantissa bits lie
    below the e4m3 step from 2^-6 up and ``141 - biased exponent`` (up to 23) below it, so
    ``u < frac`` is ``(r >> (32 - s)) < those bits`` and adding ``~r >> (32 - s)`` carries
    exactly when rounding up (``round_fp16_sr_wide``'s argument); clearing the s bits and
    an integer minimum with 448's bits leave the saturated value, sign and zeros kept. A tile
    holding any other value (below 2^-9, inf, NaN) runs the recipe; one unsigned maximum over
    the tile decides."""
    bits = t.to(tl.int32, bitcast=True)
    ab = bits & 0x7FFFFFFF
    # zero, or (|t| bits - 2^-9 bits) <= (largest finite - 2^-9) in bits (wraps below 2^-9)
    key = tl.where(ab == 0, 0, ab - 0x3B000000).to(tl.uint32, bitcast=True)
    if tl.max(key, axis=None) <= 0x447FFFFF:
        s = tl.minimum(tl.maximum(141 - (ab >> 23), 20), 23)
        carry = (r ^ 0xFFFFFFFF) >> (32 - s).to(tl.uint32)  # ~r: the interpreter rejects ~ on uint32
        qa = tl.minimum((ab + carry.to(tl.int32, bitcast=True)) & (-1 << s), 0x43E00000)
        q = (qa | (bits & -2147483648)).to(tl.float32, bitcast=True)
    else:
        q = round_grid(t, r, 3, -6, 448.0, True)
    return q


@triton.jit
def finite_abs(x):
    """|x| where finite, else 0 (NaN and inf are ignored by amax)."""
    ax = tl.abs(x)
    return tl.where(ax < float("inf"), ax, 0.0)


@triton.jit
def safe_div(num, den):
    """num / den (IEEE RN), 0 where den == 0."""
    ok = den > 0
    return tl.where(ok, tl.math.div_rn(num, tl.where(ok, den, 1.0)), 0.0)


@triton.jit
def fp8_row_encode(x, r, SR: tl.constexpr):
    """Rows of x (BR, N) -> (values on the e4m3 grid as fp32, row scale (BR,))."""
    scale = tl.math.div_rn(tl.max(finite_abs(x), axis=1), 448.0)
    t = x * safe_div(1.0, scale)[:, None]
    t = tl.where(x != x, x, t)
    t = tl.where(tl.abs(x) == float("inf"), x, t)
    return round_fp8(t, r, SR), scale


@triton.jit
def e2m1_code(v):
    """Values on the E2M1 grid -> 4-bit codes (sign in bit 3)."""
    a = tl.abs(v)
    idx = tl.where(a < 2.0, a * 2.0, tl.where(a < 4.0, a + 2.0, a * 0.5 + 4.0)).to(tl.int32)
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return idx | (sign << 3)


@triton.jit
def e2m1_rn_code(t):
    """fp32 t -> the 4-bit code of ``round_grid(t, .., 1, 0, 6.0, SR=False)`` (sign in bit 3;
    NaN -> 0, +-inf -> +-6), in about 16 operations instead of rounding then encoding:
    below 1 the grid is {0, 0.5, 1}, so ``2|t| + 2^23`` rounded once by an FMA leaves the
    code (0, 1 or 2) in the low mantissa bits; from 1 up to 6 the code is the exponent and
    top mantissa bit of |t| rounded to one mantissa bit, ties to even, by an integer add."""
    a = tl.abs(t)
    small = ((a * 2.0 + 8388608.0).to(tl.int32, bitcast=True)) & 3
    bits = tl.minimum(a, 6.0).to(tl.int32, bitcast=True)
    big = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) >> 22) - 252
    idx = tl.where(a < 1.0, small, big)
    code = idx | ((t.to(tl.int32, bitcast=True) >> 28) & 8)
    return tl.where(t != t, 0, code)


@triton.jit
def e2m1_value(code):
    """4-bit codes (int32) -> fp32 values: exponent/mantissa bits moved into an fp32 pattern
    biased by 126, then the two sub-unit codes (0 and 0.5) corrected."""
    idx = code & 7
    v = ((idx << 22) + (126 << 23)).to(tl.float32, bitcast=True)
    v = v - tl.where(idx < 2, 0.5 - 0.25 * idx.to(tl.float32), 0.0)
    sign = (code & 8) << 28
    return (v.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def nvfp4_row_encode(x, r, BR: tl.constexpr, N: tl.constexpr, SR: tl.constexpr):
    """Rows of x (BR, N) -> (packed codes (BR, N//16, 8) uint8, block scales (BR, N//16) fp32
    on the E4M3 grid, row scale (BR,), dequantized values (BR, N)). Works on a (BR, blocks, 16)
    view throughout so block reductions need no further reshapes."""
    NB: tl.constexpr = N // 16
    x3 = tl.reshape(x, (BR, NB, 16))
    ax = finite_abs(x3)
    blk_amax = tl.max(ax, axis=2)
    row_scale = tl.math.div_rn(tl.max(blk_amax, axis=1), 2688.0)
    s = safe_div(blk_amax, 6.0 * row_scale[:, None])
    s = tl.minimum(tl.maximum(s, 0.001953125), 448.0)
    s = round_grid_rn_value(s, 3, -6, 448.0)  # positive and finite here: the value form is exact
    blk_nan = tl.max((x3 != x3).to(tl.int32), axis=2) > 0
    s = tl.where(blk_nan, float("nan"), s)
    eff = s * row_scale[:, None]
    t = x3 * safe_div(1.0, eff)[:, :, None]
    t = tl.where(tl.abs(x3) == float("inf"), x3, t)
    if SR:
        v = round_grid(t, tl.reshape(r, (BR, NB, 16)), 1, 0, 6.0, SR)
        v = tl.where(v != v, 0.0, v)
        code = e2m1_code(v)
    else:
        code = e2m1_rn_code(t)
        v = e2m1_value(code)
    lo, hi = tl.split(tl.reshape(code, (BR, NB, 8, 2)))
    packed = (lo | (hi << 4)).to(tl.uint8)
    deq = tl.reshape(v * eff[:, :, None], (BR, N))
    return packed, s, row_scale, deq


@triton.jit
def nvfp4_row_decode(packed, bscale, row_scale, BR: tl.constexpr, N: tl.constexpr):
    """(BR, N//2) packed codes, (BR, N//16) block scales, (BR,) row scale -> (BR, N) fp32."""
    p = packed.to(tl.int32)
    v = tl.reshape(tl.join(e2m1_value(p & 15), e2m1_value(p >> 4)), (BR, N))
    eff = bscale * row_scale[:, None]
    return tl.reshape(tl.reshape(v, (BR, N // 16, 16)) * eff[:, :, None], (BR, N))


def register_cap(maxnreg: int | None) -> dict:
    """Launch options capping a kernel's registers per thread (Triton's ``maxnreg``): fewer
    registers let an SM hold more warps, which hides the latency of kernels bound by it, at
    the cost of spills where the cap is below what the kernel needs. None: no cap."""
    if maxnreg is None:
        return {}
    if isinstance(maxnreg, bool) or not isinstance(maxnreg, int) or not 24 <= maxnreg <= 255:
        raise ValueError(f"maxnreg must be an integer from 24 to 255 or None, got {maxnreg!r}")
    return {"maxnreg": maxnreg}


def tma_layout_problem(data: torch.Tensor) -> str | None:
    """Why a checkpoint's data cannot be moved by a TMA tensor descriptor of its ``(slots,
    heads * rows, d)`` view, or None when it can: fp32, each slot's ``(heads, rows, d)``
    contiguous, base and slot stride on 16-byte boundaries."""
    if data.dtype != torch.float32:
        return f"flush_tma moves an fp32 checkpoint, got {data.dtype}"
    slots, heads, rows, d = data.shape
    if data.stride()[1:] != (rows * d, d, 1):
        return ("flush_tma needs each slot's (heads, rows, d) contiguous, got strides "
                f"{tuple(data.stride())}")
    if data.data_ptr() % 16 or (data.stride(0) * 4) % 16:
        return "flush_tma needs a 16-byte aligned checkpoint and slot stride"
    return None


def state_descriptor(st, block_rows: int, tma: bool):
    """For a flush that moves an fp32 checkpoint through the tensor memory accelerator
    (``tma``): a tensor descriptor of its ``(slots, heads * rows, d)`` view with blocks of
    ``block_rows`` whole rows of one slot; else None. The view keeps the slot stride, so
    strided vLLM pages work; a layout ``tma_layout_problem`` names is refused."""
    if not tma:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    problem = tma_layout_problem(st.data)
    if problem:
        raise ValueError(problem)
    slots, heads, rows, d = st.data.shape
    view = st.data.view(slots, heads * rows, d)
    return TensorDescriptor.from_tensor(view, [1, block_rows, d])


def resolve_flush_tma(tma: bool | None, cfg, rows: int, block_rows: int, one_launch: bool,
                      device, data: torch.Tensor | None = None) -> bool:
    """Whether the persistent flush moves its checkpoint tiles through the tensor memory
    accelerator (TMA, ``state_descriptor``): only an fp32 checkpoint without a read copy, in
    whole tiles (``rows`` per head a multiple of the flush tile's ``block_rows``), on sm_90+
    or under the interpreter, with checkpoint ``data`` a descriptor can address
    (``tma_layout_problem``). None: wherever it applies, measured on the H200 at batch 256
    with 2 pipelining stages against cp.async loads with 3 (reports/kernels/tune_r152_tma.log):
    the FP32 flush on Nemotron-3-Super 638.8 -> 622.4 us, Nano-4B 594.7 -> 579.9, Qwen3.5-4B
    362.0 -> 350.7, Qwen3.5-122B 693.5 -> 682.4. True where it does not apply is refused."""
    gpu_ok = Target.of(device).tma
    fits = (cfg.ckpt.name == "fp32" and cfg.read is None and rows % block_rows == 0
            and not one_launch)
    if tma is None:
        return fits and gpu_ok and (data is None or tma_layout_problem(data) is None)
    if not tma:
        return False
    if cfg.ckpt.name != "fp32" or cfg.read is not None:
        raise ValueError("flush_tma applies to an fp32 checkpoint without a read copy, got "
                         f"{cfg}")
    if rows % block_rows:
        raise ValueError(f"flush_tma needs whole flush tiles: {rows} rows per head are no "
                         f"multiple of {block_rows}")
    if one_launch:
        raise ValueError("flush_tma sets the persistent flush; one_launch=True flushes on the "
                         "step's own tiles")
    if not gpu_ok:
        raise ValueError("flush_tma needs an sm_90 or newer GPU (the tensor memory accelerator)")
    problem = tma_layout_problem(data) if data is not None else None
    if problem:
        raise ValueError(problem)
    return True


@triton.jit
def row_head_tile(TILE_FIRST: tl.constexpr):
    """(batch row, head, tile) of a program of a per-(row, head, tile) grid, launched as
    ``step_grid``: (rows, heads, tiles), or (tiles, heads, rows) with TILE_FIRST, so that
    programs launched together walk one cache slot's contiguous state."""
    if TILE_FIRST:
        return tl.program_id(2), tl.program_id(1), tl.program_id(0)
    else:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def tile_rows(vt, N: tl.constexpr, BR: tl.constexpr, WHOLE: tl.constexpr):
    """Rows ``vt * BR + [0, BR)`` of a tile over N rows and their mask. With WHOLE (the
    caller's promise that BR divides N) the mask is a constant, so ptxas need not carry it
    through the tile's loads and stores."""
    rows = vt * BR + tl.arange(0, BR)
    if WHOLE:
        return rows, tl.full((BR,), 1, tl.int1)
    else:
        return rows, rows < N


def step_grid(rows: int, heads: int, tiles: int, tile_first: bool) -> tuple[int, int, int]:
    """The launch grid ``row_head_tile`` reads."""
    return (tiles, heads, rows) if tile_first else (rows, heads, tiles)


@triton.jit
def load_cols(base, rscale_base, bscale_base, rows, k0, mask_r, FMT: tl.constexpr,
              BR: tl.constexpr, N: tl.constexpr, KC: tl.constexpr, WORDS: tl.constexpr = False,
              ROW_SCALE: tl.constexpr = True):
    """Columns ``k0 .. k0 + KC`` of BR stored state rows (row indices ``rows`` of a row-major
    (.., N) layout, per-row scales indexed by row) as fp32 (BR, KC). KC is a multiple of 16
    for NVFP4, so a chunk holds whole blocks: loops over chunks keep only (BR, KC) live.
    WORDS decodes NVFP4 from int32 words (``e2m1_word_scaled``; rows 4-byte aligned).
    Without ROW_SCALE the fp8 / NVFP4 row scale is left to the caller (``row_scales``): the
    values then have at most 6 significant bits, exact in bf16."""
    if FMT == 4:
        blk = tl.arange(0, KC // 16)
        bs = tl.load(bscale_base + rows[:, None] * (N // 16) + k0 // 16 + blk[None, :],
                     mask=mask_r[:, None], other=0.0).to(tl.float32)
        if ROW_SCALE:
            rs = tl.load(rscale_base + rows, mask=mask_r, other=0.0)
        else:
            rs = tl.full((BR,), 1.0, tl.float32)
        if WORDS:
            # int32 words, nibble i of word wi = element 8 wi + i; joined so that the flat
            # order is (wi, i): the innermost join pairs nibbles i and i + 4
            WN: tl.constexpr = KC // 8
            wi = tl.arange(0, WN)
            w = tl.load(base.to(tl.pointer_type(tl.int32)) + rows[:, None] * (N // 8) + k0 // 8
                        + wi[None, :], mask=mask_r[:, None], other=0)
            v = tl.join(tl.join(tl.join(e2m1_word_scaled(w, 0), e2m1_word_scaled(w, 4)),
                                tl.join(e2m1_word_scaled(w, 2), e2m1_word_scaled(w, 6))),
                        tl.join(tl.join(e2m1_word_scaled(w, 1), e2m1_word_scaled(w, 5)),
                                tl.join(e2m1_word_scaled(w, 3), e2m1_word_scaled(w, 7))))
            v = tl.reshape(v * 8.507059173023462e37, (BR, KC // 16, 16))  # * 2^126: exact
            return tl.reshape(v * (bs * rs[:, None])[:, :, None], (BR, KC))
        half = tl.arange(0, KC // 2)
        p = tl.load(base + rows[:, None] * (N // 2) + k0 // 2 + half[None, :],
                    mask=mask_r[:, None], other=0)
        return nvfp4_row_decode(p, bs, rs, BR, KC)
    else:
        n = k0 + tl.arange(0, KC)
        v = tl.load(base + rows[:, None] * N + n[None, :], mask=mask_r[:, None], other=0.0)
        v = fp8_value(v) if FMT == 3 else v.to(tl.float32)
        if FMT == 3 and ROW_SCALE:
            rs = tl.load(rscale_base + rows, mask=mask_r, other=0.0)
            v = v * rs[:, None]
        return v


@triton.jit
def fp8_value(v):
    """fp8 e4m3fn -> fp32. The GPU's conversion maps the NaN bytes (0x7F, 0xFF) to NaN;
    Triton's interpreter maps them to +-480, so there they are mapped back (480 is no e4m3fn
    value)."""
    f = v.to(tl.float32)
    if not _PTX:
        f = tl.where(tl.abs(f) == 480.0, float("nan"), f)
    return f


@triton.jit
def row_scales(rscale_base, rows, mask_r, FMT: tl.constexpr, BR: tl.constexpr):
    """The per-row scale of fp8 / NVFP4 rows (1 for other formats), for ``load_cols``
    without ROW_SCALE."""
    if FMT == 3 or FMT == 4:
        return tl.load(rscale_base + rows, mask=mask_r, other=0.0)
    else:
        return tl.full((BR,), 1.0, tl.float32)


@triton.jit
def split_dot(a, b, acc, TERMS: tl.constexpr):
    """``acc + a @ b`` for fp32 ``a`` and ``b`` exact in bf16 (bf16 activations): ``a`` as a sum
    of TERMS bf16 pieces, so every product is exact and only the fp32 accumulation rounds.
    Three pieces hold any fp32 significand, two an fp16 one, one the values of bf16, fp8 and
    NVFP4 states (without their row scale). Smallest pieces first. Every piece but the last
    is the top 16 bits of what the previous ones leave (``bf16_head``); the subtraction is
    exact and the last remainder fits a bf16 exactly."""
    bb = b.to(tl.bfloat16)
    if TERMS == 1:
        return _bf16_dot(a.to(tl.bfloat16), bb, acc)
    a1 = bf16_head(a)
    r = a - a1
    if TERMS > 2:
        a2 = bf16_head(r)
        acc = _bf16_dot((r - a2).to(tl.bfloat16), bb, acc)
        acc = _bf16_dot(a2.to(tl.bfloat16), bb, acc)
    else:
        acc = _bf16_dot(r.to(tl.bfloat16), bb, acc)
    return _bf16_dot(a1.to(tl.bfloat16), bb, acc)


@triton.jit
def bf16_head(x):
    """The top 16 bits of fp32 ``x`` as an fp32 value (a bf16 by truncation): one mask, where
    rounding to bf16 and back costs a conversion each way, and ``x - head`` is exact. In the
    speculative verify's three-piece split of an fp32 state, 7.5 -> 5.5 instructions per
    element; at batch 256 on the H200 the replay-fp32 verify went 265.1 -> 247.8 us on
    Qwen3.5-4B (a conventional step 266.9), 494.8 -> 459.3 on 122B, 360.1 -> 342.0 on
    Nemotron-3-Super, 441.4 -> 407.9 on Nano-4B
    (reports/kernels/tune_r126_split_trunc_b256_{old,new}.log)."""
    return (x.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)


# Triton's interpreter multiplies bf16 dot operands wrongly, so there the bf16 pieces are
# multiplied as fp32 (the same exact products, the same fp32 accumulation)
_BF16_MMA = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def _bf16_dot(a, b, acc):
    if _BF16_MMA:
        return tl.dot(a, b, acc)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def load_rows(base, rscale_base, bscale_base, rows, n_idx, mask_r, FMT: tl.constexpr,
              BR: tl.constexpr, N: tl.constexpr):
    """Load BR whole state rows in format FMT as fp32 (BR, N) (``n_idx`` is ``arange(N)``)."""
    return load_cols(base, rscale_base, bscale_base, rows, 0, mask_r, FMT, BR, N, N)


@triton.jit
def count_nans(S, mask_r, hint=None, BRANCH: tl.constexpr = True):
    """NaNs among the valid rows of the fp32 tile S (rows, N). With BRANCH the exact count (a
    compare, a select and an add per element) runs only when a cheap sum is NaN: ``hint``, a
    per-row value that is NaN wherever a row of S holds one (the step's output
    ``sum(S * q)``: a NaN times anything and plus anything stays NaN), else the tile's sum
    (one add per element); a NaN-free tile whose sum is NaN (infinities of both signs) only
    pays the exact count. Measured on the H200 at batch 256 (reports/kernels/
    tune_r140_nan_*.log, tune_r141_nan_*.log): conventional fp16-SR steps 566 -> 498 us
    (Nemotron-3-Super) and 253 -> 218 us (Qwen3.5-4B), the NVFP4 read + FP16-SR flush 1479
    -> 1413 and 1144 -> 1107 us; but every flush of an fp32 checkpoint 1-5% slower (the
    plain one's 1-3%, the NVFP4 read copy's 3.6-4.6%), so an fp32 state counts without the
    branch (``store_rows``)."""
    nans = tl.zeros((), dtype=tl.int32)
    if BRANCH:
        if hint is None:
            total = tl.sum(tl.sum(S, axis=1), axis=0)
        else:
            total = tl.sum(hint, axis=0)
        if total != total:
            nans = tl.sum(tl.sum(((S != S) & mask_r[:, None]).to(tl.int32), axis=1), axis=0)
    else:
        nans = tl.sum(tl.sum(((S != S) & mask_r[:, None]).to(tl.int32), axis=1), axis=0)
    return nans


@triton.jit
def store_rows(S, r, base, rscale_base, bscale_base, rows, n_idx, mask_r, FMT: tl.constexpr,
               SR: tl.constexpr, BR: tl.constexpr, N: tl.constexpr, WIDE: tl.constexpr = True,
               hint=None):
    """Quantize fp32 rows S (BR, N) into format FMT and store them; returns the dequantized
    stored values (what later readers see) and the number of NaNs written (``count_nans``,
    with its ``hint``; an fp32 format counts without the branch). WIDE: the fp16 SR form
    (``round_to``)."""
    nans = count_nans(S, mask_r, hint, FMT != 0)  # 0: FMT_FP32
    if FMT == 4:
        packed, s, rs, deq = nvfp4_row_encode(S, r, BR, N, SR)
        blk = tl.arange(0, N // 16)
        e8 = tl.arange(0, 8)
        tl.store(base + rows[:, None, None] * (N // 2) + blk[None, :, None] * 8 + e8[None, None, :],
                 packed, mask=mask_r[:, None, None])
        s8 = s.to(bscale_base.dtype.element_ty).to(tl.uint8, bitcast=True)
        s8 = tl.where(s != s, 0x7F, s8).to(tl.uint8)  # E4M3 NaN, whatever the converter does
        tl.store(bscale_base + rows[:, None] * (N // 16) + blk[None, :],
                 s8.to(bscale_base.dtype.element_ty, bitcast=True), mask=mask_r[:, None])
        tl.store(rscale_base + rows, rs, mask=mask_r)
        return deq, nans
    elif FMT == 3:
        v, rs = fp8_row_encode(S, r, SR)
        v8 = v.to(base.dtype.element_ty).to(tl.uint8, bitcast=True)
        v8 = tl.where(v != v, 0x7F, v8).to(tl.uint8)  # keep NaN as the E4M3 NaN code
        tl.store(base + rows[:, None] * N + n_idx[None, :],
                 v8.to(base.dtype.element_ty, bitcast=True), mask=mask_r[:, None])
        tl.store(rscale_base + rows, rs, mask=mask_r)
        return v * rs[:, None], nans
    else:
        v = round_to(S, r, FMT, SR, WIDE)
        tl.store(base + rows[:, None] * N + n_idx[None, :], v.to(base.dtype.element_ty),
                 mask=mask_r[:, None])
        return v, nans


@triton.jit
def e2m1_word_scaled(w, i: tl.constexpr):
    """Nibble i of int32 words w -> its E2M1 value times 2^-126, in three integer ops:
    shifting the nibble to the top and back by 6 (arithmetic) puts its magnitude bits in the
    fp32 exponent / mantissa fields unbiased and copies its sign into bit 31 (code 1 becomes
    the subnormal 2^-127). The caller scales the other factor instead (``pow2_prescale``)."""
    t = (w << (28 - 4 * i)) >> 6
    return (t & -0x7E400000).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_word_scaled(w, i: tl.constexpr):
    """Byte i of int32 words w (fp8 e4m3fn) -> its value times 2^-120, in three integer ops:
    shifting the byte to the top and back by 4 (arithmetic) puts its exponent and mantissa
    bits in the fp32 fields unbiased and copies its sign into bit 31 (e4m3 subnormals become
    fp32 subnormals). NaN bytes decode as finite numbers: the caller checks them
    (``e4m3_word_nans``) and scales the other factor (``pow2_prescale``)."""
    t = (w << (24 - 8 * i)) >> 4
    return (t & -0x78100000).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_word_nans(w):
    """Nonzero where a byte of the int32 words w is an e4m3fn NaN (low seven bits all set):
    adding 1 to each byte's low seven bits carries into its top bit only for 0x7F."""
    return ((w & 0x7F7F7F7F) + 0x01010101) & -0x7F7F7F80


@triton.jit
def pow2_prescale(v_ptr, N: tl.constexpr):
    """A power of two ``s`` that brings max |v| near 2^64 (1 for huge, inf or NaN entries),
    and ``2^126 / s``. Products of ``v * s`` with E2M1 values times 2^-126 then stay normal
    floats down to 2^-67 of the largest product, so the dot product is the fp32 one up to
    reduction order, without a multiply per decoded element."""
    return pow2_prescale_of(tl.load(v_ptr + tl.arange(0, N)).to(tl.float32))


@triton.jit
def vector_prescales(va_ptr, vb_ptr, scales_ptr, N: tl.constexpr, TWO: tl.constexpr,
                     PRESCALED: tl.constexpr):
    """``(s_a, c_a, s_b, c_b)``: ``pow2_prescale`` of each vector (of ``va`` alone unless
    TWO, then repeated), or with PRESCALED read from ``scales_ptr`` (the ring-products
    launch's)."""
    if PRESCALED:
        sa = tl.load(scales_ptr)
        ca = tl.load(scales_ptr + 1)
    else:
        sa, ca = pow2_prescale(va_ptr, N)
    sb, cb = sa, ca
    if TWO:
        if PRESCALED:
            sb = tl.load(scales_ptr + 2)
            cb = tl.load(scales_ptr + 3)
        else:
            sb, cb = pow2_prescale(vb_ptr, N)
    return sa, ca, sb, cb


@triton.jit
def word_products(base, rows, mask_r, va_ptr, vb_ptr, sa, sb, BR: tl.constexpr,
                  N: tl.constexpr, E: tl.constexpr, TWO: tl.constexpr):
    """Per-word partial products of BR stored rows read as int32 words of E elements (8:
    NVFP4 nibbles, ``e2m1_word_scaled``; 4: fp8 bytes, ``e4m3_word_scaled``, NaN bytes
    flagged) with the vectors ``va * sa`` (and ``vb * sb`` when TWO): two (BR, N / E) fp32
    tiles; element i of word wi is vector entry E wi + i. Each thread reads 16-byte runs."""
    WN: tl.constexpr = N // E
    wi = tl.arange(0, WN)
    w = tl.load(base.to(tl.pointer_type(tl.int32)) + rows[:, None] * WN + wi[None, :],
                mask=mask_r[:, None], other=0, eviction_policy=STREAM)
    aa = tl.zeros((BR, WN), dtype=tl.float32)
    ab = tl.zeros((BR, WN), dtype=tl.float32)
    for i in tl.static_range(E):
        if E == 8:
            v = e2m1_word_scaled(w, i)
        else:
            v = e4m3_word_scaled(w, i)
            if i == 0:
                v = tl.where(e4m3_word_nans(w) != 0, float("nan"), v)
        aa += v * (tl.load(va_ptr + E * wi + i).to(tl.float32) * sa)[None, :]
        if TWO:
            ab += v * (tl.load(vb_ptr + E * wi + i).to(tl.float32) * sb)[None, :]
    return aa, ab


@triton.jit
def pow2_prescale_of(v):
    """``pow2_prescale`` of a loaded vector, or of each row of a (rows, N) tile (the
    ring-products launch forms it once per row and group / key head, so the non-flush
    programs of every head read two floats)."""
    m = tl.max(tl.abs(v), len(v.shape) - 1)
    e = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF
    se = tl.minimum(tl.maximum(318 - e, 127), 252)
    return (se << 23).to(tl.float32, bitcast=True), ((380 - se) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_lut_value(code, lut_ptr):
    """4-bit codes -> fp32 through a 16-entry table (served from L1)."""
    return tl.load(lut_ptr + code)


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """With PDL: let the next launch in the stream, if it was launched with programmatic
    dependent launch, start now instead of when this grid ends (``griddepcontrol
    .launch_dependents``). Its programs must ``wait_prior_grid`` before they read anything
    this grid writes."""
    if PDL:
        if _PTX:
            gdc_launch_dependents()


@triton.jit
def wait_prior_grid(PDL: tl.constexpr):
    """With PDL: block until the previous launch in the stream has finished and its writes
    are visible (``griddepcontrol.wait``). Under the interpreter programs run one launch after
    another, so there is nothing to wait for."""
    if PDL:
        if _PTX:
            gdc_wait()


@triton.jit
def prefetch_l2(ptrs, mask):
    """Ask L2 for the lines at ``ptrs`` where ``mask`` holds (``prefetch.global.L2``): no
    register receives them, so a later load of the same lines finds them in L2 without the
    prefetch holding registers meanwhile. Nothing under the interpreter."""
    if _PTX:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_records(ptrs, live, n, BR: tl.constexpr):
    """``prefetch_l2`` of the first ``n`` (at most BR) elements after each record pointer of
    ``ptrs`` (LB,) where ``live``: one request per 128-byte line."""
    LINE: tl.constexpr = 1024 // ptrs.dtype.element_ty.primitive_bitwidth
    NSEG: tl.constexpr = (BR + LINE - 1) // LINE
    seg = tl.arange(0, NSEG) * LINE
    prefetch_l2(ptrs[:, None] + seg[None, :], live[:, None] & (seg[None, :] < n))


@triton.jit
def e2m1_words_fp16(x):
    """NVFP4 words (int32, each repeated over its word's eight positions: x[.., 8 w + p] =
    word w) -> fp16 (.., 8 w + p) = E2M1 value of nibble ``e2m1_word_nibble(p)`` times 2^-6.

    On the GPU one PTX block per word: seven integer operations place the eight nibbles
    into E4M3 bytes (sign to bit 7, exponent and mantissa bits to bits 2-4, so the byte's
    value is the E2M1 value times 2^-6, code 1 the subnormal 2^-7), the low nibbles' bytes
    in one register and the high nibbles' in another, and four hardware fp8 -> fp16x2
    conversions unpack them; byte order makes the positions hold nibbles 0, 2, 4, 6, 1, 3,
    5, 7. Against ``e2m1_word_scaled`` (three integer operations per element) the integer
    pipe, which bounds an NVFP4 non-flush step, does less than half the work."""
    if _PTX:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 lo, hi, t; .reg .b16 a0, a1, a2, a3;\n"
            "shl.b32 lo, $4, 4; and.b32 lo, lo, 0x80808080;\n"
            "shl.b32 t, $4, 2; and.b32 t, t, 0x1C1C1C1C; or.b32 lo, lo, t;\n"
            "and.b32 hi, $4, 0x80808080; shr.b32 t, $4, 2; and.b32 t, t, 0x1C1C1C1C;\n"
            "or.b32 hi, hi, t; mov.b32 {a0, a1}, lo; mov.b32 {a2, a3}, hi;\n"
            "cvt.rn.f16x2.e4m3x2 $0, a0; cvt.rn.f16x2.e4m3x2 $1, a1;\n"
            "cvt.rn.f16x2.e4m3x2 $2, a2; cvt.rn.f16x2.e4m3x2 $3, a3; }",
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [x], dtype=tl.float16, is_pure=True, pack=8)
    else:
        nib = e2m1_word_nibble(tl.arange(0, x.shape[len(x.shape) - 1]) % 8)
        return (e2m1_value((x >> (4 * nib)) & 15) * 0.015625).to(tl.float16)


@triton.jit
def e2m1_word_nibble(pos):
    """The nibble of a word that ``e2m1_words_fp16`` puts at position ``pos`` (0..7)."""
    return 2 * (pos % 4) + pos // 4


# Columns of the vector-pieces matrix an NVFP4 tensor-core product reads (``nvfp4_mma_dot``):
# tl.dot's smallest N. Vector a's three fp16 pieces are columns 0-2, vector b's 3-5.
MMA_COLS: tl.constexpr = tl.constexpr(16)


@triton.jit
def mma_vector_pieces(v_ptr, out_ptr, scale_ptr, COL0: tl.constexpr, N: tl.constexpr,
                      ZERO_REST: tl.constexpr = False):
    """Store vector ``v`` (N entries) as three fp16 pieces in columns COL0 .. COL0 + 2 of an
    (N, MMA_COLS) fp16 matrix at ``out_ptr`` (with ZERO_REST, zeros in every column after
    them, so the product loads whole rows), row f holding entry
    ``8 (f // 8) + e2m1_word_nibble(f % 8)`` (the order ``e2m1_words_fp16`` decodes a row's
    words in), and at ``scale_ptr`` the factor that undoes the prescale and the decode's 2^-6.

    Why: a row's NVFP4 codes times their block scale are exact in fp16, so a tensor-core
    product of the decoded tile with these pieces forms every state row's dot product with
    ``v`` at once, with exact products and fp32 accumulation, where the fp32 path spends a
    conversion and an FMA per element. A power of two brings max |v| (finite entries) into
    [2^14, 2^15); the pieces are fp16 roundings of what the earlier ones leave. Three hold an
    fp32 entry exactly from 2^-16 of the largest entry up (a bf16 entry from 2^-32), and
    any smaller one to within 2^-39 of the largest (fp16's smallest step), which moves a dot
    product far less than its fp32 rounding does. A non-finite entry keeps its value in the
    first piece and zeros in the others, so the products carry inf / NaN as the fp32 dot
    product does."""
    f = tl.arange(0, N)
    v = tl.load(v_ptr + (f // 8) * 8 + e2m1_word_nibble(f % 8)).to(tl.float32)
    e = (tl.max(finite_abs(v), axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    se = tl.minimum(tl.maximum(268 - e, 1), 253)  # 2^(se - 127) max |v| in [2^14, 2^15)
    x = v * (se << 23).to(tl.float32, bitcast=True)
    p0 = x.to(tl.float16)
    r1 = tl.where(tl.abs(x) < float("inf"), x - p0.to(tl.float32), 0.0)
    p1 = r1.to(tl.float16)
    p2 = (r1 - p1.to(tl.float32)).to(tl.float16)
    row = out_ptr + f * MMA_COLS + COL0
    tl.store(row, p0)
    tl.store(row + 1, p1)
    tl.store(row + 2, p2)
    if ZERO_REST:
        col = tl.arange(0, MMA_COLS)
        tl.store(out_ptr + f[:, None] * MMA_COLS + col[None, :],
                 tl.zeros((N, MMA_COLS), dtype=tl.float16), mask=(col >= COL0 + 3)[None, :])
    tl.store(scale_ptr, ((254 - se) << 23).to(tl.float32, bitcast=True) * 64.0)


@triton.jit
def e2m1_rows_fp16(base, rows, mask_r, BR: tl.constexpr, N: tl.constexpr):
    """BR stored NVFP4 rows' codes read as int32 words and decoded through E4M3 bytes
    (``e2m1_words_fp16``): fp16 (BR, N), E2M1 value times 2^-6, position 8 w + p holding
    nibble ``e2m1_word_nibble(p)`` of word w."""
    WN: tl.constexpr = N // 8
    wi = tl.arange(0, WN)
    w = tl.load(base.to(tl.pointer_type(tl.int32)) + rows[:, None] * WN + wi[None, :],
                mask=mask_r[:, None], other=0, eviction_policy=STREAM)
    w2 = tl.join(w, w)
    return e2m1_words_fp16(tl.reshape(tl.join(tl.join(w2, w2), tl.join(w2, w2)), (BR, N)))


@triton.jit
def nvfp4_mma_operand(base, bscale_base, rows, mask_r, BR: tl.constexpr, N: tl.constexpr):
    """BR stored NVFP4 rows as the fp16 (BR, N) operand of ``nvfp4_mma_dot``: each row's
    int32 words decoded through E4M3 bytes (``e2m1_words_fp16``: E2M1 value times 2^-6, in
    its nibble order) times the block's E4M3 scale, a product exact in fp16 (at most six
    significant bits, from 2^-16 up to 42). A NaN block scale makes its block NaN."""
    NB: tl.constexpr = N // 16
    v = e2m1_rows_fp16(base, rows, mask_r, BR, N)
    blk = tl.arange(0, NB)
    bs = tl.load(bscale_base + rows[:, None] * NB + blk[None, :], mask=mask_r[:, None],
                 other=0.0)
    if _PTX:  # fp8 -> fp16 in one conversion per pair, NaN kept
        bs = bs.to(tl.float16)
    else:
        bs = fp8_value(bs).to(tl.float16)
    return tl.reshape(tl.reshape(v, (BR, NB, 16)) * bs[:, :, None], (BR, N))


@triton.jit
def nvfp4_mma_rows_dot(base, rscale_base, bscale_base, rows, mask_r, pieces_ptr, scales_ptr,
                       BR: tl.constexpr, N: tl.constexpr, TWO: tl.constexpr,
                       PDL: tl.constexpr):
    """``rows_dot`` of BR stored NVFP4 rows on tensor cores: the rows decoded
    (``nvfp4_mma_operand``), then, once the launch that wrote the vectors' pieces is done
    (``wait_prior_grid`` with PDL: the codes' loads and decode overlap it), their product
    with the pieces (``nvfp4_mma_dot``)."""
    a = nvfp4_mma_operand(base, bscale_base, rows, mask_r, BR, N)
    wait_prior_grid(PDL)
    return nvfp4_mma_dot(a, rscale_base, rows, mask_r, pieces_ptr, scales_ptr, N, TWO)


@triton.jit
def nvfp4_mma_dot(a, rscale_base, rows, mask_r, pieces_ptr, scales_ptr, N: tl.constexpr,
                  TWO: tl.constexpr):
    """(S @ va, S @ vb) of the rows ``nvfp4_mma_operand`` decoded into ``a``, on tensor cores:
    ``a`` times the (N, MMA_COLS) pieces matrix of the vectors (``mma_vector_pieces``; vb's
    only when TWO, else ``yb`` is ``ya``), each vector's columns summed, times its factor
    from ``scales_ptr`` and the row scale."""
    col = tl.arange(0, MMA_COLS)
    f = tl.arange(0, N)
    B = tl.load(pieces_ptr + f[:, None] * MMA_COLS + col[None, :])
    if _BF16_MMA:
        acc = tl.dot(a, B)
    else:  # the interpreter: the same exact products, accumulated in fp32
        acc = tl.dot(a.to(tl.float32), B.to(tl.float32), input_precision="ieee")
    rs = tl.load(rscale_base + rows, mask=mask_r, other=0.0)
    ya = tl.sum(tl.where((col < 3)[None, :], acc, 0.0), axis=1) * (tl.load(scales_ptr) * rs)
    if TWO:
        yb = tl.sum(tl.where((col >= 3)[None, :], acc, 0.0), axis=1) * (
            tl.load(scales_ptr + 1) * rs)
    else:
        yb = ya
    return ya, yb


@triton.jit
def rows_dot(base, rscale_base, bscale_base, rows, mask_r, va_ptr, vb_ptr, lut_ptr,
             FMT: tl.constexpr, BR: tl.constexpr, N: tl.constexpr, TWO: tl.constexpr,
             LUT: tl.constexpr, scales_ptr=None, PRESCALED: tl.constexpr = False,
             E4M3: tl.constexpr = False, WORDS8: tl.constexpr = False):
    """(S @ va, S @ vb) for BR stored state rows (``vb`` only when TWO), fp32 throughout.

    NVFP4 rows are never dequantized as a tile: the per-16 block scale multiplies each
    block's partial dot product, and the row scale the row's. By default the codes come from
    int32 words as value * 2^-126 (``e2m1_word_scaled``) against a vector prescaled by a power
    of two (``pow2_prescale``); LUT reads each nibble's value from a 16-entry table instead.
    With PRESCALED the prescales come from ``scales_ptr`` (``s_a, c_a[, s_b, c_b]``, formed by
    the ring-products launch) instead of a reduction over each vector here. E4M3 (one
    vector only) decodes the words through E4M3 bytes (``e2m1_words_fp16``) against the
    vector's entries in the same order (prescaled the same way). WORDS8 reads fp8 rows as
    int32 words decoded in integer ops (``e4m3_word_scaled``) against prescaled vectors, so
    the tile keeps the NVFP4 words' thread arrangement instead of the byte tile's; a word
    holding a NaN byte makes its row's products NaN."""
    if FMT == 4:
        NB: tl.constexpr = N // 16
        blk = tl.arange(0, NB)
        if LUT:
            e8 = tl.arange(0, 8)
            p = tl.load(base + rows[:, None, None] * (N // 2) + blk[None, :, None] * 8
                        + e8[None, None, :], mask=mask_r[:, None, None], other=0,
                        eviction_policy=STREAM).to(tl.int32)
            lo = e2m1_lut_value(p & 15, lut_ptr)
            hi = e2m1_lut_value(p >> 4, lut_ptr)
            ev = 2 * (blk[:, None] * 8 + e8[None, :])
            ae = tl.load(va_ptr + ev).to(tl.float32)
            ao = tl.load(va_ptr + ev + 1).to(tl.float32)
            pa = tl.sum(lo * ae[None] + hi * ao[None], axis=2)
            if TWO:
                be = tl.load(vb_ptr + ev).to(tl.float32)
                bo = tl.load(vb_ptr + ev + 1).to(tl.float32)
                pb = tl.sum(lo * be[None] + hi * bo[None], axis=2)
            else:
                pb = pa
        elif E4M3:  # one vector: decoded through E4M3 bytes (``e2m1_words_fp16``)
            tl.static_assert(not TWO, "rows_dot: the E4M3 decode serves one vector")
            v = e2m1_rows_fp16(base, rows, mask_r, BR, N)
            if PRESCALED:
                sa = tl.load(scales_ptr)
                ca = tl.load(scales_ptr + 1)
            else:
                sa, ca = pow2_prescale(va_ptr, N)
            f = tl.arange(0, N)
            va = tl.load(va_ptr + (f // 8) * 8 + e2m1_word_nibble(f % 8)).to(tl.float32) * sa
            # the values are E2M1 * 2^-6, the vector * sa: ca * 2^-120 = 2^6 / sa undoes both
            pa = tl.sum(tl.reshape(v.to(tl.float32) * va[None, :], (BR, NB, 16)), axis=2) * (
                ca * 7.52316384526264e-37)
            pb = pa
        else:
            # nibble i of word wi is element 8 wi + i; two consecutive words are one block
            sa, ca, sb, cb = vector_prescales(va_ptr, vb_ptr, scales_ptr, N, TWO, PRESCALED)
            aa, ab = word_products(base, rows, mask_r, va_ptr, vb_ptr, sa, sb, BR, N, 8, TWO)
            pa = tl.sum(tl.reshape(aa, (BR, NB, 2)), axis=2) * ca
            if TWO:
                pb = tl.sum(tl.reshape(ab, (BR, NB, 2)), axis=2) * cb
            else:
                pb = pa
        bs = tl.load(bscale_base + rows[:, None] * NB + blk[None, :], mask=mask_r[:, None],
                     other=0.0).to(tl.float32)
        rs = tl.load(rscale_base + rows, mask=mask_r, other=0.0)
        ya = tl.sum(pa * bs, axis=1) * rs
        yb = tl.sum(pb * bs, axis=1) * rs if TWO else ya
        return ya, yb
    elif FMT == 3 and WORDS8:
        sa, ca, sb, cb = vector_prescales(va_ptr, vb_ptr, scales_ptr, N, TWO, PRESCALED)
        aa, ab = word_products(base, rows, mask_r, va_ptr, vb_ptr, sa, sb, BR, N, 4, TWO)
        # the values are e4m3 * 2^-120, the vectors * s: c * 2^-6 = 2^120 / s undoes both
        rs = tl.load(rscale_base + rows, mask=mask_r, other=0.0)
        ya = tl.sum(aa, axis=1) * (ca * 0.015625) * rs
        yb = tl.sum(ab, axis=1) * (cb * 0.015625) * rs if TWO else ya
        return ya, yb
    else:
        n = tl.arange(0, N)
        if FMT == 3:
            S = fp8_value(tl.load(base + rows[:, None] * N + n[None, :], mask=mask_r[:, None],
                                  other=0.0, eviction_policy=STREAM))
        else:
            S = tl.load(base + rows[:, None] * N + n[None, :], mask=mask_r[:, None],
                        other=0.0).to(tl.float32)
        va = tl.load(va_ptr + n).to(tl.float32)
        ya = tl.sum(S * va[None, :], axis=1)
        if TWO:
            vb = tl.load(vb_ptr + n).to(tl.float32)
            yb = tl.sum(S * vb[None, :], axis=1)
        else:
            yb = ya
        if FMT == 3:
            rs = tl.load(rscale_base + rows, mask=mask_r, other=0.0)
            ya = ya * rs
            yb = yb * rs
        return ya, yb


@triton.jit
def log_decay_suffixes(ptr, n, last, LB: tl.constexpr, CAP: tl.constexpr = 0):
    """The n ring log-decays at ``ptr`` (``dt`` or ``g``), zero beyond n, as ``(values, after,
    total, mask)`` over ``arange(LB)``: ``after[j]`` sums the records after j and ``last`` (the
    current token's; 0 for a fold without one), ``total`` all of them. ``after`` is a reverse
    scan of the next records, as the reference's ``suffix_sums``, not ``total - cumsum``: a
    -inf log-decay (a zero decay) then gives zero weights instead of -inf - -inf = NaN, and
    large sums lose no precision to cancellation. With CAP > 0 (the ring's capacity) the
    loads cover all CAP records and do not wait for ``n`` (``ring_records``)."""
    j = tl.arange(0, LB)
    mj = j < n
    d = ring_records(ptr + j, mj, j < CAP, CAP)
    nxt = ring_records(ptr + j + 1, (j + 1) < n, (j + 1) < CAP, CAP)
    after = tl.cumsum(tl.where(j + 1 == n, last, nxt), 0, reverse=True)
    return d, after, tl.sum(d, 0) + last, mj


@triton.jit
def ring_records(ptrs, live, exists, CAP: tl.constexpr):
    """Ring values at ``ptrs``, 0.0 where ``live`` (record before the cursor) is false. With
    CAP > 0 every existing record (``exists``) is loaded and the stale ones are selected away
    afterwards (a select, so a stale NaN stays out): the load then need not wait for the
    cursor that ``live`` is computed from, which at batch 1 is a dependent memory round trip
    on the step's critical path. CAP = 0 loads the live records only."""
    if CAP > 0:
        return tl.where(live, tl.load(ptrs, mask=exists, other=0.0), 0.0)
    else:
        return tl.load(ptrs, mask=live, other=0.0)


@triton.jit
def log_decay_segments(nxt, LB: tl.constexpr):
    """``seg[i, j]`` = the log-decays of records j+1..i summed (0 where j >= i), from ``nxt``
    (LB,), record j + 1's log-decay at position j (0 past the last record): each row is a
    reverse scan of its masked next records, never a difference of prefix sums, so a -inf
    log-decay (a zero decay) gives -inf on the segments that hold it and leaves the others
    exact."""
    j = tl.arange(0, LB)
    return tl.cumsum(tl.where(j[None, :] + 1 <= j[:, None], nxt[None, :], 0.0), axis=1,
                     reverse=True)


@triton.jit
def unit_lower_inverse(M, LB: tl.constexpr, LOG_LB: tl.constexpr, PREC: tl.constexpr):
    """``(I + M)^-1`` for strictly lower-triangular ``M``: ``M^LB = 0``, so the inverse is
    ``(I - M)(I + M^2)(I + M^4)...`` with log2(LB) factors. It does not depend on the state,
    so the state-dependent part of a window is a few matrix products. ``PREC`` (the products'
    ``input_precision``) has no default: Triton 3.6 fails to compile a helper call that leaves
    a string constexpr to its default (``'str' object has no attribute 'type'``)."""
    j = tl.arange(0, LB)
    eye = (j[:, None] == j[None, :]).to(tl.float32)
    X = -M
    P = eye + X
    for _ in tl.static_range(LOG_LB - 1):
        X = tl.dot(X, X, input_precision=PREC)
        P = tl.dot(P, eye + X, input_precision=PREC)
    return P


_E2M1_TABLES: dict = {}


def e2m1_table(device) -> torch.Tensor:
    """The 16 E2M1 code values (fp32) on ``device``, cached; read by the LUT decode path.
    Building it copies from host memory, which a CUDA-graph capture does not allow: the
    first ``lut=True`` step runs outside capture."""
    import torch

    from ..formats import E2M1_VALUES

    key = str(device)
    if key not in _E2M1_TABLES:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("lut=True: run one decode step outside CUDA-graph capture first "
                               "(the E2M1 table is copied from host memory once per device)")
        vals = list(E2M1_VALUES) + [-v for v in E2M1_VALUES]
        _E2M1_TABLES[key] = torch.tensor(vals, dtype=torch.float32, device=device)
    return _E2M1_TABLES[key]


def lut_table(lut: bool, placeholder: torch.Tensor) -> torch.Tensor:
    """The E2M1 table when the LUT decode runs, else ``placeholder`` (any fp32 tensor of the
    launch: the kernel never reads it), so that the default decode builds nothing and can be
    captured in a CUDA graph on its first call."""
    return e2m1_table(placeholder.device) if lut else placeholder


@triton.jit
def write_state(S, slot, fi, seed, layer, rows, n_idx, mask_r,
                ck, ck_rs, ck_bs, rd, rd_rs, rd_bs,
                CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr,
                BR: tl.constexpr, N: tl.constexpr, hint=None):
    """Write fp32 rows S as the new checkpoint (SR words keyed by slot and flush index ``fi``)
    and, when RD_FMT >= 0, the read copy made from the checkpoint's new value. Pointers are
    already offset to the slot. Returns the number of NaNs written (``count_nans``'s
    ``hint``: the step's per-row output, if any)."""
    elem = rows[:, None] * N + n_idx[None, :]
    r = sr_words_for(seed, layer, slot, fi, elem, CK_FMT) if SR else elem.to(tl.uint32)
    deq, nans = store_rows(S, r, ck, ck_rs, ck_bs, rows, n_idx, mask_r, CK_FMT, SR, BR, N,
                           True, hint)
    if RD_FMT >= 0:
        store_rows(deq, r, rd, rd_rs, rd_bs, rows, n_idx, mask_r, RD_FMT, False, BR, N)
    return nans
