"""Row products of a narrow (fp8 / NVFP4) state with one or two vectors, as the non-flush steps
form them: word-wise integer decodes, a 16-entry table, or tensor-core products of exact fp16
pieces. Reference: the dequantised state times the vectors (``ssm.replay.load_state``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .codes import (
    e2m1_lut_value,
    e2m1_word_nibble,
    e2m1_word_scaled,
    e2m1_words_fp16,
    e4m3_word_nans,
    e4m3_word_scaled,
    fp8_value,
    pow2_prescale,
)
from .memory import STREAM, wait_prior_grid
from .rounding import PTX, finite_abs
from .state_io import BF16_MMA


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
    if PTX:  # fp8 -> fp16 in one conversion per pair, NaN kept
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
    if BF16_MMA:
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
