"""Triton decode kernels for Gated DeltaNet layers: conventional step and ReplaySSM step
(non-flush or flush per row, decided on the device from the cursor).

One program handles one (batch row, value head, tile of value rows) and holds those state
rows (rows x d_k) in registers: u's value rows are independent, so no cross-program reduction is
needed. A ReplaySSM step is three launches as for Mamba-2 (``kernels/mamba2/``): ring products per
key head (``k_j . k``, ``k_j . q``) and the flush list, the lean non-flush kernel, the
persistent flush. With a read copy, the flush recomputes every u of the window from the
high-precision checkpoint before folding (``U = X (I + M)^-T``, the transform from the
ring-products launch), so the read copy's error never enters the recurrence. At small
batch a step is one launch, as for Mamba-2 (``one_launch_default``).

This module holds the conventional, ring-products and non-flush kernels (the flush is in
``flush.py``, the launcher in ``launch.py``). Reference: ``ssm.gdn.conventional_step`` /
``nonflush_step`` / ``decode_step``; test: ``tests/test_kernels_decode.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.memory import prefetch_records, release_dependents, row_head_tile, tile_rows, wait_prior_grid
from ..core.products import mma_vector_pieces, nvfp4_mma_rows_dot, rows_dot
from ..core.ring import finish_row, flush_list
from ..core.rounding import sr_words_for
from ..core.state_io import load_rows, store_rows
from ..core.sums import log_decay_segments, log_decay_suffixes, ring_records, unit_lower_inverse
from .flush import _gdn_flush_rows


@triton.jit(do_not_specialize=["seed", "layer", "nrows"])
def _gdn_conv_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, slots_ptr, o_ptr,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    fi_ptr, nan_ptr, seed, layer, ticket_ptr, cur_ptr, nrows,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
    CK_FMT: tl.constexpr, SR: tl.constexpr, BV: tl.constexpr,
    TILE_FIRST: tl.constexpr = False, ADVANCE: tl.constexpr = False,
):
    """Conventional step per (row, value head, BV value rows). With ADVANCE the row's last
    program also advances its counters (``finish_row``): the step is one launch."""
    b, h, vt = row_head_tile(TILE_FIRST)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        hk = h // (HV // HK)
        vv = vt * BV + tl.arange(0, BV)
        mv = vv < V
        kk = tl.arange(0, K)
        q = tl.load(q_ptr + (b * HK + hk) * K + kk).to(tl.float32)
        k = tl.load(k_ptr + (b * HK + hk) * K + kk).to(tl.float32)
        v = tl.load(v_ptr + (b * HV + h) * V + vv, mask=mv, other=0.0).to(tl.float32)
        a = tl.exp(tl.load(g_ptr + b * HV + h).to(tl.float32))
        beta = tl.load(beta_ptr + b * HV + h).to(tl.float32)
        rows = h * V + vv
        S = load_rows(ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs, ck_bs_ptr + slot * s_ckbs,
                      rows, kk, mv, CK_FMT, BV, K)
        u = beta * (v - a * tl.sum(S * k[None, :], axis=1))
        S = a * S + u[:, None] * k[None, :]
        o = tl.sum(S * q[None, :], axis=1)
        tl.store(o_ptr + (b * HV + h) * V + vv, o, mask=mv)
        fi = tl.load(fi_ptr + slot) + 1
        elem = rows[:, None] * K + kk[None, :]
        r = sr_words_for(seed, layer, slot, fi, elem, CK_FMT) if SR else elem.to(tl.uint32)
        _, nans = store_rows(S, r, ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                             ck_bs_ptr + slot * s_ckbs, rows, kk, mv, CK_FMT, SR, BV, K, False,
                             o)
        if nans > 0:
            tl.atomic_add(nan_ptr, nans)
        if ADVANCE:
            finish_row(ticket_ptr, slot, cur_ptr, fi_ptr, 0, fi, 1, TILE_FIRST)


@triton.jit
def _key_products(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, hk, slot, c, HK: tl.constexpr,
                  K: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr, STORE: tl.constexpr,
                  ECAP: tl.constexpr = 0):
    """``k_j . k`` and ``k_j . q`` for the records j < c of key head hk, and ``k . q``: stored
    to the ring-products buffer with STORE, else returned. ECAP as ``ring_records``'s CAP."""
    kk = tl.arange(0, K)
    j = tl.arange(0, LB)
    q = tl.load(q_ptr + (b * HK + hk) * K + kk).to(tl.float32)
    k = tl.load(k_ptr + (b * HK + hk) * K + kk).to(tl.float32)
    Kr = ring_records(kr_ptr + slot * s_kr + (hk * CAP + j[:, None]) * K + kk[None, :],
                      (j < c)[:, None], (j < CAP)[:, None], ECAP).to(tl.float32)
    kkt = tl.sum(Kr * k[None, :], axis=1)
    kq = tl.sum(Kr * q[None, :], axis=1)
    kq0 = tl.sum(k * q, axis=0)
    if STORE:
        out = kd_ptr + (b * HK + hk) * (2 * LB + 1)
        tl.store(out + j, kkt)
        tl.store(out + LB + j, kq)
        tl.store(out + 2 * LB, kq0)
    return kkt, kq, kq0


@triton.jit
def _key_products_of(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, hk, slot, c, HK: tl.constexpr,
                     K: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr):
    """``_key_products`` of the key heads ``hk`` (a vector) of row b, stored: every key head's
    loads are issued at once."""
    kk = tl.arange(0, K)
    j = tl.arange(0, LB)
    q = tl.load(q_ptr + (b * HK + hk)[:, None] * K + kk[None, :]).to(tl.float32)
    k = tl.load(k_ptr + (b * HK + hk)[:, None] * K + kk[None, :]).to(tl.float32)
    Kr = tl.load(kr_ptr + slot * s_kr
                 + (hk[:, None, None] * CAP + j[None, :, None]) * K + kk[None, None, :],
                 mask=(j < c)[None, :, None], other=0.0).to(tl.float32)
    out = kd_ptr + (b * HK + hk) * (2 * LB + 1)
    tl.store(out[:, None] + j[None, :], tl.sum(Kr * k[:, None, :], axis=2))
    tl.store(out[:, None] + LB + j[None, :], tl.sum(Kr * q[:, None, :], axis=2))
    tl.store(out + 2 * LB, tl.sum(k * q, axis=1))


@triton.jit
def _mma_key_pieces(q_ptr, k_ptr, mm_ptr, ms_ptr, b, hk, HK: tl.constexpr, K: tl.constexpr):
    """k's and q's fp16 pieces for the NVFP4 tensor-core products of key head hk of row b
    (``mma_vector_pieces``): k in columns 0-2, q in 3-5, zeros after, their factors at
    ``ms_ptr``."""
    row = b * HK + hk
    mma_vector_pieces(k_ptr + row * K, mm_ptr + row * (K * 16), ms_ptr + 2 * row, 0, K)
    mma_vector_pieces(q_ptr + row * K, mm_ptr + row * (K * 16), ms_ptr + 2 * row + 1, 3, K, True)


@triton.jit(do_not_specialize=["nrows"])
def _gdn_prep_kernel(
    q_ptr, k_ptr, slots_ptr, kr_ptr, gr_ptr, br_ptr, s_kr, s_gr, s_br, cur_ptr, fi_ptr, kd_ptr,
    ti_ptr, list_ptr, nrows, mm_ptr, ms_ptr,
    HV: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, L: tl.constexpr, CAP: tl.constexpr,
    LB: tl.constexpr, LOG_LB: tl.constexpr, RB: tl.constexpr, UT: tl.constexpr,
    FOLD_PREC: tl.constexpr = "ieee", PDL: tl.constexpr = False, PK: tl.constexpr = 1,
    MMA: tl.constexpr = False,
):
    """Per (row, key head, value head of the key head), once per step: ``k_j . k`` and
    ``k_j . q`` for the buffered keys and ``k . q`` (program r = 0; every value head of a key
    head reads them: 2 LB + 1 floats instead of the LB x d_k keys); program (0, 0, 0) also
    builds the flush list. On flushing rows whose flush recomputes u, program r also builds
    the UT transform of value head ``hk * HV / HK + r``'s window, ``TI = (I + M)^-T`` with
    ``M[j, i] = beta_j exp(g_{i+1} + .. + g_j) k_j . k_i`` (i < j): the flush then gets its u's as
    ``X TI`` with ``X = beta (V - exp(cum) S K^T)``, a product instead of L - 1 dependent
    steps. One value head per program keeps the chain of products short at small batch
    (the grid's third axis is 1 without UT). Without UT a program forms the products of PK
    key heads, loaded at once (``tuning.rules.prep_groups_default``). With PDL the non-flush launch
    may start at once (``release_dependents``): its ring records go to position c, these
    products read the records before c. With MMA the key-products program of a key head also
    stores k's and q's fp16 pieces (``mma_vector_pieces``) for the non-flush step's NVFP4
    tensor-core products (``nvfp4_decode="mma"``): (K, MMA_COLS) at ``mm_ptr`` and two
    factors at ``ms_ptr`` per (row, key head)."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    r = tl.program_id(2)
    release_dependents(PDL)
    if (b == 0) & (hk == 0) & (r == 0):
        flush_list(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L, RB)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        kk = tl.arange(0, K)
        j = tl.arange(0, LB)
        c = tl.load(cur_ptr + slot)
        if PK > 1:
            tl.static_assert(not UT, "the UT transform takes one key head per program")
            _key_products_of(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, hk * PK + tl.arange(0, PK),
                             slot, c, HK, K, CAP, LB)
            if MMA:
                for i in tl.static_range(PK):
                    _mma_key_pieces(q_ptr, k_ptr, mm_ptr, ms_ptr, b, hk * PK + i, HK, K)
        elif r == 0:
            _key_products(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, hk, slot, c, HK, K, CAP, LB,
                          True)
            if MMA:
                _mma_key_pieces(q_ptr, k_ptr, mm_ptr, ms_ptr, b, hk, HK, K)
        if UT:
            if c == L - 1:
                mj = j < c
                Kc = tl.load(kr_ptr + slot * s_kr + (hk * CAP + j[:, None]) * K + kk[None, :],
                             mask=mj[:, None], other=0.0).to(tl.float32)
                KK = tl.dot(Kc, tl.trans(Kc), input_precision=FOLD_PREC)  # [j, i] = k_j . k_i
                sq = j[:, None] * LB + j[None, :]
                h = hk * (HV // HK) + r
                gn = tl.load(gr_ptr + slot * s_gr + h * CAP + j + 1, mask=j + 1 < c, other=0.0)
                br = tl.load(br_ptr + slot * s_br + h * CAP + j, mask=mj, other=0.0)
                M = tl.where(j[None, :] < j[:, None],
                             br[:, None] * tl.exp(log_decay_segments(gn, LB)) * KK, 0.0)
                TI = tl.trans(unit_lower_inverse(M, LB, LOG_LB, FOLD_PREC))
                tl.store(ti_ptr + (b * HV + h) * (LB * LB) + sq, TI)


@triton.jit
def _gdn_nonflush_outputs(b, h, vt, slot, c, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                          src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs, kr_ptr,
                          ur_ptr, gr_ptr, s_kr, s_ur, s_gr, kd_ptr, lut_ptr,
                          HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
                          CAP: tl.constexpr, LB: tl.constexpr, SRC_FMT: tl.constexpr,
                          BV: tl.constexpr, LUT: tl.constexpr, FUSED_PREP: tl.constexpr,
                          PDL: tl.constexpr, ECAP: tl.constexpr, WORDS8: tl.constexpr = False,
                          mm_ptr=None, ms_ptr=None, MMA: tl.constexpr = False):
    """A non-flush program's ``(o, u, v)`` for value rows ``vt``: S k and S q from the read
    source in one pass, the key products (formed here with FUSED_PREP, else read from the
    ring-products launch after ``wait_prior_grid``) and the ring's u's; ECAP as
    ``ring_records``'s CAP, WORDS8 as ``rows_dot``'s. With MMA (an NVFP4 source, the
    ring-products launch writing k's and q's pieces) S k and S q come from one tensor-core
    product of the decoded rows (``nvfp4_mma_dot``), formed once the codes are loaded and
    decoded and the ring-products launch is done. With an fp8 source the u lines are
    asked of L2 before the state's loads (``prefetch_records``): the step ran 0.9-2.6%
    faster at batch 256 / 512 on the H200 (fp8-read/fp32, shared-fp8), while with an fp32 or
    NVFP4 source the prefetch measured 1-4% slower and loading the records themselves first
    4-28% slower."""
    RATIO: tl.constexpr = HV // HK
    hk = h // RATIO
    j = tl.arange(0, LB)
    mj = j < c
    # a narrow source's program drops its row mask where its tiles divide V: NVFP4's 64-row
    # program then takes 96 registers instead of 124 (Triton 3.6, sm_90) and its step ran
    # 1.2-4.0% faster at batch 256 / 512; an fp32 source's took 156 instead of 151 and its
    # step ran 1.9-2.5% slower
    WHOLE: tl.constexpr = (V % BV == 0) and (SRC_FMT != 0)
    vv, mv = tile_rows(vt, V, BV, WHOLE)
    q_row = q_ptr + (b * HK + hk) * K
    k_row = k_ptr + (b * HK + hk) * K
    if SRC_FMT == 3:  # an fp8 source: the ring's u lines of these rows asked of L2 first
        prefetch_records(ur_ptr + slot * s_ur + (h * CAP + j) * V + vt * BV,
                         j < CAP if ECAP > 0 else mj, V - vt * BV, BV)
    if MMA:
        tl.static_assert(SRC_FMT == 4 and not FUSED_PREP,
                         "the tensor-core products read an NVFP4 source and the pieces the "
                         "ring-products launch writes")
        sk, sq = nvfp4_mma_rows_dot(src_ptr + slot * s_src, src_rs_ptr + slot * s_srcrs,
                                    src_bs_ptr + slot * s_srcbs, h * V + vv, mv,
                                    mm_ptr + (b * HK + hk) * (K * 16),
                                    ms_ptr + 2 * (b * HK + hk), BV, K, True, PDL)
    else:
        sk, sq = rows_dot(src_ptr + slot * s_src, src_rs_ptr + slot * s_srcrs,
                          src_bs_ptr + slot * s_srcbs, h * V + vv, mv, k_row, q_row,
                          lut_ptr, SRC_FMT, BV, K, True, LUT, WORDS8=WORDS8)
    gt = tl.load(g_ptr + b * HV + h).to(tl.float32)
    beta = tl.load(beta_ptr + b * HV + h).to(tl.float32)
    _, after, total, _ = log_decay_suffixes(gr_ptr + slot * s_gr + h * CAP, c, gt, LB, ECAP)
    dec = tl.where(mj, tl.exp(after), 0.0)  # decay from record j to now
    if FUSED_PREP:
        kkt, kq, kq0 = _key_products(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, hk, slot, c,
                                     HK, K, CAP, LB, False, ECAP)
    else:
        wait_prior_grid(PDL)  # the key products come from the ring-products launch
        kd = kd_ptr + (b * HK + hk) * (2 * LB + 1)
        kkt = tl.load(kd + j, mask=mj, other=0.0)
        kq = tl.load(kd + LB + j, mask=mj, other=0.0)
        kq0 = tl.load(kd + 2 * LB)
    v = tl.load(v_ptr + (b * HV + h) * V + vv, mask=mv, other=0.0).to(tl.float32)
    U = ring_records(ur_ptr + slot * s_ur + (h * CAP + j[None, :]) * V + vv[:, None],
                     mj[None, :] & mv[:, None], (j < CAP)[None, :] & mv[:, None], ECAP)
    G = tl.exp(total)
    w = G * sk + tl.sum(U * (dec * kkt)[None, :], axis=1)
    u = beta * (v - w)
    o = G * sq + tl.sum(U * (dec * kq)[None, :], axis=1) + u * kq0
    return o, u, v


@triton.jit(do_not_specialize=["seed", "layer", "nrows"])
def _gdn_nonflush_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, slots_ptr, o_ptr,
    src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
    kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
    cur_ptr, kd_ptr, lut_ptr, fi_ptr, list_ptr, nrows,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs, nan_ptr, seed, layer, ticket_ptr,
    mm_ptr, ms_ptr,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    SRC_FMT: tl.constexpr, RECOMPUTE: tl.constexpr, BV: tl.constexpr, LUT: tl.constexpr,
    TILE_FIRST: tl.constexpr = False, FUSED_PREP: tl.constexpr = False,
    ONE_LAUNCH: tl.constexpr = False, ADVANCE: tl.constexpr = False, CK_FMT: tl.constexpr = 0,
    RD_FMT: tl.constexpr = 0, SR: tl.constexpr = False, PDL: tl.constexpr = False,
    FLUSH_PDL: tl.constexpr = False, EARLY: tl.constexpr = False, WORDS8: tl.constexpr = False,
    FR: tl.constexpr = 0, FR_DOT: tl.constexpr = False, MMA: tl.constexpr = False,
):
    """Non-flush step per (row, value head, BV value rows): u_t and o_t from the read source (S
    k and S q in one pass) + the ring, then append the record. Flushing rows exit at once: the
    flush kernel serves them. PDL and FLUSH_PDL as in the Mamba-2 non-flush kernel: the key
    products are read after ``wait_prior_grid``, once S k and S q are formed. With FUSED_PREP
    the program forms its key head's ``k_j . k``, ``k_j . q`` and ``k . q`` itself (program 0 of
    a key head also stores them for a flushing row's flush) and the first program builds the
    flush list, so the ring-products launch is skipped. With ONE_LAUNCH (implies FUSED_PREP) the
    programs of a flushing row flush their own rows instead (``_gdn_flush_rows``, records folded
    one by one) and, with ADVANCE, each row's last program to finish advances its cursor
    (``finish_row``): the step is this launch alone. EARLY as in the Mamba-2 non-flush
    kernel: the output's loads are issued before the cursor arrives. WORDS8 decodes an fp8
    read source from int32 words (``rows_dot``). FR > 0 has a one-launch program flush its
    rows in passes of FR rows, as in the Mamba-2 kernel (FR_DOT: each pass's records folded
    as one bf16x3 product; no u recompute). MMA forms an NVFP4 source's S k and S q on
    tensor cores from the pieces at ``mm_ptr`` / ``ms_ptr`` (``_gdn_nonflush_outputs``)."""
    RATIO: tl.constexpr = HV // HK
    b, h, vt = row_head_tile(TILE_FIRST)
    if FUSED_PREP and not ONE_LAUNCH:
        if (b == 0) & (h == 0) & (vt == 0):
            flush_list(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L, 256)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        c = tl.load(cur_ptr + slot)
        fi = tl.load(fi_ptr + slot) + 1 if ONE_LAUNCH else 0
        if EARLY:  # before the cursor arrives; flushing rows discard the results
            o, u, v = _gdn_nonflush_outputs(
                b, h, vt, slot, c, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs, kr_ptr, ur_ptr,
                gr_ptr, s_kr, s_ur, s_gr, kd_ptr, lut_ptr, HV, HK, V, K, CAP, LB, SRC_FMT, BV,
                LUT, FUSED_PREP, PDL, CAP, WORDS8, mm_ptr, ms_ptr, MMA)
        if FUSED_PREP and not ONE_LAUNCH:
            if (c == L - 1) & (vt == 0) & (h % RATIO == 0):
                _key_products(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, h // RATIO, slot, c,
                              HK, K, CAP, LB, True)
        if c != L - 1:
            release_dependents(FLUSH_PDL)  # programs of flushing rows end without it
            hk = h // RATIO
            vv, mv = tile_rows(vt, V, BV, (V % BV == 0) and (SRC_FMT != 0))
            k_row = k_ptr + (b * HK + hk) * K
            if not EARLY:
                o, u, v = _gdn_nonflush_outputs(
                    b, h, vt, slot, c, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
                    src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs, kr_ptr, ur_ptr,
                    gr_ptr, s_kr, s_ur, s_gr, kd_ptr, lut_ptr, HV, HK, V, K, CAP, LB, SRC_FMT,
                    BV, LUT, FUSED_PREP, PDL, 0, WORDS8, mm_ptr, ms_ptr, MMA)
            gt = tl.load(g_ptr + b * HV + h).to(tl.float32)
            beta = tl.load(beta_ptr + b * HV + h).to(tl.float32)
            tl.store(o_ptr + (b * HV + h) * V + vv, o, mask=mv)
            tl.store(ur_ptr + slot * s_ur + (h * CAP + c) * V + vv, u, mask=mv)
            if RECOMPUTE:
                tl.store(vr_ptr + slot * s_vr + (h * CAP + c) * V + vv,
                         v.to(vr_ptr.dtype.element_ty), mask=mv)
            if vt == 0:
                tl.store(gr_ptr + slot * s_gr + h * CAP + c, gt)
                if RECOMPUTE:
                    tl.store(br_ptr + slot * s_br + h * CAP + c, beta)
                if h % RATIO == 0:
                    kk = tl.arange(0, K)
                    k = tl.load(k_row + kk)
                    tl.store(kr_ptr + slot * s_kr + (hk * CAP + c) * K + kk,
                             k.to(kr_ptr.dtype.element_ty))
        elif ONE_LAUNCH:
            kkt = tl.zeros((LB,), dtype=tl.float32)
            if not RECOMPUTE:  # the records' u come from the ring: w needs k_j . k
                kkt = _key_products(q_ptr, k_ptr, kr_ptr, s_kr, kd_ptr, b, h // RATIO, slot,
                                    c, HK, K, CAP, LB, False)[0]
            if FR > 0:
                nans = tl.zeros((), dtype=tl.int32)
                for v0 in tl.range(0, BV, FR, num_stages=1):
                    vv = vt * BV + v0 + tl.arange(0, FR)
                    nans += _gdn_flush_rows(
                        b, h, vv, vv < V, slot, fi, kd_ptr, kkt, q_ptr, k_ptr, v_ptr, g_ptr,
                        beta_ptr, o_ptr, ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                        rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                        kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
                        kd_ptr, seed, layer, HV, HK, V, K, L, CAP, LB, CK_FMT, RD_FMT, SR,
                        RECOMPUTE, FR, not FR_DOT, "bf16x3" if FR_DOT else "ieee", True,
                        ck_ptr, 0, False)
            else:
                vv = vt * BV + tl.arange(0, BV)
                nans = _gdn_flush_rows(
                    b, h, vv, vv < V, slot, fi, kd_ptr, kkt, q_ptr, k_ptr, v_ptr, g_ptr,
                    beta_ptr, o_ptr, ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                    kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
                    kd_ptr, seed, layer, HV, HK, V, K, L, CAP, LB, CK_FMT, RD_FMT, SR, RECOMPUTE,
                    BV, True, "ieee", True, ck_ptr, 0, False)
            if nans > 0:
                tl.atomic_add(nan_ptr, nans)
        if ONE_LAUNCH and ADVANCE:
            finish_row(ticket_ptr, slot, cur_ptr, fi_ptr, c, fi, L, TILE_FIRST)
    wait_prior_grid(PDL)  # no program ends before the ring products are written
