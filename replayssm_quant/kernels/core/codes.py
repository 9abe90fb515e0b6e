"""NVFP4 (E2M1 codes, E4M3 block scales) and FP8 row encode and decode as Triton device
functions, including the integer word decodes the narrow non-flush steps use.

Reference: ``replayssm_quant.formats`` (``encode_nvfp4`` / ``decode_nvfp4``, ``encode_fp8_row``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rounding import PTX, finite_abs, round_fp8, round_grid_rn_value, safe_div


@triton.jit
def fp8_row_encode(x, r, SR: tl.constexpr):
    """Rows of x (BR, N) -> (values on the e4m3 grid as fp32, row scale (BR,))."""
    scale = tl.math.div_rn(tl.max(finite_abs(x), axis=1), 448.0)
    t = x * safe_div(1.0, scale)[:, None]
    t = tl.where(x != x, x, t)
    t = tl.where(tl.abs(x) == float("inf"), x, t)
    return round_fp8(t, r, SR), scale


@triton.jit
def e2m1_rn_code(t, FINITE: tl.constexpr = False):
    """fp32 t -> the 4-bit code of ``round_grid(t, .., 1, 0, 6.0, SR=False)`` (sign in bit 3;
    NaN -> 0, +-inf -> +-6), in about 16 operations instead of rounding then encoding:
    below 1 the grid is {0, 0.5, 1}, so ``2|t| + 2^23`` rounded once by an FMA leaves the
    code (0, 1 or 2) in the low mantissa bits; from 1 up to 6 the code is the exponent and
    top mantissa bit of |t| rounded to one mantissa bit, ties to even, by an integer add.
    FINITE: the caller guarantees no NaN, which saves the select."""
    a = tl.abs(t)
    small = ((a * 2.0 + 8388608.0).to(tl.int32, bitcast=True)) & 3
    bits = tl.minimum(a, 6.0).to(tl.int32, bitcast=True)
    big = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) >> 22) - 252
    idx = tl.where(a < 1.0, small, big)
    code = idx | ((t.to(tl.int32, bitcast=True) >> 28) & 8)
    if not FINITE:
        code = tl.where(t != t, 0, code)
    return code


@triton.jit
def e2m1_sr_code(t, r, FINITE: tl.constexpr = False):
    """fp32 t and 32-bit words r -> the 4-bit code of ``round_grid(t, r, 1, 0, 6.0, SR=True)``
    (NaN -> 0), without the compare chain of encoding the rounded value: from 1 up, 22 fp32
    mantissa bits lie below the E2M1 step, so ``u < frac`` is ``(r >> 10) < those bits``
    and adding ``~r >> 10`` carries exactly when rounding up; clearing them, an integer
    minimum with 6's bits and a shift leave the code (``round_fp8_sr``'s argument). Below 1
    (step 1/2) the recipe's ``floor`` and ``frac`` of ``2|t|`` give 0, 1 or 2 directly.
    FINITE: the caller guarantees no NaN."""
    a = tl.abs(t)
    ab = a.to(tl.int32, bitcast=True)
    carry = ((r ^ 0xFFFFFFFF) >> 10).to(tl.int32, bitcast=True)  # ~r: see round_fp16_sr_wide
    big = (tl.minimum((ab + carry) & -0x400000, 0x40C00000) >> 22) - 252
    t2 = a * 2.0
    fl = tl.floor(t2)
    up = ((r >> 8).to(tl.float32) * 5.9604644775390625e-08) < (t2 - fl)
    small = (fl + up.to(tl.float32)).to(tl.int32)
    idx = tl.where(a < 1.0, small, big)
    code = idx | ((t.to(tl.int32, bitcast=True) >> 28) & 8)
    if not FINITE:
        code = tl.where(t != t, 0, code)
    return code


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
    view throughout so block reductions need no further reshapes.

    The block maxima are integer maxima of the |x| bits (as integers NaN > inf > every
    finite value, ordered like the values). A tile whose values are all finite and whose rows
    are zero or have a maximum of at least 2^-106 (so ``1 / eff`` stays finite and every
    scaled value is finite) skips the NaN and inf handling: no finite-masked maximum, no
    NaN blocks, no inf fix-up, no NaN select in the encode. One maximum over the tile's
    rows decides; any other tile runs the full recipe."""
    NB: tl.constexpr = N // 16
    x3 = tl.reshape(x, (BR, NB, 16))
    blk_bits = tl.max(x3.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
    row_bits = tl.max(blk_bits, axis=1)
    # zero, or (row max bits - 2^-106 bits) below (inf bits - 2^-106 bits), wrapping below
    key = tl.where(row_bits == 0, 0, row_bits - 0x0A800000).to(tl.uint32, bitcast=True)
    if tl.max(key, axis=0) < 0x75000000:
        packed, s, rs, deq = _nvfp4_encode(x3, blk_bits.to(tl.float32, bitcast=True),
                                           blk_bits > 0x7F800000, r, BR, N, SR, True)
    else:
        packed, s, rs, deq = _nvfp4_encode(x3, tl.max(finite_abs(x3), axis=2),
                                           blk_bits > 0x7F800000, r, BR, N, SR, False)
    return packed, s, rs, deq


@triton.jit
def _nvfp4_encode(x3, blk_amax, blk_nan, r, BR: tl.constexpr, N: tl.constexpr,
                  SR: tl.constexpr, FINITE: tl.constexpr):
    """``nvfp4_row_encode`` from the block maxima of finite |x| and the blocks holding a NaN;
    FINITE: the tile holds no NaN or inf and every ``1 / eff`` is finite."""
    NB: tl.constexpr = N // 16
    row_scale = tl.math.div_rn(tl.max(blk_amax, axis=1), 2688.0)
    s = safe_div(blk_amax, 6.0 * row_scale[:, None])
    s = tl.minimum(tl.maximum(s, 0.001953125), 448.0)
    s = round_grid_rn_value(s, 3, -6, 448.0)  # positive and finite here: the value form is exact
    if not FINITE:
        s = tl.where(blk_nan, float("nan"), s)
    eff = s * row_scale[:, None]
    t = x3 * safe_div(1.0, eff)[:, :, None]
    if not FINITE:
        t = tl.where(tl.abs(x3) == float("inf"), x3, t)
    if SR:
        code = e2m1_sr_code(t, tl.reshape(r, (BR, NB, 16)), FINITE)
    else:
        code = e2m1_rn_code(t, FINITE)
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


@triton.jit
def fp8_value(v):
    """fp8 e4m3fn -> fp32. The GPU's conversion maps the NaN bytes (0x7F, 0xFF) to NaN;
    Triton's interpreter maps them to +-480, so there they are mapped back (480 is no e4m3fn
    value)."""
    f = v.to(tl.float32)
    if not PTX:
        f = tl.where(tl.abs(f) == 480.0, float("nan"), f)
    return f


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
def pow2_prescale_of(v):
    """``pow2_prescale`` of a loaded vector, or of each row of a (rows, N) tile (the
    ring-products launch forms it once per row and group / key head, so the non-flush
    programs of every head read two floats)."""
    m = tl.max(tl.abs(v), len(v.shape) - 1)
    e = (m.to(tl.int32, bitcast=True) >> 23) & 0xFF
    se = tl.minimum(tl.maximum(318 - e, 127), 252)
    return (se << 23).to(tl.float32, bitcast=True), ((380 - se) << 23).to(tl.float32, bitcast=True)


@triton.jit
def pow2_prescale(v_ptr, N: tl.constexpr):
    """A power of two ``s`` that brings max |v| near 2^64 (1 for huge, inf or NaN entries),
    and ``2^126 / s``. Products of ``v * s`` with E2M1 values times 2^-126 then stay normal
    floats down to 2^-67 of the largest product, so the dot product is the fp32 one up to
    reduction order, without a multiply per decoded element."""
    return pow2_prescale_of(tl.load(v_ptr + tl.arange(0, N)).to(tl.float32))


@triton.jit
def e2m1_lut_value(code, lut_ptr):
    """4-bit codes -> fp32 through a 16-entry table (served from L1)."""
    return tl.load(lut_ptr + code)


@triton.jit
def e2m1_word_nibble(pos):
    """The nibble of a word that ``e2m1_words_fp16`` puts at position ``pos`` (0..7)."""
    return 2 * (pos % 4) + pos // 4


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
    if PTX:
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


_E2M1_TABLES: dict = {}


def e2m1_table(device) -> torch.Tensor:
    """The 16 E2M1 code values (fp32) on ``device``, cached; read by the LUT decode path.
    Building it copies from host memory, which a CUDA-graph capture does not allow: the
    first ``lut=True`` step runs outside capture."""
    from ...formats import E2M1_VALUES

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
