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
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..precision import PrecisionConfig, parse_config
from .core.codes import fp8_row_encode, nvfp4_row_encode
from .core.rounding import (
    FMT_CODES,
    FMT_NONE,
    finite_abs,
    round_grid,
    round_grid_rn_value,
    round_to,
    safe_div,
    sr_words_for,
)
from .core.sums import unit_lower_inverse

__all__ = ["MAX_KERNEL_L", "gdn_emulate", "gdn_supported", "mamba2_emulate", "mamba2_supported"]

MAX_KERNEL_L = 32  # a window's records live in registers: L = 64 spills heavily when compiled
_PREP_BYTES = 256 << 20  # GDN window records held at once (a segment of the sequence)
_PREP_MAX_GRID = 32768  # windows per segment (the launch grid's third axis)
_MERGE_RQ = True  # GDN windows: R [k_j | q_j] (and S k_j with a read copy) as one product


# ----------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _words(seed, layer, seq, flush_index, elem, SR: tl.constexpr, CK: tl.constexpr):
    """SR random words of the tile for checkpoint format CK (unused placeholders for RN)."""
    if SR:
        return sr_words_for(seed, layer, seq, flush_index, elem, CK)
    else:
        return elem.to(tl.uint32)


@triton.jit
def _fake_quant(S, r, FMT: tl.constexpr, SR: tl.constexpr, BR: tl.constexpr, N: tl.constexpr):
    """What a reader of rows ``S (BR, N)`` stored in FMT sees: quantize, then dequantize, in
    registers (the same recipe as ``store_rows``)."""
    if FMT == 4:
        _, _, _, deq = nvfp4_row_encode(S, r, BR, N, SR)
        return deq
    elif FMT == 3:
        v, rs = fp8_row_encode(S, r, SR)
        return v * rs[:, None]
    else:
        return round_to(S, r, FMT, SR, False)  # fp16 SR as measured in reports/emulate


@triton.jit
def _fake_quant3(S, r, FMT: tl.constexpr, SR: tl.constexpr):
    """``_fake_quant`` for rows held as ``(n // 16, rows, 16)`` chunks (rows on axis 1, NVFP4
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
def _decay_sums(d, ds, LB: tl.constexpr):
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
def _row(M, r, LB: tl.constexpr):
    """Row ``r`` (run-time index) of an (LB, LB) tile."""
    j = tl.arange(0, LB)
    return tl.sum(tl.where(j[:, None] == r, M, 0.0), axis=0)


@triton.jit
def _entry(v, r, LB: tl.constexpr):
    """Entry ``r`` (run-time index) of an (LB,) vector."""
    return tl.sum(tl.where(tl.arange(0, LB) == r, v, 0.0), axis=0)


# ----------------------------------------------------------------------------------------------
# Gated DeltaNet. Per-program base pointers (``qb`` ...) point at token 0 of this program's
# sequence and head; ``SK``/``SV`` are the token strides of q, k and of v, o.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _gdn_token(qb, kb, vb, gb, bb, t, T, vv, mv, kk, SK: tl.constexpr, SV: tl.constexpr,
               HV: tl.constexpr):
    """One token's inputs (zeros past the end of the sequence)."""
    tt = t.to(tl.int64)
    ok = t < T
    mk = (kk * 0 + t) < T
    q = tl.load(qb + tt * SK + kk, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(kb + tt * SK + kk, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(vb + tt * SV + vv, mask=mv & ((vv * 0 + t) < T), other=0.0).to(tl.float32)
    g = tl.load(gb + tt * HV, mask=ok, other=0.0)
    be = tl.load(bb + tt * HV, mask=ok, other=0.0)
    return q, k, v, g, be


@triton.jit
def _gdn_conv_step(S, q, k, v, g, be, ob, t, vv, mv, r,
                   SV: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, CK: tl.constexpr,
                   SR: tl.constexpr):
    """Conventional step: output from the fp32 state, then the state rounded to the ckpt
    with the SR words ``r`` (drawn ahead by the caller: they do not depend on the state)."""
    a = tl.exp(g)
    sk = tl.sum(S * k[None, :], axis=1)
    u = be * (v - a * sk)
    S = a * S + u[:, None] * k[None, :]
    o = tl.sum(S * q[None, :], axis=1)
    tl.store(ob + t.to(tl.int64) * SV + vv, o, mask=mv)
    return _fake_quant(S, r, CK, SR, BV, K)


@triton.jit(do_not_specialize=["T", "seed", "layer"])
def _gdn_conv_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s0_ptr, seq_ptr, o_ptr, sf_ptr, T, seed, layer,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr, BV: tl.constexpr,
    CK: tl.constexpr, SR: tl.constexpr,
):
    SK: tl.constexpr = HK * K
    SV: tl.constexpr = HV * V
    b = tl.program_id(0)
    h = tl.program_id(1)
    vt = tl.program_id(2)
    hk = h // (HV // HK)
    vv = vt * BV + tl.arange(0, BV)
    mv = vv < V
    kk = tl.arange(0, K)
    elem = (h * V + vv)[:, None] * K + kk[None, :]
    seq = tl.load(seq_ptr + b)
    base = b.to(tl.int64) * T
    qb = q_ptr + base * SK + hk * K
    kb = k_ptr + base * SK + hk * K
    vb = v_ptr + base * SV + h * V
    gb = g_ptr + base * HV + h
    bb = beta_ptr + base * HV + h
    ob = o_ptr + base * SV + h * V
    sb = b.to(tl.int64) * (HV * V * K)
    S = tl.load(s0_ptr + sb + elem, mask=mv[:, None], other=0.0)
    S = _fake_quant(S, _words(seed, layer, seq, seq * 0, elem, SR, CK), CK, SR, BV, K)
    z = T * 0
    q0, k0, v0, g0, b0 = _gdn_token(qb, kb, vb, gb, bb, z, T, vv, mv, kk, SK, SV, HV)
    q1, k1, v1, g1, b1 = _gdn_token(qb, kb, vb, gb, bb, z + 1, T, vv, mv, kk, SK, SV, HV)
    q2, k2, v2, g2, b2 = _gdn_token(qb, kb, vb, gb, bb, z + 2, T, vv, mv, kk, SK, SV, HV)
    q3, k3, v3, g3, b3 = _gdn_token(qb, kb, vb, gb, bb, z + 3, T, vv, mv, kk, SK, SV, HV)
    for c in range(T // 4):
        t = z + c * 4  # a tensor index also when interpreted
        # the next four tokens' loads are in flight while these four are computed
        nq0, nk0, nv0, ng0, nb0 = _gdn_token(qb, kb, vb, gb, bb, t + 4, T, vv, mv, kk, SK, SV, HV)
        nq1, nk1, nv1, ng1, nb1 = _gdn_token(qb, kb, vb, gb, bb, t + 5, T, vv, mv, kk, SK, SV, HV)
        nq2, nk2, nv2, ng2, nb2 = _gdn_token(qb, kb, vb, gb, bb, t + 6, T, vv, mv, kk, SK, SV, HV)
        nq3, nk3, nv3, ng3, nb3 = _gdn_token(qb, kb, vb, gb, bb, t + 7, T, vv, mv, kk, SK, SV, HV)
        # the four tokens' SR words do not depend on the state: drawn first, they overlap
        # the steps' dependent reductions
        r0 = _words(seed, layer, seq, t + 1, elem, SR, CK)
        r1 = _words(seed, layer, seq, t + 2, elem, SR, CK)
        r2 = _words(seed, layer, seq, t + 3, elem, SR, CK)
        r3 = _words(seed, layer, seq, t + 4, elem, SR, CK)
        S = _gdn_conv_step(S, q0, k0, v0, g0, b0, ob, t, vv, mv, r0, SV, K, BV, CK, SR)
        S = _gdn_conv_step(S, q1, k1, v1, g1, b1, ob, t + 1, vv, mv, r1, SV, K, BV, CK, SR)
        S = _gdn_conv_step(S, q2, k2, v2, g2, b2, ob, t + 2, vv, mv, r2, SV, K, BV, CK, SR)
        S = _gdn_conv_step(S, q3, k3, v3, g3, b3, ob, t + 3, vv, mv, r3, SV, K, BV, CK, SR)
        q0, k0, v0, g0, b0 = nq0, nk0, nv0, ng0, nb0
        q1, k1, v1, g1, b1 = nq1, nk1, nv1, ng1, nb1
        q2, k2, v2, g2, b2 = nq2, nk2, nv2, ng2, nb2
        q3, k3, v3, g3, b3 = nq3, nk3, nv3, ng3, nb3
    t = (T // 4) * 4
    if t < T:
        S = _gdn_conv_step(S, q0, k0, v0, g0, b0, ob, t, vv, mv,
                           _words(seed, layer, seq, t + 1, elem, SR, CK), SV, K, BV, CK, SR)
    if t + 1 < T:
        S = _gdn_conv_step(S, q1, k1, v1, g1, b1, ob, t + 1, vv, mv,
                           _words(seed, layer, seq, t + 2, elem, SR, CK), SV, K, BV, CK, SR)
    if t + 2 < T:
        S = _gdn_conv_step(S, q2, k2, v2, g2, b2, ob, t + 2, vv, mv,
                           _words(seed, layer, seq, t + 3, elem, SR, CK), SV, K, BV, CK, SR)
    tl.store(sf_ptr + sb + elem, S, mask=mv[:, None])


@triton.jit
def _gdn_chunk_loads(qb, kb, t0, cnt, SK: tl.constexpr, K: tl.constexpr, LB: tl.constexpr):
    """The window's keys and queries in the chunked forms the products need: ``kA (KC, LB,
    16)``, ``kB (KC, 16, LB)``, ``qB (KC, 16, LB)`` (zeros after the first ``cnt`` tokens)."""
    KC: tl.constexpr = K // 16
    j = tl.arange(0, LB)
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    mj = j < cnt
    tok = t0.to(tl.int64) + j
    col_a = (c[:, None, None] * 16 + d[None, None, :]).to(tl.int64)
    col_b = (c[:, None, None] * 16 + d[None, :, None]).to(tl.int64)
    kA = tl.load(kb + tok[None, :, None] * SK + col_a, mask=mj[None, :, None], other=0.0)
    kB = tl.load(kb + tok[None, None, :] * SK + col_b, mask=mj[None, None, :], other=0.0)
    qB = tl.load(qb + tok[None, None, :] * SK + col_b, mask=mj[None, None, :], other=0.0)
    return kA.to(tl.float32), kB.to(tl.float32), qB.to(tl.float32)


@triton.jit(do_not_specialize=["T", "w0"])
def _gdn_window_prep_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, pre_ptr, T, w0,
    HV: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, L: tl.constexpr, LB: tl.constexpr,
    LOG_LB: tl.constexpr,
):
    """The part of a window that does not depend on the state, for every (row, head, window)
    at once: ``TI = (I + M)^-T`` (the UT transform: ``U = X TI`` with ``X = beta (V - G R
    K^T)``), ``P = TI W^T`` (the window's outputs: ``O = G R Q^T + X P``), the decays
    ``etot[j] = G(c+1..j)`` and the fold weights ``wf[i] = G(i+1..last)``. Record layout per
    window: TI, P (row-major LB x LB), etot, wf."""
    SK: tl.constexpr = HK * K
    REC: tl.constexpr = 2 * LB * LB + 2 * LB
    b = tl.program_id(0)
    h = tl.program_id(1)
    w = tl.program_id(2)
    nw = tl.num_programs(2)
    hk = h // (HV // HK)
    t0 = (w0 + w) * L
    cnt = tl.minimum(T - t0, L)
    base = b.to(tl.int64) * T
    qb = q_ptr + base * SK + hk * K
    kb = k_ptr + base * SK + hk * K
    kA, kB, qB = _gdn_chunk_loads(qb, kb, t0, cnt, SK, K, LB)
    j = tl.arange(0, LB)
    tok = t0.to(tl.int64) + j
    gw = tl.load(g_ptr + (base + tok) * HV + h, mask=j < cnt, other=0.0)
    gs = tl.load(g_ptr + (base + tok + 1) * HV + h, mask=(j + 1) < cnt, other=0.0)
    bw = tl.load(beta_ptr + (base + tok) * HV + h, mask=j < cnt, other=0.0)
    excl, tot = _decay_sums(gw, gs, LB)
    dec = tl.exp(excl)
    etot = tl.exp(tot)
    KK = tl.sum(tl.dot(kA, kB, input_precision="ieee"), axis=0)  # [j, i] = k_j . k_i
    KQ = tl.sum(tl.dot(kA, qB, input_precision="ieee"), axis=0)  # [i, j] = k_i . q_j
    # u_j + beta_j sum_{i<j} G(i+1..j) (k_i.k_j) u_i = beta_j (v_j - G(c+1..j) R k_j)
    M = tl.where(j[None, :] < j[:, None], bw[:, None] * (dec * KK), 0.0)
    TI = tl.trans(unit_lower_inverse(M, LB, LOG_LB, "ieee"))
    W = tl.where(j[None, :] <= j[:, None], dec * tl.trans(KQ), 0.0)  # [j, i]
    P = tl.dot(TI, tl.trans(W), input_precision="ieee")
    wf = tl.where(j < cnt, _row(dec, cnt - 1, LB), 0.0)
    rec = pre_ptr + ((b * HV + h).to(tl.int64) * nw + w) * REC
    sq = j[:, None] * LB + j[None, :]
    tl.store(rec + sq, TI)
    tl.store(rec + LB * LB + sq, P)
    tl.store(rec + 2 * LB * LB + j, etot)
    tl.store(rec + 2 * LB * LB + LB + j, wf)


@triton.jit
def _gdn_scan_inputs(qb, kb, vb, bb, rec, t0, cnt, vv, mv, SK: tl.constexpr, SV: tl.constexpr,
                     HV: tl.constexpr, K: tl.constexpr, L: tl.constexpr, LB: tl.constexpr):
    """Everything a window's state-dependent part reads: the chunked keys and queries,
    ``v (BV, LB)``, beta, the flush token's q ``(KC, 1, 16)`` and the window's record."""
    KC: tl.constexpr = K // 16
    kA, kB, qB = _gdn_chunk_loads(qb, kb, t0, cnt, SK, K, LB)
    j = tl.arange(0, LB)
    mj = j < cnt
    tok = t0.to(tl.int64) + j
    vw = tl.load(vb + tok[None, :] * SV + vv[:, None], mask=mj[None, :] & mv[:, None], other=0.0)
    bw = tl.load(bb + tok * HV, mask=mj, other=0.0)
    col_a = (tl.arange(0, KC)[:, None, None] * 16 + tl.arange(0, 16)[None, None, :]).to(tl.int64)
    tf = t0.to(tl.int64) + L - 1
    qf = tl.load(qb + tf * SK + col_a, mask=(col_a * 0 + cnt) == L, other=0.0)
    sq = j[:, None] * LB + j[None, :]
    TI = tl.load(rec + sq)
    P = tl.load(rec + LB * LB + sq)
    etot = tl.load(rec + 2 * LB * LB + j)
    wf = tl.load(rec + 2 * LB * LB + LB + j)
    return kA, kB, qB, vw.to(tl.float32), bw, qf.to(tl.float32), TI, P, etot, wf


@triton.jit
def _gdn_window(S, R, kA, kB, qB, vw, bw, qf, TI, P, etot, wf, ob, t0, cnt, nout, vv, mv,
                SV: tl.constexpr, BV: tl.constexpr, KC: tl.constexpr, LB: tl.constexpr,
                FLUSH: tl.constexpr, RD: tl.constexpr, MERGE: tl.constexpr):
    """Outputs of the window's first ``nout`` tokens from the read source ``R``, and the fp32
    state folded over its ``cnt`` records (the flush output from it when FLUSH). States are
    ``(KC, BV, 16)`` chunks; products over d_k are batched over the chunks, then summed."""
    j = tl.arange(0, LB)
    if MERGE and RD >= 0:  # [R; S] [k | q] in one product: rows and columns interleaved
        kqB = tl.reshape(tl.join(kB, qB), (KC, 16, 2 * LB))
        RS = tl.reshape(tl.permute(tl.join(R, S), (0, 1, 3, 2)), (KC, 2 * BV, 16))
        P4 = tl.reshape(tl.sum(tl.dot(RS, kqB, input_precision="ieee"), axis=0),
                        (BV, 2, LB, 2))
        RKQ, SKQ = tl.split(tl.permute(P4, (0, 2, 3, 1)))
        RK, RQ = tl.split(RKQ)
        SKv, _ = tl.split(SKQ)
    elif MERGE:  # R k_j and R q_j in one product: keys and queries interleaved, (KC, 16, 2 LB)
        kqB = tl.reshape(tl.join(kB, qB), (KC, 16, 2 * LB))
        RKQ = tl.sum(tl.dot(R, kqB, input_precision="ieee"), axis=0)
        RK, RQ = tl.split(tl.reshape(RKQ, (BV, LB, 2)))
    else:
        RK = tl.sum(tl.dot(R, kB, input_precision="ieee"), axis=0)  # (BV, LB): R k_j
        RQ = tl.sum(tl.dot(R, qB, input_precision="ieee"), axis=0)
    X = bw[None, :] * (vw - etot[None, :] * RK)
    O = etot[None, :] * RQ + tl.dot(X, P, input_precision="ieee")
    tok = t0.to(tl.int64) + j
    tl.store(ob + tok[None, :] * SV + vv[:, None], O, mask=(j < nout)[None, :] & mv[:, None])
    if RD >= 0:  # a read copy: the fold recomputes every u from the checkpoint
        if not MERGE:
            SKv = tl.sum(tl.dot(S, kB, input_precision="ieee"), axis=0)
        X = bw[None, :] * (vw - etot[None, :] * SKv)
    U = tl.dot(X, TI, input_precision="ieee")
    Uw = tl.broadcast_to((U * wf[None, :])[None, :, :], (KC, BV, LB))
    S = _entry(etot, cnt - 1, LB) * S + tl.dot(Uw, kA, input_precision="ieee")
    if FLUSH:
        o = tl.sum(tl.sum(S * qf, axis=2), axis=0)
        tl.store(ob + (t0.to(tl.int64) + cnt - 1) * SV + vv, o, mask=mv)
    return S


@triton.jit(do_not_specialize=["T", "seed", "layer", "w0", "nfull"])
def _gdn_window_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, pre_ptr, s0_ptr, seq_ptr, o_ptr, sf_ptr, T, seed, layer,
    w0, nfull,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr,
    LB: tl.constexpr, BV: tl.constexpr, CK: tl.constexpr, RD: tl.constexpr, SR: tl.constexpr,
    FIRST: tl.constexpr, TAIL: tl.constexpr, PREFETCH: tl.constexpr, MERGE: tl.constexpr,
):
    """The state-dependent scan over windows ``w0 .. w0 + nfull - 1`` (and the trailing
    partial window when TAIL) of one (row, head, tile of value rows). ``pre`` holds this
    segment's window records; S starts from ``s0`` (quantized to the checkpoint when FIRST,
    else already the checkpoint's value) and ends in ``sf``."""
    SK: tl.constexpr = HK * K
    SV: tl.constexpr = HV * V
    KC: tl.constexpr = K // 16
    REC: tl.constexpr = 2 * LB * LB + 2 * LB
    b = tl.program_id(0)
    h = tl.program_id(1)
    vt = tl.program_id(2)
    hk = h // (HV // HK)
    vv = vt * BV + tl.arange(0, BV)
    mv = vv < V
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    # element (v, 16 c + d) of the head's state, held as chunk c, row v, column d
    elem = (h * V + vv)[None, :, None] * K + c[:, None, None] * 16 + d[None, None, :]
    mrow = mv[None, :, None]
    seq = tl.load(seq_ptr + b)
    base = b.to(tl.int64) * T
    qb = q_ptr + base * SK + hk * K
    kb = k_ptr + base * SK + hk * K
    vb = v_ptr + base * SV + h * V
    bb = beta_ptr + base * HV + h
    ob = o_ptr + base * SV + h * V
    nrec = nfull + TAIL
    pb = pre_ptr + (b * HV + h).to(tl.int64) * nrec * REC
    sb = b.to(tl.int64) * (HV * V * K)
    S = tl.load(s0_ptr + sb + elem, mask=mrow, other=0.0)
    z = T * 0
    if FIRST:
        S = _fake_quant3(S, _words(seed, layer, seq, seq * 0, elem, SR, CK), CK, SR)
    R = S
    if RD >= 0:  # the read copy is a function of the checkpoint's value
        R = _fake_quant3(S, elem.to(tl.uint32), RD, False)
    if PREFETCH:
        kA, kB, qB, vw, bw, qf, TI, P, et, wf = _gdn_scan_inputs(
            qb, kb, vb, bb, pb, w0 * L, tl.minimum(T - w0 * L, L), vv, mv, SK, SV, HV, K, L, LB)
    for i in range(nfull):
        w = w0 + i
        t0 = z + w * L  # a tensor index also when interpreted
        if PREFETCH:  # the next window's loads are in flight while this one is computed
            nkA, nkB, nqB, nvw, nbw, nqf, nTI, nP, net, nwf = _gdn_scan_inputs(
                qb, kb, vb, bb, pb + (i + 1) * REC, t0 + L, tl.minimum(T - t0 - L, L), vv, mv,
                SK, SV, HV, K, L, LB)
        else:
            kA, kB, qB, vw, bw, qf, TI, P, et, wf = _gdn_scan_inputs(
                qb, kb, vb, bb, pb + i * REC, t0, z + L, vv, mv, SK, SV, HV, K, L, LB)
        r = _words(seed, layer, seq, z + w + 1, elem, SR, CK)  # independent of the state
        S = _gdn_window(S, R, kA, kB, qB, vw, bw, qf, TI, P, et, wf, ob, t0, L, L - 1, vv, mv,
                        SV, BV, KC, LB, True, RD, MERGE)
        S = _fake_quant3(S, r, CK, SR)
        R = S
        if RD >= 0:
            R = _fake_quant3(S, r, RD, False)
        if PREFETCH:
            kA, kB, qB, vw, bw, qf, TI, P, et, wf = nkA, nkB, nqB, nvw, nbw, nqf, nTI, nP, net, nwf
    if TAIL:  # records left pending: outputs, and S_final = what the next flush would fold
        t0 = (w0 + nfull) * L
        rem = T - t0
        if not PREFETCH:
            kA, kB, qB, vw, bw, qf, TI, P, et, wf = _gdn_scan_inputs(
                qb, kb, vb, bb, pb + nfull * REC, t0, rem, vv, mv, SK, SV, HV, K, L, LB)
        S = _gdn_window(S, R, kA, kB, qB, vw, bw, qf, TI, P, et, wf, ob, t0, rem, rem, vv, mv,
                        SV, BV, KC, LB, False, RD, MERGE)
    tl.store(sf_ptr + sb + elem, S, mask=mrow)


# ----------------------------------------------------------------------------------------------
# Mamba-2. Base pointers as for GDN; ``SX``/``SG`` are the token strides of x, y and of B, C.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _m2_token(xb, dtb, Bb, Cb, t, T, pp, mp, nn, SX: tl.constexpr, SG: tl.constexpr,
              H: tl.constexpr):
    """One token's inputs (zeros past the end of the sequence)."""
    tt = t.to(tl.int64)
    ok = t < T
    mn = (nn * 0 + t) < T
    x = tl.load(xb + tt * SX + pp, mask=mp & ((pp * 0 + t) < T), other=0.0).to(tl.float32)
    dt = tl.load(dtb + tt * H, mask=ok, other=0.0)
    Bv = tl.load(Bb + tt * SG + nn, mask=mn, other=0.0).to(tl.float32)
    Cv = tl.load(Cb + tt * SG + nn, mask=mn, other=0.0).to(tl.float32)
    return x, dt, Bv, Cv


@triton.jit
def _m2_conv_step(S, x, dt, Bv, Cv, A, Dh, yb, t, pp, mp, elem, seed, layer, seq,
                  SX: tl.constexpr, N: tl.constexpr, BP: tl.constexpr, CK: tl.constexpr,
                  SR: tl.constexpr, HAS_D: tl.constexpr):
    """Conventional step: output from the fp32 state, then the state rounded to the ckpt."""
    a = tl.exp(dt * A)
    S = a * S + (dt * x)[:, None] * Bv[None, :]
    y = tl.sum(S * Cv[None, :], axis=1)
    if HAS_D:
        y = y + Dh * x
    tl.store(yb + t.to(tl.int64) * SX + pp, y, mask=mp)
    return _fake_quant(S, _words(seed, layer, seq, t + 1, elem, SR, CK), CK, SR, BP, N)


@triton.jit(do_not_specialize=["T", "seed", "layer"])
def _m2_conv_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, s0_ptr, seq_ptr, y_ptr, sf_ptr, T, seed, layer,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr, BP: tl.constexpr,
    CK: tl.constexpr, SR: tl.constexpr, HAS_D: tl.constexpr,
):
    SX: tl.constexpr = H * P
    SG: tl.constexpr = G * N
    b = tl.program_id(0)
    h = tl.program_id(1)
    pt = tl.program_id(2)
    g = h // (H // G)
    pp = pt * BP + tl.arange(0, BP)
    mp = pp < P
    nn = tl.arange(0, N)
    elem = (h * P + pp)[:, None] * N + nn[None, :]
    seq = tl.load(seq_ptr + b)
    A = tl.load(A_ptr + h)
    Dh = tl.load(D_ptr + h)  # D_ptr is A when there is no D (then unused)
    base = b.to(tl.int64) * T
    xb = x_ptr + base * SX + h * P
    dtb = dt_ptr + base * H + h
    Bb = B_ptr + base * SG + g * N
    Cb = C_ptr + base * SG + g * N
    yb = y_ptr + base * SX + h * P
    sb = b.to(tl.int64) * (H * P * N)
    S = tl.load(s0_ptr + sb + elem, mask=mp[:, None], other=0.0)
    S = _fake_quant(S, _words(seed, layer, seq, seq * 0, elem, SR, CK), CK, SR, BP, N)
    z = T * 0
    x0, d0, B0, C0 = _m2_token(xb, dtb, Bb, Cb, z, T, pp, mp, nn, SX, SG, H)
    x1, d1, B1, C1 = _m2_token(xb, dtb, Bb, Cb, z + 1, T, pp, mp, nn, SX, SG, H)
    x2, d2, B2, C2 = _m2_token(xb, dtb, Bb, Cb, z + 2, T, pp, mp, nn, SX, SG, H)
    x3, d3, B3, C3 = _m2_token(xb, dtb, Bb, Cb, z + 3, T, pp, mp, nn, SX, SG, H)
    for c in range(T // 4):
        t = z + c * 4  # a tensor index also when interpreted
        # the next four tokens' loads are in flight while these four are computed
        nx0, nd0, nB0, nC0 = _m2_token(xb, dtb, Bb, Cb, t + 4, T, pp, mp, nn, SX, SG, H)
        nx1, nd1, nB1, nC1 = _m2_token(xb, dtb, Bb, Cb, t + 5, T, pp, mp, nn, SX, SG, H)
        nx2, nd2, nB2, nC2 = _m2_token(xb, dtb, Bb, Cb, t + 6, T, pp, mp, nn, SX, SG, H)
        nx3, nd3, nB3, nC3 = _m2_token(xb, dtb, Bb, Cb, t + 7, T, pp, mp, nn, SX, SG, H)
        S = _m2_conv_step(S, x0, d0, B0, C0, A, Dh, yb, t, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        S = _m2_conv_step(S, x1, d1, B1, C1, A, Dh, yb, t + 1, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        S = _m2_conv_step(S, x2, d2, B2, C2, A, Dh, yb, t + 2, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        S = _m2_conv_step(S, x3, d3, B3, C3, A, Dh, yb, t + 3, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        x0, d0, B0, C0 = nx0, nd0, nB0, nC0
        x1, d1, B1, C1 = nx1, nd1, nB1, nC1
        x2, d2, B2, C2 = nx2, nd2, nB2, nC2
        x3, d3, B3, C3 = nx3, nd3, nB3, nC3
    t = (T // 4) * 4
    if t < T:
        S = _m2_conv_step(S, x0, d0, B0, C0, A, Dh, yb, t, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
    if t + 1 < T:
        S = _m2_conv_step(S, x1, d1, B1, C1, A, Dh, yb, t + 1, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
    if t + 2 < T:
        S = _m2_conv_step(S, x2, d2, B2, C2, A, Dh, yb, t + 2, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
    tl.store(sf_ptr + sb + elem, S, mask=mp[:, None])


@triton.jit
def _m2_window_inputs(xb, dtb, Bb, Cb, t0, cnt, pp, mp, SX: tl.constexpr, SG: tl.constexpr,
                      H: tl.constexpr, N: tl.constexpr, L: tl.constexpr, LB: tl.constexpr):
    """The ``cnt`` tokens of the window starting at ``t0`` (zeros after them), in the forms the
    products need: ``x (BP, LB)``, dt and dt shifted by one ``(LB,)``, ``BA (KC, LB, 16)``,
    ``CB (KC, 16, LB)``, and the flush token's x ``(BP,)`` and C ``(KC, 1, 16)``."""
    KC: tl.constexpr = N // 16
    j = tl.arange(0, LB)
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    mj = j < cnt
    tok = t0.to(tl.int64) + j
    col_a = (c[:, None, None] * 16 + d[None, None, :]).to(tl.int64)
    col_b = (c[:, None, None] * 16 + d[None, :, None]).to(tl.int64)
    xw = tl.load(xb + tok[None, :] * SX + pp[:, None], mask=mj[None, :] & mp[:, None], other=0.0)
    dtw = tl.load(dtb + tok * H, mask=mj, other=0.0)
    dts = tl.load(dtb + (tok + 1) * H, mask=(j + 1) < cnt, other=0.0)
    BA = tl.load(Bb + tok[None, :, None] * SG + col_a, mask=mj[None, :, None], other=0.0)
    CB = tl.load(Cb + tok[None, None, :] * SG + col_b, mask=mj[None, None, :], other=0.0)
    tf = t0.to(tl.int64) + L - 1
    xf = tl.load(xb + tf * SX + pp, mask=mp & ((pp * 0 + cnt) == L), other=0.0)
    Cf = tl.load(Cb + tf * SG + col_a, mask=(col_a * 0 + cnt) == L, other=0.0)
    return (xw.to(tl.float32), dtw, dts, BA.to(tl.float32), CB.to(tl.float32),
            xf.to(tl.float32), Cf.to(tl.float32))


@triton.jit
def _m2_window(S, R, xw, dtw, dts, BA, CB, xf, Cf, A, Dh, yb, t0, cnt, nout, pp, mp,
               SX: tl.constexpr, BP: tl.constexpr, KC: tl.constexpr, LB: tl.constexpr,
               FLUSH: tl.constexpr, HAS_D: tl.constexpr):
    """Outputs of the window's first ``nout`` tokens from the read source ``R``, and the fp32
    state folded over its ``cnt`` records (the flush output from it when FLUSH). States are
    ``(KC, BP, 16)`` chunks; products over d_state are batched over the chunks, then summed."""
    j = tl.arange(0, LB)
    excl, tot = _decay_sums(dtw, dts, LB)
    BC = tl.sum(tl.dot(BA, CB, input_precision="ieee"), axis=0)  # [i, j] = B_i . C_j
    W = tl.where(j[None, :] <= j[:, None], tl.exp(A * excl) * dtw[None, :] * tl.trans(BC), 0.0)
    SC = tl.sum(tl.dot(R, CB, input_precision="ieee"), axis=0)  # (BP, LB): R C_j
    Y = tl.exp(A * tot)[None, :] * SC + tl.dot(xw, tl.trans(W), input_precision="ieee")
    if HAS_D:
        Y = Y + Dh * xw
    tok = t0.to(tl.int64) + j
    tl.store(yb + tok[None, :] * SX + pp[:, None], Y, mask=(j < nout)[None, :] & mp[:, None])
    wf = tl.where(j < cnt, tl.exp(A * _row(excl, cnt - 1, LB)) * dtw, 0.0)
    ef = tl.exp(A * _entry(tot, cnt - 1, LB))
    Xw = tl.broadcast_to((xw * wf[None, :])[None, :, :], (KC, BP, LB))
    S = ef * S + tl.dot(Xw, BA, input_precision="ieee")
    if FLUSH:
        y = tl.sum(tl.sum(S * Cf, axis=2), axis=0)
        if HAS_D:
            y = y + Dh * xf
        tl.store(yb + (t0.to(tl.int64) + cnt - 1) * SX + pp, y, mask=mp)
    return S


@triton.jit(do_not_specialize=["T", "seed", "layer"])
def _m2_window_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, s0_ptr, seq_ptr, y_ptr, sf_ptr, T, seed, layer,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr, L: tl.constexpr,
    LB: tl.constexpr, BP: tl.constexpr, CK: tl.constexpr, RD: tl.constexpr, SR: tl.constexpr,
    HAS_D: tl.constexpr, PREFETCH: tl.constexpr,
):
    SX: tl.constexpr = H * P
    SG: tl.constexpr = G * N
    KC: tl.constexpr = N // 16
    b = tl.program_id(0)
    h = tl.program_id(1)
    pt = tl.program_id(2)
    g = h // (H // G)
    pp = pt * BP + tl.arange(0, BP)
    mp = pp < P
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    # element (p, 16 c + d) of the head's state, held as chunk c, row p, column d
    elem = (h * P + pp)[None, :, None] * N + c[:, None, None] * 16 + d[None, None, :]
    mrow = mp[None, :, None]
    seq = tl.load(seq_ptr + b)
    A = tl.load(A_ptr + h)
    Dh = tl.load(D_ptr + h)  # D_ptr is A when there is no D (then unused)
    base = b.to(tl.int64) * T
    xb = x_ptr + base * SX + h * P
    dtb = dt_ptr + base * H + h
    Bb = B_ptr + base * SG + g * N
    Cb = C_ptr + base * SG + g * N
    yb = y_ptr + base * SX + h * P
    sb = b.to(tl.int64) * (H * P * N)
    S = tl.load(s0_ptr + sb + elem, mask=mrow, other=0.0)
    r = _words(seed, layer, seq, seq * 0, elem, SR, CK)
    S = _fake_quant3(S, r, CK, SR)
    R = S
    if RD >= 0:
        R = _fake_quant3(S, r, RD, False)
    z = T * 0
    if PREFETCH:
        xw, dtw, dts, BA, CB, xf, Cf = _m2_window_inputs(xb, dtb, Bb, Cb, z, tl.minimum(T, L),
                                                         pp, mp, SX, SG, H, N, L, LB)
    nfull = T // L
    for w in range(nfull):
        t0 = z + w * L  # a tensor index also when interpreted
        if PREFETCH:  # the next window's loads are in flight while this one is computed
            nxw, ndtw, ndts, nBA, nCB, nxf, nCf = _m2_window_inputs(
                xb, dtb, Bb, Cb, t0 + L, tl.minimum(T - t0 - L, L), pp, mp, SX, SG, H, N, L, LB)
        else:
            xw, dtw, dts, BA, CB, xf, Cf = _m2_window_inputs(
                xb, dtb, Bb, Cb, t0, z + L, pp, mp, SX, SG, H, N, L, LB)
        S = _m2_window(S, R, xw, dtw, dts, BA, CB, xf, Cf, A, Dh, yb, t0, L, L - 1, pp, mp, SX,
                       BP, KC, LB, True, HAS_D)
        r = _words(seed, layer, seq, z + w + 1, elem, SR, CK)
        S = _fake_quant3(S, r, CK, SR)
        R = S
        if RD >= 0:
            R = _fake_quant3(S, r, RD, False)
        if PREFETCH:
            xw, dtw, dts, BA, CB, xf, Cf = nxw, ndtw, ndts, nBA, nCB, nxf, nCf
    rem = T - nfull * L
    if rem > 0:  # records left pending: outputs, and S_final = what the next flush would fold
        if not PREFETCH:
            xw, dtw, dts, BA, CB, xf, Cf = _m2_window_inputs(
                xb, dtb, Bb, Cb, nfull * L, rem, pp, mp, SX, SG, H, N, L, LB)
        S = _m2_window(S, R, xw, dtw, dts, BA, CB, xf, Cf, A, Dh, yb, nfull * L, rem, rem, pp,
                       mp, SX, BP, KC, LB, False, HAS_D)
    tl.store(sf_ptr + sb + elem, S, mask=mrow)


# ----------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------
def _fmt(f) -> int:
    return FMT_NONE if f is None else FMT_CODES[f.name]


def _pow2(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def _window(L: int) -> tuple[int, int]:
    LB = max(16, triton.next_power_of_2(L))
    return LB, int(math.log2(LB))


def gdn_supported(cfg: PrecisionConfig | str, head_k_dim: int) -> bool:
    """Shapes and configs the GDN emulator kernels handle (others run the reference)."""
    return _pow2(head_k_dim) and parse_config(cfg).L <= MAX_KERNEL_L


def mamba2_supported(cfg: PrecisionConfig | str, d_state: int) -> bool:
    """Shapes and configs the Mamba-2 emulator kernels handle (others run the reference)."""
    return _pow2(d_state) and parse_config(cfg).L <= MAX_KERNEL_L


def _prepare(cfg, n: int, S0, state_shape, sequence, layer: int, seed: int, act_dtype,
             device) -> tuple[PrecisionConfig, torch.Tensor, torch.Tensor]:
    from ..ssm.replay import check_act_dtype, check_common, check_tensor, make_sr_sequence

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


def gdn_emulate(
    cfg: PrecisionConfig | str, S0: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, layer: int = 0, seed: int = 0,
    sequence: torch.Tensor | None = None, act_dtype: torch.dtype = torch.float32,
    block_v: int | None = None, num_warps: int | None = None, prefetch: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssm.gdn.emulate`` in one launch: ``q, k (B, T, Hk, K)``, ``v (B, T, Hv, V)``,
    ``g, beta (B, T, Hv)`` fp32 -> ``(o (B, T, Hv, V), S_final (B, Hv, V, K))`` fp32.

    ``k`` and ``v`` are rounded through ``act_dtype`` (what the ring stores) before the launch,
    like the reference. Launch knobs (results do not depend on them; defaults are the fastest
    measured on the H200, ``reports/emulate``): ``block_v`` value rows per program (default
    4 conventional, 32 windowed: the chunk products need >= 16), ``num_warps`` (default 1
    conventional, 4 windowed, 8 windowed with a read copy), ``prefetch`` (windowed: hold the
    next window's inputs in registers while computing this one; default off, it costs
    registers)."""
    from ..ssm.replay import check_row_length, check_tensor

    floats = (torch.float32, torch.float16, torch.bfloat16)
    check_tensor("k", k, (None, None, None, None), floats, k.device)
    n, T, HK, K = k.shape
    check_tensor("v", v, (n, T, None, None), floats, k.device)
    HV, V = v.shape[2], v.shape[3]
    check_tensor("q", q, (n, T, HK, K), floats, k.device)
    check_tensor("g", g, (n, T, HV), (torch.float32,), k.device)
    check_tensor("beta", beta, (n, T, HV), (torch.float32,), k.device)
    if HV % HK:
        raise ValueError(f"num_v_heads ({HV}) must be a multiple of num_k_heads ({HK})")
    cfg, S0, seq = _prepare(cfg, n, S0, (n, HV, V, K), sequence, layer, seed, act_dtype,
                            k.device)
    check_row_length(cfg, K, "head_k_dim")
    if not gdn_supported(cfg, K):
        raise ValueError(f"the GDN emulator kernels need d_k a power of two >= 16 and "
                         f"L <= {MAX_KERNEL_L}; got d_k={K}, L={cfg.L}")
    q = q.contiguous()
    k = k.to(act_dtype).contiguous()
    v = v.to(act_dtype).contiguous()
    g, beta = g.contiguous(), beta.contiguous()
    o = torch.empty(n, T, HV, V, dtype=torch.float32, device=k.device)
    sf = torch.empty(n, HV, V, K, dtype=torch.float32, device=k.device)
    args = (q, k, v, g, beta, S0, seq, o, sf, T, int(seed), int(layer))
    ck, sr = _fmt(cfg.ckpt), cfg.uses_sr
    if cfg.L == 1:
        BV = min(block_v or 4, triton.next_power_of_2(V))
        warps = num_warps or 1
        _gdn_conv_kernel[(n, HV, triton.cdiv(V, BV))](
            *args, HV=HV, HK=HK, V=V, K=K, BV=BV, CK=ck, SR=sr, num_warps=warps)
    else:
        BV = max(16, min(block_v or 32, triton.next_power_of_2(V)))
        warps = num_warps or (8 if cfg.read is not None else 4)
        _gdn_windows(cfg, args, n, HV, HK, V, K, BV, ck, sr, bool(prefetch), warps)
    return o, sf


def _gdn_windows(cfg: PrecisionConfig, args: tuple, n: int, HV: int, HK: int, V: int, K: int,
                 BV: int, ck: int, sr: bool, prefetch: bool, num_warps: int) -> None:
    """ReplaySSM configs: per segment of windows, the state-independent records of every
    window in one parallel launch, then the sequential scan. Segments bound the records'
    memory (``_PREP_BYTES``); the scan carries the checkpoint's value from one to the next."""
    q, k, v, g, beta, S0, seq, o, sf, T, seed, layer = args
    L = cfg.L
    LB, LOG_LB = _window(L)
    rec = 2 * LB * LB + 2 * LB
    nwin = triton.cdiv(T, L)
    per_seg = max(1, min(_PREP_MAX_GRID, _PREP_BYTES // (4 * rec * n * HV)))
    nfull_total = T // L
    starts = list(range(0, nwin, per_seg)) or [0]
    pre = torch.empty(n * HV * min(per_seg, max(nwin, 1)) * rec + rec, dtype=torch.float32,
                      device=k.device)
    for w0 in starts:
        nw = min(per_seg, nwin - w0)
        if nw > 0:
            _gdn_window_prep_kernel[(n, HV, nw)](
                q, k, g, beta, pre, T, w0, HV=HV, HK=HK, K=K, L=L, LB=LB, LOG_LB=LOG_LB,
                num_warps=4)
        nfull = max(0, min(w0 + nw, nfull_total) - w0)
        _gdn_window_kernel[(n, HV, triton.cdiv(V, BV))](
            q, k, v, beta, pre, S0 if w0 == 0 else sf, seq, o, sf, T, seed, layer, w0, nfull,
            HV=HV, HK=HK, V=V, K=K, L=L, LB=LB, BV=BV, CK=ck, RD=_fmt(cfg.read), SR=sr,
            FIRST=w0 == 0, TAIL=nfull < nw, PREFETCH=prefetch, MERGE=_MERGE_RQ,
            num_warps=num_warps)


def mamba2_emulate(
    cfg: PrecisionConfig | str, S0: torch.Tensor | None, x: torch.Tensor, dt: torch.Tensor,
    A: torch.Tensor, Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None, *,
    layer: int = 0, seed: int = 0, sequence: torch.Tensor | None = None,
    act_dtype: torch.dtype = torch.float32, block_p: int | None = None,
    num_warps: int | None = None, prefetch: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssm.mamba2.emulate`` in one launch: ``x (B, T, H, P)``, ``dt (B, T, H)`` fp32,
    ``A (H,)``, ``Bm, C (B, T, G, N)``, ``D (H,)`` or None -> ``(y (B, T, H, P),
    S_final (B, H, P, N))`` fp32.

    ``x`` and ``Bm`` are rounded through ``act_dtype`` before the launch, like the reference.
    Launch knobs (results do not depend on them; defaults are the fastest measured on the
    H200, ``reports/emulate``): ``block_p`` head-dim rows per program (default 4
    conventional, 2 for an fp16-SR state, 8 for a bf16-SR state, 64 windowed: the chunk
    products need >= 16, and fewer, larger tiles mean fewer waves), ``num_warps`` (default
    1 / 8), ``prefetch`` (windowed: hold the next window's inputs in registers while computing
    this window; default on)."""
    from ..ssm.replay import check_row_length, check_tensor

    floats = (torch.float32, torch.float16, torch.bfloat16)
    check_tensor("x", x, (None, None, None, None), floats, x.device)
    n, T, H, P = x.shape
    check_tensor("Bm", Bm, (n, T, None, None), floats, x.device)
    G, N = Bm.shape[2], Bm.shape[3]
    check_tensor("C", C, (n, T, G, N), floats, x.device)
    check_tensor("dt", dt, (n, T, H), (torch.float32,), x.device)
    check_tensor("A", A, (H,), (torch.float32,), x.device)
    if D is not None:
        check_tensor("D", D, (H,), (torch.float32,), x.device)
    if H % G:
        raise ValueError(f"num_heads ({H}) must be a multiple of n_groups ({G})")
    cfg, S0, seq = _prepare(cfg, n, S0, (n, H, P, N), sequence, layer, seed, act_dtype,
                            x.device)
    check_row_length(cfg, N, "d_state")
    if not mamba2_supported(cfg, N):
        raise ValueError(f"the Mamba-2 emulator kernels need d_state a power of two >= 16 "
                         f"and L <= {MAX_KERNEL_L}; got d_state={N}, L={cfg.L}")
    x = x.to(act_dtype).contiguous()
    Bm = Bm.to(act_dtype).contiguous()
    C, dt, A = C.contiguous(), dt.contiguous(), A.contiguous()
    y = torch.empty(n, T, H, P, dtype=torch.float32, device=x.device)
    sf = torch.empty(n, H, P, N, dtype=torch.float32, device=x.device)
    Dt = D.contiguous() if D is not None else A
    args = (x, dt, A, Bm, C, Dt, S0, seq, y, sf, T, int(seed), int(layer))
    ck, sr = _fmt(cfg.ckpt), cfg.uses_sr
    if cfg.L == 1:
        BP = min(block_p or (2 if sr and ck == FMT_CODES["fp16"] else
                             8 if sr and ck == FMT_CODES["bf16"] else 4),
                 triton.next_power_of_2(P))
        _m2_conv_kernel[(n, H, triton.cdiv(P, BP))](
            *args, H=H, P=P, N=N, G=G, BP=BP, CK=ck, SR=sr, HAS_D=D is not None,
            num_warps=num_warps or 1)
    else:
        BP = max(16, min(block_p or 64, triton.next_power_of_2(P)))
        LB, _ = _window(cfg.L)
        _m2_window_kernel[(n, H, triton.cdiv(P, BP))](
            *args, H=H, P=P, N=N, G=G, L=cfg.L, LB=LB, BP=BP, CK=ck, RD=_fmt(cfg.read), SR=sr,
            HAS_D=D is not None, PREFETCH=True if prefetch is None else bool(prefetch),
            num_warps=num_warps or 8)
    return y, sf
