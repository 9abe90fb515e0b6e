"""The stochastic-rounding random stream, pinned bit for bit (docs/numerics.md, "The random
stream"): element ``e`` takes word ``e & 3`` of Philox-4x32-10 with counter
``(e >> 2, sequence, flush_index, layer)`` and key ``seed``. Checked against Triton's own
``tl.philox`` (interpreted) and between the reference (``formats.sr_bits``) and the kernels'
``sr_words`` for rank-2 and rank-3 element tiles. fp16 / bf16 targets take 8-bit words: one
call per sixteen elements, byte ``e & 3`` of word ``(e >> 2) & 3`` moved to the top with the
half-unit bit below it, which bounds the rounding bias by 2^-9 of a step."""

import os

import pytest
import torch
import triton
import triton.language as tl
from triton.language.random import philox

from replayssm_quant import formats as F
from replayssm_quant.kernels.core.rounding import sr_words

SEED = 0x2F6A_91C3_5D07_B4E1  # uses both key words
# the kernel tests also run compiled on a GPU (TRITON_INTERPRET=0), where the byte words take
# the byte permute of ``word_bytes``
DEV = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available() else "cpu"


@triton.jit
def _philox_kernel(c0_ptr, c1_ptr, c2_ptr, c3_ptr, out_ptr, seed, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    c0 = tl.load(c0_ptr + i).to(tl.uint32)
    c1 = tl.load(c1_ptr + i).to(tl.uint32)
    c2 = tl.load(c2_ptr + i).to(tl.uint32)
    c3 = tl.load(c3_ptr + i).to(tl.uint32)
    r0, r1, r2, r3 = philox(seed, c0, c1, c2, c3)
    tl.store(out_ptr + i, r0.to(tl.int64))
    tl.store(out_ptr + BLOCK + i, r1.to(tl.int64))
    tl.store(out_ptr + 2 * BLOCK + i, r2.to(tl.int64))
    tl.store(out_ptr + 3 * BLOCK + i, r3.to(tl.int64))


def _triton_philox(c0, c1, c2, c3, seed):
    """The four words of ``tl.philox(seed, c0, c1, c2, c3)`` (uint32 values in int64)."""
    n = c0.numel()
    out = torch.empty(4 * n, dtype=torch.int64)
    _philox_kernel[(1,)](c0, c1, c2, c3, out, seed, BLOCK=n)
    return out.view(4, n)


@triton.jit
def _words2_kernel(out_ptr, seq_ptr, seed, layer, fi, ROW0, R: tl.constexpr, N: tl.constexpr,
                   HALF: tl.constexpr):
    """``sr_words`` on a ``(rows, N)`` tile starting at row ROW0 (as the decode kernels)."""
    rows = ROW0 + tl.arange(0, R)
    n = tl.arange(0, N)
    elem = rows[:, None] * N + n[None, :]
    seq = tl.load(seq_ptr)
    r = sr_words(seed, layer, seq, fi, elem, HALF)
    tl.store(out_ptr + tl.arange(0, R)[:, None] * N + n[None, :], r.to(tl.int64))


@triton.jit
def _words3_kernel(out_ptr, seq_ptr, seed, layer, fi, ROW0, R: tl.constexpr, N: tl.constexpr,
                   HALF: tl.constexpr):
    """``sr_words`` on a ``(N // 16, rows, 16)`` chunked tile (as the emulator kernels)."""
    KC: tl.constexpr = N // 16
    rows = tl.arange(0, R)
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    col = c[:, None, None] * 16 + d[None, None, :]
    elem = (ROW0 + rows)[None, :, None] * N + col
    seq = tl.load(seq_ptr)
    r = sr_words(seed, layer, seq, fi, elem, HALF)
    tl.store(out_ptr + rows[None, :, None] * N + col, r.to(tl.int64))


def test_reference_philox_matches_triton():
    """``formats.philox4x32`` is Triton's Philox-4x32-10, all four words, full 32-bit range."""
    g = torch.Generator().manual_seed(0)
    c = [torch.randint(0, 2**32, (256,), generator=g, dtype=torch.int64) for _ in range(4)]
    ours = torch.stack(F.philox4x32(*c, SEED))
    assert torch.equal(ours, _triton_philox(*c, SEED))


def test_sr_bits_matches_triton_philox():
    """``sr_bits(e) = tl.philox(seed, e >> 2, sequence, flush_index, layer)[e & 3]`` on random
    element indices (any order, full uint32 range) and random keys."""
    g = torch.Generator().manual_seed(1)
    n = 512
    e = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    e[:64] = torch.randint(0, 4096, (64,), generator=g)  # small indices too
    seq = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    fl = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    layer = 37
    words = _triton_philox(e >> 2, seq, fl, torch.full_like(e, layer), SEED)
    want = words.gather(0, (e & 3)[None]).squeeze(0)
    assert torch.equal(F.sr_bits(SEED, layer, seq, fl, e), want)


def test_sr_bits_known_answer():
    """Elements 4c .. 4c+3 are the four outputs of one Philox call, in order; with every key
    and counter word 0, elements 0..3 are the Random123 known-answer vector."""
    r = F.sr_bits(0, 0, 0, 0, torch.arange(8))
    assert r[:4].tolist() == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    c = torch.tensor([0, 1, 5, 12345, 2**30 - 1])
    words = torch.stack(F.philox4x32(c, 9, 4, 3, SEED))  # (4, groups)
    elems = 4 * c[:, None] + torch.arange(4)  # (groups, 4)
    assert torch.equal(F.sr_bits(SEED, 3, 9, 4, elems), words.T)
    # neighbouring groups differ, and so do the four words of one group
    assert len(set(F.sr_bits(SEED, 3, 9, 4, torch.arange(64)).tolist())) == 64


def test_half_words_known_answer():
    """8-bit words: elements 16c .. 16c+15 are the four bytes (low to high) of one call's four
    words in order, each in the top 8 bits with bit 23 set (bf16's ``bits + (r >> 16)`` and
    the grid rounding's ``(r >> 8) * 2^-24`` then see a byte and half its unit)."""
    c = torch.tensor([0, 3, 77, 2**28 - 1])
    words = torch.stack(F.philox4x32(c, 9, 4, 3, SEED)).T  # (groups, 4)
    shifts = torch.tensor([24, 16, 8, 0])
    want = ((words[:, :, None] << shifts) & 0xFF000000 | 0x800000).flatten(1)
    elems = 16 * c[:, None] + torch.arange(16)
    got = F.sr_bits(SEED, 3, 9, 4, elems, half=True)
    assert torch.equal(got, want)
    assert (got & 0xFFFFFF).eq(0x800000).all()
    assert len(set(F.sr_bits(SEED, 3, 9, 4, torch.arange(4096), half=True).tolist())) == 256


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("shape", [(3, 2, 4, 32), (2, 8, 64), (2, 3, 6)])
def test_state_sr_bits_is_sr_bits_on_flat_indices(shape, half):
    """The whole-state helper (one call per group when ``n % 4 == 0``) equals ``sr_bits`` on
    the row-major element index, per batch row's sequence and flush index."""
    B = shape[0]
    seq = torch.tensor([5, 1, 7])[:B]
    fl = torch.tensor([0, 2, 3])[:B]
    got = F.state_sr_bits(shape, SEED, 2, seq, fl, half=half)
    per = torch.arange(torch.Size(shape[1:]).numel()).view(1, *shape[1:])
    view = (-1,) + (1,) * (len(shape) - 1)
    assert got.shape == shape
    assert torch.equal(got, F.sr_bits(SEED, 2, seq.view(view), fl.view(view), per, half))


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("R,N,row0", [(8, 32, 0), (4, 64, 37), (16, 128, 3)])
def test_kernel_sr_words_match_reference(rank, R, N, row0, half):
    """``kernels.core.rounding.sr_words`` (one Philox call per four elements) equals ``sr_bits``
    exactly, for ``(rows, N)`` and ``(N // 16, rows, 16)`` element tiles."""
    seq, layer, fi = 123456, 5, 77
    out = torch.empty(R * N, dtype=torch.int64, device=DEV)
    kern = _words2_kernel if rank == 2 else _words3_kernel
    kern[(1,)](out, torch.tensor([seq], dtype=torch.int32, device=DEV), SEED, layer, fi, row0,
               R=R, N=N, HALF=half)
    want = F.sr_bits(SEED, layer, seq, fi, torch.arange(row0 * N, (row0 + R) * N), half)
    assert torch.equal(out.cpu(), want)


_STEP = {"fp16": 2.0**-10, "bf16": 2.0**-7}  # the grid step at 1.0


def _keep_bits(r: torch.Tensor, bits: int) -> torch.Tensor:
    """Words cut to their top ``bits`` random bits with the half-unit bit below them."""
    keep = ((1 << bits) - 1) << (32 - bits)
    return (r & keep) | (1 << (31 - bits))


def _mean_error(fmt: str, frac: float, r: torch.Tensor) -> tuple[float, float]:
    """SR of ``1 + frac * step`` onto ``fmt`` with words ``r`` (one per element): the mean
    rounding error and its standard error, in steps."""
    x = torch.full(r.shape, 1.0 + frac * _STEP[fmt])
    q = F.dequantize(F.quantize(x, fmt, "sr", r)).double()
    err = (q - x.double()) / _STEP[fmt]
    return err.mean().item(), err.std().item() / err.numel() ** 0.5


_FRACS = [1 / 32, 3 / 512, 0.3, 511 / 512, 0.0]  # fp16 keeps multiples of 2^-13


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_half_words_bias_within_bound(fmt):
    """Over 2^18 draws of the real stream (one state), SR of a fixed value between two grid
    points lands on it on average within ``BYTE_SR_BIAS_BOUND`` of a step plus 4 standard
    errors; a value on the grid never moves. The same measurement on words cut to 4 bits (bias
    up to 2^-5 of a step) fails the bound, so the check can tell."""
    shape = (1, 256, 1024)
    r = F.state_sr_bits(shape, SEED, 1, torch.tensor([2]), torch.tensor([5]), half=True)
    tol = F.BYTE_SR_BIAS_BOUND
    for frac in _FRACS:
        mean, se = _mean_error(fmt, frac, r)
        assert abs(mean) <= tol + 4 * se, (frac, mean, se)
    assert _mean_error(fmt, 0.0, r)[0] == 0.0
    mean4, se4 = _mean_error(fmt, 1 / 32, _keep_bits(r, 4))
    assert abs(mean4) > tol + 4 * se4


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_half_words_bias_bound_is_exact(fmt):
    """The bound holds exactly: the byte is uniform over its 256 values, so averaging the
    rounding over all of them is the expectation. For every fraction an fp32 value can have
    at 1.0 (fp16: all multiples of 2^-13; bf16: every seventh multiple of 2^-16) the mean
    error is at most 2^-9 of a step, reaches it, and is zero on multiples of 2^-8."""
    frac_bits = 13 if fmt == "fp16" else 16
    k = torch.arange(0, 2**frac_bits, 1 if fmt == "fp16" else 7)
    frac = k.double() / 2**frac_bits
    r = (torch.arange(256, dtype=torch.int64) << 24) | 0x800000
    x = (1.0 + frac * _STEP[fmt]).float()[:, None].expand(-1, 256)
    q = F.dequantize(F.quantize(x, fmt, "sr", r.expand_as(x).contiguous())).double()
    bias = ((q - x.double()) / _STEP[fmt]).mean(dim=1)
    assert bias.abs().max().item() == pytest.approx(F.BYTE_SR_BIAS_BOUND, rel=1e-9)
    on_byte = (k % (2 ** (frac_bits - 8))) == 0
    assert bias[on_byte].abs().max().item() < 1e-12
