"""Triton device functions for exact rounding (RN / SR) onto the fp16, bf16, fp8 and E2M1 grids
and the Philox random stream that keys stochastic rounding.

Each function follows ``replayssm_quant.formats`` step for step (see docs/numerics.md) so that
kernels reproduce the reference bits (reference: ``formats.round_to_format``, ``formats.sr_bits``).
Hopper has no hardware stochastic-rounding conversion, so SR is done in software here.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

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
PTX = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


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
    (fp16 / bf16 targets) counter ``element >> 4`` and byte ``element & 3`` (low to high) of
    word ``(element >> 2) & 3``, moved to the top with bit 23 set (``formats.sr_bits``).

    One Philox call serves four (sixteen) consecutive elements. ``element`` (rank 2 or 3)
    must hold consecutive indices along its last axis in runs aligned to the group (a
    ``(rows, d)`` tile, or a ``(d // 16, rows, 16)`` chunked tile); ``sequence``,
    ``flush_index`` and ``layer`` are scalars. The group counters are the first of every
    group (splits of a ``(.., 2, 2[, 2, 2])`` view: no reduction), and the words go back with
    joins, which compile to fewer layout conversions than a ``tl.min`` over the group or a
    select of broadcast words."""
    RANK: tl.constexpr = len(element.shape)
    GS: tl.constexpr = 16 if HALF else 4
    e = element.to(tl.uint32) >> (4 if HALF else 2)
    if HALF:
        if RANK == 2:
            e = tl.reshape(e, (element.shape[0], element.shape[1] // GS, 2, 2, 2, 2))
        else:
            tl.static_assert(RANK == 3, "sr_words: element must have rank 2 or 3")
            e = tl.reshape(e, (element.shape[0], element.shape[1], element.shape[2] // GS,
                               2, 2, 2, 2))
        g, _ = tl.split(e)
        g, _ = tl.split(g)
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
    if HALF:  # [..., a, b, c, d]: byte 2c + d of word 2a + b to element 16g + 4 (2a + b) + 2c + d
        b0, b1, b2, b3 = word_bytes(w)
        w = tl.join(tl.join(b0, b2), tl.join(b1, b3))
    return tl.reshape(w, element.shape)


@triton.jit
def word_bytes(w):
    """The four bytes of uint32 words w (low to high), each moved to the top 8 bits with bit 23
    set (half its unit: ``formats.BYTE_SR_BIAS_BOUND``). On the GPU one byte permute
    (``prmt``) per byte, which takes the low three bytes from the constant 0x00800000, in
    place of a shift, a mask and an or."""
    if PTX:
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $4, 0x00800000, 0x0654; prmt.b32 $1, $4, 0x00800000, 0x1654;\n"
            "prmt.b32 $2, $4, 0x00800000, 0x2654; prmt.b32 $3, $4, 0x00800000, 0x3654;",
            "=r,=r,=r,=r,r", [w], dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
            is_pure=True, pack=1)
    else:
        top = 0xFF000000
        half = 0x00800000
        return ((w << 24) | half, ((w << 16) & top) | half, ((w << 8) & top) | half,
                (w & top) | half)


@triton.jit
def sr_words_for(seed, layer, sequence, flush_index, element, FMT: tl.constexpr):
    """``sr_words`` with the word width SR onto format FMT takes (8 bits for fp16 / bf16)."""
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
    conventional step, bound by latency at 80 against 72 registers, was up to 6% slower."""
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
    elif PTX:
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
