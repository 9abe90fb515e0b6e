"""The persistent flush of a GDN ReplaySSM step: resident programs walk the flushing rows' tiles,
recompute the window's u from the checkpoint where a read copy exists (replayed, or through the
UT transform the ring-products launch builds), fold the records and write the checkpoint and
read copy. Also the flush-row body a one-launch step runs on its own tiles. Reference:
``ssm.gdn.flush``; test: ``tests/test_kernels_decode.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.memory import wait_prior_grid
from ..core.ring import advance_rows
from ..core.state_io import count_nans, load_rows, split_dot, write_state
from ..core.sums import log_decay_segments, log_decay_suffixes


@triton.jit
def _recompute_u(S, Kr, Vr, br, gr, gnext, j, LB: tl.constexpr, BV: tl.constexpr,
                 NREC: tl.constexpr):
    """u_j = beta_j (v_j - a_j S_{j-1} k_j) for records j < NREC, sequentially from the
    checkpoint S (the UT transform written as forward substitution). ``gnext`` holds record
    j + 1's log-decay at j (``log_decay_segments``)."""
    cum = tl.cumsum(gr, 0)
    seg = log_decay_segments(gnext, LB)  # [i, j]: log-decay from after record j to record i
    W0 = tl.dot(S, tl.trans(Kr), input_precision="ieee")  # (BV, LB): S_c k_j
    KK = tl.dot(Kr, tl.trans(Kr), input_precision="ieee")  # (LB, LB)
    U = tl.zeros((BV, LB), dtype=tl.float32)
    for jj in tl.static_range(NREC):
        on = j == jj
        sel = on.to(tl.float32)
        cj = tl.sum(tl.where(on, cum, 0.0), 0)  # a select, not a product: cum may be -inf
        kkj = tl.sum(KK * sel[None, :], axis=1)
        coef = tl.where(j < jj, tl.exp(tl.sum(tl.where(on[:, None], seg, 0.0), axis=0)) * kkj,
                        0.0)
        wj = tl.exp(cj) * tl.sum(W0 * sel[None, :], axis=1) + tl.sum(U * coef[None, :], axis=1)
        uj = tl.sum(br * sel, 0) * (tl.sum(Vr * sel[None, :], axis=1) - wj)
        U += uj[:, None] * sel[None, :]
    return U


@triton.jit
def _gdn_flush_rows(b, h, vvf, mvf, slot, fi, kd_ptr, kkt_local,
                    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr,
                    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                    kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
                    ti_ptr, seed, layer,
                    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
                    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
                    CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr,
                    RECOMPUTE: tl.constexpr, BVF: tl.constexpr, RECORDS: tl.constexpr,
                    FOLD_PREC: tl.constexpr, KD_LOCAL: tl.constexpr, ck_desc, v0,
                    TMA: tl.constexpr):
    """The flush of value rows ``vvf`` (BVF of them, ``mvf`` valid) of value head h of row b:
    recompute the window's u's from the checkpoint when a read copy exists, fold them and
    the current token, write o, the checkpoint (SR with flush index ``fi``) and the read copy.
    The keys' ``k_j . k`` come from the ring-products buffer ``kd_ptr``, or with KD_LOCAL from
    ``kkt_local`` (formed by the calling program). With TMA (an fp32 checkpoint without a
    read copy, whole tiles ``v0 ..``) the checkpoint rows move through ``ck_desc``, a tensor
    descriptor of its (slots, HV * V, K) view. Returns the NaNs written."""
    RATIO: tl.constexpr = HV // HK
    kk = tl.arange(0, K)
    j = tl.arange(0, LB)
    mj = j < L - 1
    hk = h // RATIO
    rowsf = h * V + vvf
    if TMA:
        Sf = tl.reshape(ck_desc.load([slot, h * V + v0, 0]), (BVF, K))
    else:
        Sf = load_rows(ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                       ck_bs_ptr + slot * s_ckbs, rowsf, kk, mvf, CK_FMT, BVF, K)
    q = tl.load(q_ptr + (b * HK + hk) * K + kk).to(tl.float32)
    k = tl.load(k_ptr + (b * HK + hk) * K + kk).to(tl.float32)
    vf = tl.load(v_ptr + (b * HV + h) * V + vvf, mask=mvf, other=0.0).to(tl.float32)
    gt = tl.load(g_ptr + b * HV + h).to(tl.float32)
    beta = tl.load(beta_ptr + b * HV + h).to(tl.float32)
    gr, after, total, _ = log_decay_suffixes(gr_ptr + slot * s_gr + h * CAP, L - 1, gt, LB)
    dec = tl.where(mj, tl.exp(after), 0.0)
    G = tl.exp(total)
    Kr = tl.load(kr_ptr + slot * s_kr + (hk * CAP + j[:, None]) * K + kk[None, :],
                 mask=mj[:, None], other=0.0)
    SPLIT: tl.constexpr = FOLD_PREC == "bf16x3"  # k_j exact in bf16: exact products
    # on tensor cores against the fp32 operand's three bf16 pieces
    if not SPLIT:
        Kr = Kr.to(tl.float32)
    kd_row = kd_ptr + (b * HK + hk) * (2 * LB + 1)
    if KD_LOCAL:
        kkt = kkt_local
    else:
        kkt = tl.load(kd_row + j, mask=mj, other=0.0)
    if RECORDS and RECOMPUTE:  # the window replayed from the checkpoint, oldest record
        # first: each record's u from the running state (u_j = beta_j (v_j - a_j S k_j)),
        # then its rank-1 update; only the state tile stays live
        for t in tl.static_range(L - 1):
            gj = tl.load(gr_ptr + slot * s_gr + h * CAP + t)
            bj = tl.load(br_ptr + slot * s_br + h * CAP + t)
            # the key loaded as a (rows, K) tile of one record: it then arrives in the
            # state's layout instead of being moved into it through shuffles / shared memory
            kj = tl.load(kr_ptr + slot * s_kr + (hk * CAP + t) * K + kk[None, :]
                         + 0 * vvf[:, None]).to(tl.float32)
            vj = tl.load(vr_ptr + slot * s_vr + (h * CAP + t) * V + vvf, mask=mvf,
                         other=0.0).to(tl.float32)
            Sf = tl.exp(gj) * Sf
            uj = bj * (vj - tl.sum(Sf * kj, axis=1))
            Sf = Sf + uj[:, None] * kj
        Sf = tl.exp(gt) * Sf
        uf = beta * (vf - tl.sum(Sf * k[None, :], axis=1))
    elif RECOMPUTE:
        br = tl.load(br_ptr + slot * s_br + h * CAP + j, mask=mj, other=0.0)
        Vrf = tl.load(vr_ptr + slot * s_vr + (h * CAP + j[None, :]) * V + vvf[:, None],
                      mask=mj[None, :] & mvf[:, None], other=0.0).to(tl.float32)
        if SPLIT:  # (BVF, LB): S_c k_j
            SK = split_dot(Sf, tl.trans(Kr), tl.zeros((BVF, LB), dtype=tl.float32), 3)
        else:
            SK = tl.dot(Sf, tl.trans(Kr), input_precision=FOLD_PREC)
        X = br[None, :] * (Vrf - tl.exp(tl.cumsum(gr, 0))[None, :] * SK)
        TI = tl.load(ti_ptr + (b * HV + h) * (LB * LB) + j[:, None] * LB + j[None, :])
        Uf = tl.dot(X, TI, input_precision="ieee" if SPLIT else FOLD_PREC)
    elif not RECORDS:
        Uf = tl.load(ur_ptr + slot * s_ur + (h * CAP + j[None, :]) * V + vvf[:, None],
                     mask=mj[None, :] & mvf[:, None], other=0.0)
    if RECORDS and not RECOMPUTE:  # rank-1 updates, newest record first (suffix sums
        # of g give the decays), each record's u and key straight from the ring
        sfx = gt
        upd = tl.zeros((BVF, K), dtype=tl.float32)
        wr = tl.zeros((BVF,), dtype=tl.float32)
        for t in tl.static_range(L - 1):
            jj = L - 2 - t
            dj = tl.exp(sfx)
            uj = tl.load(ur_ptr + slot * s_ur + (h * CAP + jj) * V + vvf, mask=mvf,
                         other=0.0) * dj
            kj = tl.load(kr_ptr + slot * s_kr + (hk * CAP + jj) * K + kk[None, :]
                         + 0 * vvf[:, None]).to(tl.float32)  # in the state's layout
            upd += uj[:, None] * kj
            if KD_LOCAL:
                wr += uj * tl.sum(tl.where(j == jj, kkt, 0.0), 0)
            else:
                wr += uj * tl.load(kd_row + jj)
            sfx += tl.load(gr_ptr + slot * s_gr + h * CAP + jj)
        wf = G * tl.sum(Sf * k[None, :], axis=1) + wr
        uf = beta * (vf - wf)
        Sf = G * Sf + upd
    elif not RECORDS:
        wf = G * tl.sum(Sf * k[None, :], axis=1) + tl.sum(Uf * (dec * kkt)[None, :], axis=1)
        uf = beta * (vf - wf)
        if SPLIT:
            Sf = G * Sf + split_dot(Uf * dec[None, :], Kr,
                                    tl.zeros((BVF, K), dtype=tl.float32), 3)
        else:
            Sf = G * Sf + tl.dot(Uf * dec[None, :], Kr, input_precision=FOLD_PREC)
    Sf = Sf + uf[:, None] * k[None, :]
    of = tl.sum(Sf * q[None, :], axis=1)
    tl.store(o_ptr + (b * HV + h) * V + vvf, of, mask=mvf)
    if TMA:
        ck_desc.store([slot, h * V + v0, 0], tl.reshape(Sf, (1, BVF, K)))
        return count_nans(Sf, mvf, None, False)
    return write_state(Sf, slot, fi, seed, layer, rowsf, kk, mvf,
                        ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                        ck_bs_ptr + slot * s_ckbs,
                        rd_ptr + slot * s_rd, rd_rs_ptr + slot * s_rdrs,
                        rd_bs_ptr + slot * s_rdbs,
                        CK_FMT, RD_FMT, SR, BVF, K, of)


@triton.jit(do_not_specialize=["seed", "layer", "nrows"])
def _gdn_flush_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, slots_ptr, o_ptr,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
    kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
    kd_ptr, ti_ptr, list_ptr, cur_ptr, fi_ptr, nan_ptr, seed, layer, nrows,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr, RECOMPUTE: tl.constexpr,
    BVF: tl.constexpr, STAGES: tl.constexpr = None, RECORDS: tl.constexpr = False,
    FOLD_PREC: tl.constexpr = "ieee", ADVANCE: tl.constexpr = False, PDL: tl.constexpr = False,
    ck_desc=None, TMA: tl.constexpr = False,
):
    """Flush, persistent: the programs walk the (flushing row, value head, BVF rows) tiles of
    the flush list (TMA and ``ck_desc`` as in ``_gdn_flush_rows``). Each tile recomputes the
    window's u's from the checkpoint when a read copy exists, folds them and the current
    token, writes o, the checkpoint and the read copy.
    STAGES (None: Triton's default, the fastest measured) software-pipelines the loop. ADVANCE
    moves every row's cursor on afterwards, as in the Mamba-2 flush. With PDL the launch may
    start before the non-flush launch ends; its programs wait for it first."""
    TILES: tl.constexpr = (V + BVF - 1) // BVF
    wait_prior_grid(PDL)
    nflush = tl.load(list_ptr)
    nans = tl.zeros((), dtype=tl.int32)
    for item in tl.range(tl.program_id(0), nflush * (HV * TILES), tl.num_programs(0),
                         num_stages=STAGES):
        b = tl.load(list_ptr + 1 + 2 * (item // (HV * TILES)))
        fi = tl.load(list_ptr + 2 + 2 * (item // (HV * TILES)))
        h = (item // TILES) % HV
        vt = item % TILES
        slot = tl.load(slots_ptr + b)
        vvf = vt * BVF + tl.arange(0, BVF)
        nans += _gdn_flush_rows(
            b, h, vvf, vvf < V, slot, fi, kd_ptr, kd_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
            o_ptr, ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
            rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
            kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
            ti_ptr, seed, layer, HV, HK, V, K, L, CAP, LB, CK_FMT, RD_FMT, SR, RECOMPUTE, BVF,
            RECORDS, FOLD_PREC, False, ck_desc, vt * BVF, TMA)
    if ADVANCE:
        advance_rows(slots_ptr, cur_ptr, fi_ptr, tl.program_id(0), tl.num_programs(0), nrows, L, 256)
    if nans > 0:
        tl.atomic_add(nan_ptr, nans)
