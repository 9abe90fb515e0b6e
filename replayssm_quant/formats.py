"""Number formats and rounding: the ground truth every kernel is checked against.

Pure torch, any device. Every quantizer here is *exact*: it maps an fp32 value onto the target
grid with integer/power-of-two arithmetic only, so a Triton kernel that follows the same recipe
produces the same bits (see ``docs/numerics.md``).

Element rounding (fp16, fp8 e4m3/e5m2, E2M1): for ``|x|`` with binary exponent ``e`` (clamped
below at the format's ``emin``) the grid step is ``q = 2^(e - m)`` (``m`` mantissa bits). With
``t = |x| / q`` (exact: ``q`` is a power of two), ``fl = floor(t)`` and ``frac = t - fl`` (exact):

* ``rn``: round up iff ``frac > 1/2`` or (``frac == 1/2`` and ``fl`` is odd): ties to even;
* ``sr``: round up iff ``u < frac`` with ``u = (r >> 8) * 2^-24`` from a 32-bit random word ``r``.

bf16 shares fp32's exponent range and uses the equivalent integer form on the fp32 bits:
``rn``: ``bits + 0x7FFF + ((bits >> 16) & 1)``, ``sr``: ``bits + (r >> 16)``, then the low
16 bits are cleared. Results above the format's max finite value saturate to it; NaN stays NaN.

Random words come from Philox-4x32-10 with key ``seed`` (64 bit: low word, high word): one call
with counter ``(element >> 2, sequence, flush_index, layer)`` yields the words of the four
consecutive elements ``4c .. 4c + 3``, and element ``e`` takes output word ``e & 3``. This is
``triton.language.random.philox(seed, element >> 2, sequence, flush_index, layer)[element & 3]``
bit for bit. fp16 and bf16 targets take 8 random bits (``sr_bits(..., half=True)``): one call
serves sixteen elements, each taking one byte of a word with a half-unit below it, which keeps
the rounding bias under 2^-9 of the target's unit in the last place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "BYTE_SR_BIAS_BOUND",
    "FORMATS",
    "Format",
    "QTensor",
    "ROUNDINGS",
    "E2M1_VALUES",
    "canonical_format",
    "dequantize",
    "fake_quantize",
    "half_words",
    "philox4x32",
    "quantize",
    "round_elements",
    "sr_bits",
    "state_sr_bits",
]

ROUNDINGS = ("rn", "sr")

# fp32 bit patterns
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class Format:
    """A storage format for state rows.

    ``mantissa``/``emin``/``max_finite`` describe the element grid (ignored for fp32 and bf16,
    which use their own exact paths); ``row_scaled`` formats carry one FP32 scale per state
    row; ``block`` is the length of a sub-row block with its own E4M3 scale (NVFP4).
    """

    name: str
    bits: int
    mantissa: int
    emin: int
    max_finite: float
    dtype: torch.dtype
    row_scaled: bool = False
    block: int = 0

    @property
    def narrow(self) -> bool:
        """True for formats narrower than FP32 (they need rounding)."""
        return self.name != "fp32"

    def row_bytes(self, n: int) -> float:
        """Bytes one state row of ``n`` elements occupies, scales included."""
        b = n * self.bits / 8
        if self.row_scaled:
            b += 4
        if self.block:
            b += n // self.block  # one E4M3 byte per block
        return b


FORMATS: dict[str, Format] = {
    "fp32": Format("fp32", 32, 23, -126, 3.4028234663852886e38, torch.float32),
    "fp16": Format("fp16", 16, 10, -14, 65504.0, torch.float16),
    "bf16": Format("bf16", 16, 7, -126, 3.3895313892515355e38, torch.bfloat16),
    "fp8e4m3": Format("fp8e4m3", 8, 3, -6, 448.0, torch.float8_e4m3fn, row_scaled=True),
    "fp8e5m2": Format("fp8e5m2", 8, 2, -14, 57344.0, torch.float8_e5m2, row_scaled=True),
    "nvfp4": Format("nvfp4", 4, 1, 0, 6.0, torch.uint8, row_scaled=True, block=16),
}
_ALIASES = {"fp8": "fp8e4m3", "e4m3": "fp8e4m3", "e5m2": "fp8e5m2", "float32": "fp32",
            "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "fp4": "nvfp4"}

# E2M1 magnitudes by 3-bit code; bit 3 of a nibble is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E4M3 = None  # filled lazily (needs FORMATS)
NVFP4_ROW_DIVISOR = 6.0 * 448.0  # row_scale = row_amax / (6 * 448)
NVFP4_BLOCK_SCALE_MIN = 2.0**-9


def canonical_format(name: str) -> Format:
    """Look up a format by name or alias; one clear error for an unknown one."""
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in FORMATS:
        known = ", ".join(list(FORMATS) + sorted(_ALIASES))
        raise ValueError(f"unknown number format {name!r}; known formats: {known}")
    return FORMATS[key]


# ----------------------------------------------------------------------------------------------
# Philox-4x32-10 (Triton's generator), in int64 tensors holding uint32 words.
# ----------------------------------------------------------------------------------------------
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85
_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57


def _mul32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product of constant ``a`` and uint32 words ``b``."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    p1 = b * a_hi  # < 2^48
    p0 = b * a_lo  # < 2^48
    hi = (p1 + (p0 >> 16)) >> 16
    lo = (((p1 & 0xFFFF) << 16) + p0) & _MASK32
    return hi & _MASK32, lo


def philox4x32(c0, c1, c2, c3, seed: int, rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """Philox-4x32 with Triton's constants; counters are int tensors/ints of uint32 values."""
    tensors = [t for t in (c0, c1, c2, c3) if isinstance(t, torch.Tensor)]
    dev = tensors[0].device if tensors else torch.device("cpu")
    shape = torch.broadcast_shapes(*[t.shape for t in tensors]) if tensors else ()

    def word(v) -> torch.Tensor:
        t = torch.as_tensor(v, dtype=torch.int64, device=dev)
        return (t & _MASK32).expand(shape).clone()

    x0, x1, x2, x3 = (word(v) for v in (c0, c1, c2, c3))
    seed = int(seed)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2^63), got {seed}")
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(rounds):
        hi_b, lo_b = _mul32(_PHILOX_ROUND_B, x2)
        hi_a, lo_a = _mul32(_PHILOX_ROUND_A, x0)
        x0, x1, x2, x3 = hi_b ^ x1 ^ k0, lo_b, hi_a ^ x3 ^ k1, lo_a
        k0 = (k0 + _PHILOX_KEY_A) & _MASK32
        k1 = (k1 + _PHILOX_KEY_B) & _MASK32
    return x0, x1, x2, x3


HALF_WORD_FORMATS = ("fp16", "bf16")

# 8-bit SR words: the byte goes to bits 24..31 and bit 23 (half its unit) is set, so the draw
# ``u = (r >> 8) * 2^-24`` takes the 256 midpoints ``(2k + 1) / 512``. ``P(round up) =
# #{k: u_k < frac} / 256`` is then ``frac`` rounded to a multiple of 2^-8: the mean rounding
# error is at most 2^-9 of the target's step (zero when ``frac`` is a multiple of 2^-8, and
# ``frac == 0`` never rounds up). bf16's ``bits + (r >> 16)`` rounds up iff ``u_k >= 1 - frac``:
# the same bound.
_BYTE_HALF_UNIT = 0x00800000
BYTE_SR_BIAS_BOUND = 2.0**-9


def half_words(fmt: Format | str) -> bool:
    """Whether SR onto ``fmt`` is a half-precision target (fp16 / bf16), which takes 8-bit
    random words, sixteen per Philox call (bias at most ``BYTE_SR_BIAS_BOUND`` of a step)."""
    name = fmt.name if isinstance(fmt, Format) else canonical_format(fmt).name
    return name in HALF_WORD_FORMATS


def _bytes(w: torch.Tensor) -> torch.Tensor:
    """``(..., ) -> (..., 4)``: a word's four bytes, low to high, each moved to the top and
    given the half-unit bit below it."""
    top = 0xFF000000
    return torch.stack([(w << 24) & top, (w << 16) & top, (w << 8) & top, w & top],
                       dim=-1) | _BYTE_HALF_UNIT


def sr_bits(seed: int, layer: int, sequence, flush_index, element, half: bool = False
            ) -> torch.Tensor:
    """The 32-bit random words for stochastic rounding of elements ``element`` (int64 tensor).

    One Philox call per group of four consecutive elements: counter
    ``(element >> 2, sequence, flush_index, layer)``, output word ``element & 3``. With
    ``half`` (fp16 / bf16 targets, 8 random bits each) one call serves sixteen elements:
    counter ``element >> 4``, word ``(element >> 2) & 3``, its byte ``element & 3`` (low
    to high) placed in the word's top 8 bits, with bit 23 set (``BYTE_SR_BIAS_BOUND``).
    """
    element = torch.as_tensor(element, dtype=torch.int64)
    words = philox4x32(element >> (4 if half else 2), sequence, flush_index, layer, seed)
    shape = words[0].shape
    stacked = torch.stack(words, dim=-1)
    if half:
        stacked = _bytes(stacked).flatten(-2)  # index 4 * word + byte
        lane = element & 15
    else:
        lane = element & 3
    lane = lane.to(words[0].device).expand(shape)
    return stacked.gather(-1, lane.unsqueeze(-1)).squeeze(-1)


def state_sr_bits(
    shape: tuple[int, ...],
    seed: int,
    layer: int,
    sequence: torch.Tensor,
    flush_index: torch.Tensor,
    device=None,
    half: bool = False,
) -> torch.Tensor:
    """Random words for a whole state ``(batch, *row_dims, n)``.

    ``element`` is the flat index of the element inside one sequence's state of this layer
    (row-major over ``shape[1:]``); ``sequence`` and ``flush_index`` are per batch row. Equal to
    ``sr_bits`` on those indices; when ``n`` is a multiple of the group (4, or 16 with
    ``half``) each Philox call is made once for its group.
    """
    per_seq = 1
    for s in shape[1:]:
        per_seq *= s
    device = device if device is not None else sequence.device
    view = (-1,) + (1,) * (len(shape) - 1)
    seq = sequence.to(device=device, dtype=torch.int64).view(view)
    fl = flush_index.to(device=device, dtype=torch.int64).view(view)
    group = 16 if half else 4
    if len(shape) >= 2 and shape[-1] % group == 0:
        groups = torch.arange(per_seq // group, device=device, dtype=torch.int64)
        groups = groups.view(1, *shape[1:-1], shape[-1] // group)
        words = torch.stack(philox4x32(groups, seq, fl, layer, seed), dim=-1)
        if half:
            words = _bytes(words)
        return words.reshape(words.shape[0], *shape[1:])
    elem = torch.arange(per_seq, device=device, dtype=torch.int64).view(1, *shape[1:])
    return sr_bits(seed, layer, seq, fl, elem, half)


# ----------------------------------------------------------------------------------------------
# Element rounding onto a grid.
# ----------------------------------------------------------------------------------------------
def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as fp32 for integer k in [-126, 127], built from the exponent bits (exact)."""
    return ((k.to(torch.int32) + 127) << 23).view(torch.float32)


def _uniform(r: torch.Tensor) -> torch.Tensor:
    """u = (r >> 8) * 2^-24: 24 random bits as an exact fp32 in [0, 1)."""
    return (r >> 8).to(torch.float32) * (2.0**-24)


def round_elements(
    x: torch.Tensor,
    fmt: Format | str,
    rounding: str = "rn",
    r: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round fp32 ``x`` onto ``fmt``'s element grid; returns fp32 values on the grid.

    Saturates to +-max finite (inf too); NaN stays NaN. ``r`` holds 32-bit random words
    (any int dtype holding the uint32 value) and is required for ``rounding="sr"``.
    """
    fmt = canonical_format(fmt) if isinstance(fmt, str) else fmt
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; use one of {ROUNDINGS}")
    if rounding == "sr" and r is None:
        raise ValueError("stochastic rounding needs random words r")
    x = x.to(torch.float32)
    if fmt.name == "fp32":
        return x.clone()
    ax = x.abs()
    if fmt.name == "bf16":
        bits = ax.view(torch.int32).to(torch.int64)
        if rounding == "rn":
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
        else:
            bits = bits + ((r.to(torch.int64) & _MASK32) >> 16)
        bits = bits & 0xFFFF0000
        bits = torch.clamp(bits, max=0x7F7F0000)  # saturate (incl. inf) to bf16 max finite
        q = bits.to(torch.int32).view(torch.float32)
    else:
        e = ((ax.view(torch.int32) >> 23) & 0xFF) - 127
        e = torch.clamp(e, min=fmt.emin, max=127)
        t = ax * _pow2(fmt.mantissa - e)
        fl = torch.floor(t)
        frac = t - fl
        if rounding == "rn":
            odd = torch.remainder(fl, 2.0) == 1.0
            up = (frac > 0.5) | ((frac == 0.5) & odd)
        else:
            up = _uniform(r.to(torch.int64) & _MASK32) < frac
        q = (fl + up.to(torch.float32)) * _pow2(e - fmt.mantissa)
        q = torch.clamp(q, max=fmt.max_finite)  # inf -> max finite too
    q = torch.copysign(q, x)
    return torch.where(torch.isnan(x), x, q)


# ----------------------------------------------------------------------------------------------
# Row-level quantization: the stored form of state rows.
# ----------------------------------------------------------------------------------------------
@dataclass
class QTensor:
    """Quantized state rows (last dim is the row).

    ``data``: fp32/fp16/bf16/fp8 values, or packed E2M1 nibbles (uint8, ``n/2`` per row) for
    NVFP4. ``row_scale``: fp32 per row (fp8, nvfp4). ``block_scale``: E4M3 per 16 elements
    (nvfp4). ``nan_count``: NaNs seen on the way in (device scalar, no host sync).
    """

    fmt: Format
    data: torch.Tensor
    row_scale: torch.Tensor | None = None
    block_scale: torch.Tensor | None = None
    nan_count: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        s = tuple(self.data.shape)
        return s[:-1] + (s[-1] * 2,) if self.fmt.name == "nvfp4" else s


def _finite_amax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """max |x| over finite entries (NaN and inf ignored), 0 for a row without any."""
    ax = torch.where(torch.isfinite(x), x.abs(), torch.zeros((), dtype=x.dtype, device=x.device))
    return ax.amax(dim=dim)


def _nan_count(x: torch.Tensor) -> torch.Tensor:
    return torch.isnan(x).sum()


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den with IEEE RN division, and 0 where den == 0 (empty rows)."""
    one = torch.ones((), dtype=den.dtype, device=den.device)
    return torch.where(den > 0, num / torch.where(den > 0, den, one), torch.zeros_like(num))


def _div_const(x: torch.Tensor, c: float) -> torch.Tensor:
    """x / c correctly rounded on every device: torch's CUDA division by a Python scalar
    multiplies by the reciprocal instead, which is one ulp off for about a fifth of the
    values (and then decides E2M1 ties differently from the kernels' ``div_rn``)."""
    return x / torch.full_like(x, c)


def _safe_recip(den: torch.Tensor) -> torch.Tensor:
    """1 / den (IEEE RN), 0 where den == 0 (empty rows/blocks) or den is NaN. Elements are
    scaled by multiplying with this reciprocal: one division per row or block, not per
    element, which is what makes the kernels' encoders cheap."""
    ok = den > 0
    return torch.where(ok, 1.0 / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den))


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """fp32 values already on the E2M1 grid -> 4-bit codes (uint8, one per element)."""
    mag = v.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for i, val in enumerate(E2M1_VALUES):
        code = torch.where(mag == val, torch.full_like(code, i), code)
    sign = torch.signbit(v).to(torch.uint8) << 3
    return code | sign


def decode_e2m1(code: torch.Tensor) -> torch.Tensor:
    """4-bit codes -> fp32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)
    mag = table[(code & 7).long()]
    return torch.where((code & 8) > 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Element 2i in the low nibble, 2i+1 in the high nibble (torch.float4_e2m1fn_x2 order)."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def nvfp4_scales(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row_scale fp32, block_scale as fp32 on the E4M3 grid, effective scale per block).

    row_scale = row_amax / (6*448); block scale = clamp(block_amax / (6*row_scale),
    2^-9, 448) rounded to E4M3 (RN); a block holding a NaN gets a NaN scale; effective
    per-block scale = fp32(block_scale * row_scale).
    """
    n = x.shape[-1]
    blocks = x.reshape(*x.shape[:-1], n // 16, 16)
    row_amax = _finite_amax(x)
    row_scale = _div_const(row_amax, NVFP4_ROW_DIVISOR)
    blk_amax = _finite_amax(blocks)
    den = (6.0 * row_scale).unsqueeze(-1)
    s = _safe_div(blk_amax, den)
    s = torch.clamp(s, NVFP4_BLOCK_SCALE_MIN, 448.0)
    s = round_elements(s, FORMATS["fp8e4m3"], "rn")
    has_nan = torch.isnan(blocks).any(dim=-1)
    s = torch.where(has_nan, torch.full_like(s, float("nan")), s)
    eff = s * row_scale.unsqueeze(-1)
    return row_scale, s, eff


def quantize(
    x: torch.Tensor,
    fmt: Format | str,
    rounding: str = "rn",
    r: torch.Tensor | None = None,
) -> QTensor:
    """Quantize state rows ``x`` (last dim = row) into ``fmt``.

    fp16/bf16: elementwise. fp8: one FP32 scale per row, ``row_amax / max_finite``; the
    scaled values are rounded. nvfp4: see :func:`nvfp4_scales`; E2M1 codes packed two per
    byte. ``r`` (random words, same shape as ``x``) for ``rounding="sr"``.
    """
    fmt = canonical_format(fmt) if isinstance(fmt, str) else fmt
    x = x.to(torch.float32)
    if r is not None and r.shape != x.shape:
        raise ValueError(f"random words shape {tuple(r.shape)} != values shape {tuple(x.shape)}")
    nans = _nan_count(x)
    if fmt.name in ("fp32", "fp16", "bf16"):
        v = round_elements(x, fmt, rounding, r)
        return QTensor(fmt, v.to(fmt.dtype), nan_count=nans)
    if fmt.name.startswith("fp8"):
        row_scale = _div_const(_finite_amax(x), fmt.max_finite)
        t = x * _safe_recip(row_scale).unsqueeze(-1)
        t = torch.where(torch.isnan(x), x, t)
        t = torch.where(torch.isinf(x), x, t)  # inf saturates
        v = round_elements(t, fmt, rounding, r)
        return QTensor(fmt, v.to(fmt.dtype), row_scale=row_scale, nan_count=nans)
    if fmt.name == "nvfp4":
        n = x.shape[-1]
        if n % 32:
            raise ValueError(f"nvfp4 rows need a length divisible by 32 (16-blocks, pairs); got {n}")
        row_scale, s, eff = nvfp4_scales(x)
        blocks = x.reshape(*x.shape[:-1], n // 16, 16)
        t = blocks * _safe_recip(eff).unsqueeze(-1)
        t = torch.where(torch.isinf(blocks), blocks, t)
        t = t.reshape(x.shape)
        v = round_elements(t, fmt, rounding, r)
        v = torch.where(torch.isnan(v), torch.zeros_like(v), v)  # NaN lives in the block scale
        codes = encode_e2m1(v)
        return QTensor(fmt, pack_nibbles(codes), row_scale=row_scale,
                       block_scale=s.to(torch.float8_e4m3fn), nan_count=nans)
    raise AssertionError(fmt)


def dequantize(q: QTensor) -> torch.Tensor:
    """Stored rows -> fp32 values (the values every reader of the state sees)."""
    fmt = q.fmt
    if fmt.name in ("fp32", "fp16", "bf16"):
        return q.data.to(torch.float32)
    if fmt.name.startswith("fp8"):
        return q.data.to(torch.float32) * q.row_scale.unsqueeze(-1)
    codes = unpack_nibbles(q.data)
    vals = decode_e2m1(codes)
    n = vals.shape[-1]
    eff = q.block_scale.to(torch.float32) * q.row_scale.unsqueeze(-1)
    out = vals.reshape(*vals.shape[:-1], n // 16, 16) * eff.unsqueeze(-1)
    return out.reshape(vals.shape)


def fake_quantize(
    x: torch.Tensor, fmt: Format | str, rounding: str = "rn", r: torch.Tensor | None = None
) -> torch.Tensor:
    """dequantize(quantize(x)): the fp32 value a reader of the stored state sees."""
    return dequantize(quantize(x, fmt, rounding, r))
