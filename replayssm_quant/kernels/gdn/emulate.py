"""Whole-sequence GDN emulator kernels (one launch per layer; see ``core/emulation.py`` for the
design): windows split into a parallel preparation launch and a sequential scan. Reference:
``ssm.gdn.emulate``; test: ``tests/test_emulate_kernels.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...precision import PrecisionConfig, parse_config
from ..core.emulation import (
    MAX_KERNEL_L,
    decay_sums,
    emulation_words,
    fake_quant,
    fake_quant3,
    format_code,
    lower_entry,
    lower_row,
    pow2_dim,
    prepare_emulation,
    window_sizes,
)
from ..core.sums import unit_lower_inverse
from ..core.target import on_tensor_device

_PREP_BYTES = 256 << 20  # GDN window records held at once (a segment of the sequence)


_PREP_MAX_GRID = 32768  # windows per segment (the launch grid's third axis)


_MERGE_RQ = True  # GDN windows: R [k_j | q_j] (and S k_j with a read copy) as one product


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
    return fake_quant(S, r, CK, SR, BV, K)


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
    S = fake_quant(S, emulation_words(seed, layer, seq, seq * 0, elem, SR, CK), CK, SR, BV, K)
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
        r0 = emulation_words(seed, layer, seq, t + 1, elem, SR, CK)
        r1 = emulation_words(seed, layer, seq, t + 2, elem, SR, CK)
        r2 = emulation_words(seed, layer, seq, t + 3, elem, SR, CK)
        r3 = emulation_words(seed, layer, seq, t + 4, elem, SR, CK)
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
                           emulation_words(seed, layer, seq, t + 1, elem, SR, CK), SV, K, BV, CK, SR)
    if t + 1 < T:
        S = _gdn_conv_step(S, q1, k1, v1, g1, b1, ob, t + 1, vv, mv,
                           emulation_words(seed, layer, seq, t + 2, elem, SR, CK), SV, K, BV, CK, SR)
    if t + 2 < T:
        S = _gdn_conv_step(S, q2, k2, v2, g2, b2, ob, t + 2, vv, mv,
                           emulation_words(seed, layer, seq, t + 3, elem, SR, CK), SV, K, BV, CK, SR)
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
    excl, tot = decay_sums(gw, gs, LB)
    dec = tl.exp(excl)
    etot = tl.exp(tot)
    KK = tl.sum(tl.dot(kA, kB, input_precision="ieee"), axis=0)  # [j, i] = k_j . k_i
    KQ = tl.sum(tl.dot(kA, qB, input_precision="ieee"), axis=0)  # [i, j] = k_i . q_j
    # u_j + beta_j sum_{i<j} G(i+1..j) (k_i.k_j) u_i = beta_j (v_j - G(c+1..j) R k_j)
    M = tl.where(j[None, :] < j[:, None], bw[:, None] * (dec * KK), 0.0)
    TI = tl.trans(unit_lower_inverse(M, LB, LOG_LB, "ieee"))
    W = tl.where(j[None, :] <= j[:, None], dec * tl.trans(KQ), 0.0)  # [j, i]
    P = tl.dot(TI, tl.trans(W), input_precision="ieee")
    wf = tl.where(j < cnt, lower_row(dec, cnt - 1, LB), 0.0)
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
    S = lower_entry(etot, cnt - 1, LB) * S + tl.dot(Uw, kA, input_precision="ieee")
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
        S = fake_quant3(S, emulation_words(seed, layer, seq, seq * 0, elem, SR, CK), CK, SR)
    R = S
    if RD >= 0:  # the read copy is a function of the checkpoint's value
        R = fake_quant3(S, elem.to(tl.uint32), RD, False)
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
        r = emulation_words(seed, layer, seq, z + w + 1, elem, SR, CK)  # independent of the state
        S = _gdn_window(S, R, kA, kB, qB, vw, bw, qf, TI, P, et, wf, ob, t0, L, L - 1, vv, mv,
                        SV, BV, KC, LB, True, RD, MERGE)
        S = fake_quant3(S, r, CK, SR)
        R = S
        if RD >= 0:
            R = fake_quant3(S, r, RD, False)
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


def gdn_supported(cfg: PrecisionConfig | str, head_k_dim: int) -> bool:
    """Shapes and configs the GDN emulator kernels handle (others run the reference)."""
    return pow2_dim(head_k_dim) and parse_config(cfg).L <= MAX_KERNEL_L


@on_tensor_device
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
    measured on the H200): ``block_v`` value rows per program (default
    4 conventional, 32 windowed: the chunk products need >= 16), ``num_warps`` (default 1
    conventional, 4 windowed, 8 windowed with a read copy), ``prefetch`` (windowed: hold the
    next window's inputs in registers while computing this one; default off, it costs
    registers)."""
    from ...ssm.replay import check_row_length, check_tensor

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
    cfg, S0, seq = prepare_emulation(cfg, n, S0, (n, HV, V, K), sequence, layer, seed, act_dtype,
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
    ck, sr = format_code(cfg.ckpt), cfg.uses_sr
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
    LB, LOG_LB = window_sizes(L)
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
            HV=HV, HK=HK, V=V, K=K, L=L, LB=LB, BV=BV, CK=ck, RD=format_code(cfg.read), SR=sr,
            FIRST=w0 == 0, TAIL=nfull < nw, PREFETCH=prefetch, MERGE=_MERGE_RQ,
            num_warps=num_warps)
