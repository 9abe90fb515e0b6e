"""Loading and storing state rows in every storage format (fp32 / fp16 / bf16 / fp8 / NVFP4 with
their scales), the exact bf16-piece products, NaN counting, and the checkpoint + read-copy write
of a flush. Reference: ``replayssm_quant.ssm.replay`` (``store_state`` / ``load_state``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from .codes import e2m1_word_scaled, fp8_row_encode, fp8_value, nvfp4_row_decode, nvfp4_row_encode
from .rounding import round_to, sr_words_for


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
    Nemotron-3-Super, 441.4 -> 407.9 on Nano-4B (commit 62b8b26)."""
    return (x.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)


# Triton's interpreter multiplies bf16 dot operands wrongly, so there the bf16 pieces are
# multiplied as fp32 (the same exact products, the same fp32 accumulation)
BF16_MMA = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def _bf16_dot(a, b, acc):
    if BF16_MMA:
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
    pays the exact count. Measured on the H200 at batch 256: conventional fp16-SR steps 566 -> 498 us
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
