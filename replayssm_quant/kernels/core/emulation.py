"""Whole-sequence emulator kernels: one launch per layer runs a teacher-forced sequence with
the decode numerics of a precision config (what ``ssm.mamba2.emulate`` / ``ssm.gdn.emulate``
compute token by token with ``decode_step``).

Grid ``(batch row, head, tile of state rows)``. State rows never mix, so a program owns its
tile for the whole sequence and keeps it in registers as fp32 values: the checkpoint's
*dequantized* value ``S`` and, with a read copy, the read copy's dequantized value ``R``. Every
reader of a stored state sees only those values, so no encoding is ever written: a program
reads its inputs, writes its outputs and, at the end, ``S_final``. Memory is O(batch x state)
plus inputs and outputs; nothing is kept per token.

* Conventional configs (``L == 1``, ``_*_conv_kernel``): a ``(rows, d)`` tile, one token per
  step, the output from the fp32 state, then ``S`` rounded with SR key ``flush_index = t + 1``.
  A loop iteration does four tokens while the next four tokens' loads are in flight (their
  addresses do not depend on the state), so a step costs only its arithmetic. Small tiles
  (default 4 rows, one warp) give many programs at batch 1.
* ReplaySSM configs (``L > 1``, ``_*_window_kernel``): one window of ``L`` tokens per step,
  padded to ``LB = max(16, next_pow2(L))``. Every non-flush output of the window comes at once
  in chunk form from ``R`` (Mamba-2: ``Y = G (R C^T) + X (W o (C B^T))^T``; GDN: the window's
  ``u`` through the UT transform, ``U = beta (V - G (R K^T)) (I + M)^-T``, then
  ``O = G (R Q^T) + U (D o (Q K^T))^T``); the flush folds the window into ``S`` (GDN: the
  ``u``'s recomputed from ``S`` when a read copy exists), its output comes from the folded
  fp32 state, and ``S`` / ``R`` are re-quantized with the reference's rounding (checkpoint SR
  key ``flush_index = window + 1``; read copy RN from the new checkpoint's value). A sequence
  that ends mid-window leaves records pending: ``S_final`` folds them as ``state_value`` does.
  GDN splits a window in two launches: what does not depend on the state (the decay sums,
  ``(I + M)^-T``, ``(I + M)^-T W^T``, the fold weights) is computed for every window of a
  segment of the sequence at once, fully parallel; the sequential scan then reads those
  records, so its chain per window is a few products. Segments bound the records' memory.
  Tiles are 16 rows and are held as ``(d // 16, rows, 16)`` chunks: every product over the
  state dimension is a batched ``tl.dot`` with K = 16 plus a sum over chunks (Triton's fp32
  dot keeps each thread's whole K extent in registers, so K = 128 would spill), and NVFP4's
  16-element blocks are the last axis.

Arithmetic is fp32 throughout (``input_precision="ieee"``); results differ from the reference
only by float32 order (chunked products, the UT transform instead of sequential substitution,
fused multiply-adds). Decay sums follow the reference's rule: the log-decay from record ``i`` to
token ``j`` is ``d_{i+1} + ... + d_j`` accumulated from ``d_j`` backwards.

This module holds what the Mamba-2 and GDN emulators (``mamba2/emulate.py``,
``gdn/emulate.py``) share: the SR words of a flush, the fake quantisation of a state, decay sums
and triangular-matrix rows of a window, and input preparation.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...precision import PrecisionConfig, parse_config
from .codes import fp8_row_encode, nvfp4_row_encode
from .rounding import (
    FMT_CODES,
    FMT_NONE,
    finite_abs,
    round_grid,
    round_grid_rn_value,
    round_to,
    safe_div,
    sr_words_for,
)

MAX_KERNEL_L = 32  # a window's records live in registers: L = 64 spills heavily when compiled


# ----------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def emulation_words(seed, layer, seq, flush_index, elem, SR: tl.constexpr, CK: tl.constexpr):
    """SR random words of the tile for checkpoint format CK (unused placeholders for RN)."""
    if SR:
        return sr_words_for(seed, layer, seq, flush_index, elem, CK)
    else:
        return elem.to(tl.uint32)


@triton.jit
def fake_quant(S, r, FMT: tl.constexpr, SR: tl.constexpr, BR: tl.constexpr, N: tl.constexpr):
    """What a reader of rows ``S (BR, N)`` stored in FMT sees: quantize, then dequantize, in
    registers (the same recipe as ``store_rows``)."""
    if FMT == 4:
        _, _, _, deq = nvfp4_row_encode(S, r, BR, N, SR)
        return deq
    elif FMT == 3:
        v, rs = fp8_row_encode(S, r, SR)
        return v * rs[:, None]
    else:
        return round_to(S, r, FMT, SR, False)  # fp16 SR: the narrow form measured faster here


@triton.jit
def fake_quant3(S, r, FMT: tl.constexpr, SR: tl.constexpr):
    """``fake_quant`` for rows held as ``(n // 16, rows, 16)`` chunks (rows on axis 1, NVFP4
    blocks on axis 2): the recipe of ``fp8_row_encode`` / ``nvfp4_row_encode`` step for step,
    with the row maximum taken over both chunk axes (a reshape to 2D would cost a layout
    conversion per window)."""
    if FMT == 4:
        ax = finite_abs(S)
        blk_amax = tl.max(ax, axis=2)  # (KC, BR)
        row_scale = tl.math.div_rn(tl.max(blk_amax, axis=0), 2688.0)
        s = safe_div(blk_amax, 6.0 * row_scale[None, :])
        s = tl.minimum(tl.maximum(s, 0.001953125), 448.0)
        s = round_grid(s, s.to(tl.uint32, bitcast=True), 3, -6, 448.0, False)
        blk_nan = tl.max((S != S).to(tl.int32), axis=2) > 0
        s = tl.where(blk_nan, float("nan"), s)
        eff = s * row_scale[None, :]
        t = S * safe_div(1.0, eff)[:, :, None]
        if SR:
            t = tl.where(tl.abs(S) == float("inf"), S, t)
            v = round_grid(t, r, 1, 0, 6.0, True)
        else:  # an inf's t is inf (saturates) or, in an all-zero block, NaN (value 0 * 0)
            v = round_grid_rn_value(t, 1, 0, 6.0)
        v = tl.where(v != v, 0.0, v)
        return v * eff[:, :, None]
    elif FMT == 3:
        scale = tl.math.div_rn(tl.max(tl.max(finite_abs(S), axis=2), axis=0), 448.0)
        t = S * safe_div(1.0, scale)[None, :, None]
        t = tl.where(tl.abs(S) == float("inf"), S, t)
        if SR:
            t = tl.where(S != S, S, t)
            v = round_grid(t, r, 3, -6, 448.0, True)
        else:  # NaN * a finite reciprocal stays NaN
            v = round_grid_rn_value(t, 3, -6, 448.0)
        return v * scale[None, :, None]
    elif FMT == 1:  # the float recipe: the integer one's tile-wide test costs barriers here
        if SR:
            return round_grid(S, r, 10, -14, 65504.0, True)
        else:
            return round_grid_rn_value(S, 10, -14, 65504.0)
    else:
        return round_to(S, r, FMT, SR)


@triton.jit
def decay_sums(d, ds, LB: tl.constexpr):
    """Exclusive suffix sums of a window's log-decays for every token ``j`` of the window.

    ``d[m]`` is the log-decay of record ``m``, ``ds[m] = d[m + 1]``. Returns ``excl (LB, LB)``
    with ``excl[j, i] = d_{i+1} + ... + d_j`` and ``tot (LB,)`` with ``tot[j] = d_0 + ... + d_j``,
    both accumulated from ``d_j`` backwards (the reference's order)."""
    j = tl.arange(0, LB)
    excl = tl.cumsum(tl.where(j[None, :] < j[:, None], ds[None, :], 0.0), axis=1, reverse=True)
    d0 = tl.sum(tl.where(j == 0, d, 0.0), axis=0)
    tot = tl.sum(tl.where(j[None, :] == 0, excl, 0.0), axis=1) + d0
    return excl, tot


@triton.jit
def lower_row(M, r, LB: tl.constexpr):
    """Row ``r`` (run-time index) of an (LB, LB) tile."""
    j = tl.arange(0, LB)
    return tl.sum(tl.where(j[:, None] == r, M, 0.0), axis=0)


@triton.jit
def lower_entry(v, r, LB: tl.constexpr):
    """Entry ``r`` (run-time index) of an (LB,) vector."""
    return tl.sum(tl.where(tl.arange(0, LB) == r, v, 0.0), axis=0)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def format_code(f) -> int:
    return FMT_NONE if f is None else FMT_CODES[f.name]


def pow2_dim(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def window_sizes(L: int) -> tuple[int, int]:
    LB = max(16, triton.next_power_of_2(L))
    return LB, int(math.log2(LB))


def prepare_emulation(cfg, n: int, S0, state_shape, sequence, layer: int, seed: int, act_dtype,
             device) -> tuple[PrecisionConfig, torch.Tensor, torch.Tensor]:
    from ...ssm.replay import check_act_dtype, check_common, check_tensor, make_sr_sequence

    cfg = parse_config(cfg)
    check_common(layer, seed, 0, n)
    check_act_dtype(act_dtype)
    seq = make_sr_sequence(sequence, n, device).contiguous()
    if S0 is None:
        S0 = torch.zeros(state_shape, dtype=torch.float32, device=device)
    else:
        check_tensor("S0", S0, state_shape, (torch.float32, torch.float64, torch.float16,
                                             torch.bfloat16), device)
        S0 = S0.to(torch.float32).contiguous()
    return cfg, S0, seq
