"""Triton decode kernels for Gated DeltaNet layers: conventional step and ReplaySSM step
(non-flush or flush per row, decided on the device from the cursor).

One program handles one (batch row, value head, tile of value rows) and holds those state
rows (rows x d_k) in registers: u's value rows are independent, so no cross-program reduction is
needed. A ReplaySSM step is three launches as for Mamba-2 (``mamba2.py``): ring products per
key head (``k_j . k``, ``k_j . q``) and the flush list, the lean non-flush kernel, the
persistent flush. With a read copy, the flush recomputes every u of the window from the
high-precision checkpoint before folding (``U = X (I + M)^-T``, the transform from the
ring-products launch), so the read copy's error never enters the recurrence. At small
batch a step is one launch, as for Mamba-2 (``one_launch_default``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ssm import gdn as ref
from .core.cache import ReplayCache, reference_call, runs_reference, slot_stride
from .core.codes import lut_table
from .core.memory import (
    prefetch_records,
    register_cap,
    release_dependents,
    resolve_flush_tma,
    row_head_tile,
    state_descriptor,
    step_grid,
    tile_rows,
    wait_prior_grid,
)
from .core.persistent import launch_persistent
from .core.products import mma_vector_pieces, nvfp4_mma_rows_dot, rows_dot
from .core.ring import (
    advance_cursor,
    advance_rows,
    finish_row,
    flush_list,
    fmt_code,
    shift_and_commit,
    state_args,
)
from .core.rounding import sr_words_for
from .core.state_io import count_nans, load_cols, load_rows, row_scales, split_dot, store_rows, write_state
from .core.sums import log_decay_segments, log_decay_suffixes, ring_records, unit_lower_inverse
from .core.target import Target
from .knobs import (
    DEFAULT,
    check_prep_groups,
    check_step_flush,
    fold_precision,
    fp8_decode_of,
    pdl_edges_of,
    records_fold,
    resolve_pdl,
    split_terms,
    verify_chunk,
    verify_precision,
)
from .plan import FlushPlan, StepPlan, check_knob_names, note_plan
from .tuning.rules import (
    default_fold_precision,
    flush_warps_default,
    fused_prep_default,
    keeps_counters,
    prep_groups_default,
    reads_narrow_copy,
    resolve_one_launch,
    small_grid_rows,
    verify_maxnreg_default,
)


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


WHOLE_ROW_PREP_MIN_BATCH = 256


def gdn_prep_groups_default(cfg, batch: int, key_heads: int) -> int:
    """Key heads per GDN ring-products program: every key head of a row in one program (the
    largest power of two dividing the key heads) for a step that reads an fp32 (not fp8 /
    NVFP4) state at batch >= ``WHOLE_ROW_PREP_MIN_BATCH``, else
    ``mamba2.prep_groups_default``. The non-flush launch starts (programmatic launch) once
    every products program has started, so fewer programs start it sooner: on the H200 the
    replay-fp32 non-flush kernel started 0.9 instead of 4.3 us into the step at batch 256
    with 8 key heads a program, and with 16 the window took 164.7 -> 163.1 us on Qwen3.5-4B
    and 313.0 -> 310.7 on Qwen3.5-122B (316.5 against 317.6 and 612.9 against 613.4-614.3 at
    512), while the narrow reads, bound by instruction issue, moved within -0.8 to +1.1 us
    and batch 64 lost up to 1 us
    (reports/kernels/tune_r217_gdn_prep.log, tune_r218_gdn_prep.log,
    timeline_r217_gdn_prep.log)."""
    if batch >= WHOLE_ROW_PREP_MIN_BATCH and not reads_narrow_copy(cfg):
        return key_heads & -key_heads
    return prep_groups_default(batch, key_heads)


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
    key heads, loaded at once (``mamba2.prep_groups_default``). With PDL the non-flush launch
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
    4-28% slower (reports/kernels/tune_r226-r229_*.log)."""
    RATIO: tl.constexpr = HV // HK
    hk = h // RATIO
    j = tl.arange(0, LB)
    mj = j < c
    # a narrow source's program drops its row mask where its tiles divide V: NVFP4's 64-row
    # program then takes 96 registers instead of 124 (Triton 3.6, sm_90) and its step ran
    # 1.2-4.0% faster at batch 256 / 512; an fp32 source's took 156 instead of 151 and its
    # step ran 1.9-2.5% slower (reports/kernels/tune_r232_whole_tiles.log)
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


def _check_ut_tile(ut: bool, precision: str, rows: int, warps: int) -> None:
    """Refuse the one flush tile known to fault: the UT-transform flush (``flush_fold="dot"``
    with a read copy) with TF32x3 products on 64+ rows and 8+ warps (two warp groups) hits an
    illegal memory access on the H200 with Triton 3.6, which poisons the CUDA context; 32
    rows, 4 warps, the ``"ieee"`` products and the flush without a read copy all run
    (reports/kernels/probe_r43_tf32x3_tiles.log)."""
    if ut and precision == "tf32x3" and rows >= 64 and warps >= 8:
        raise ValueError(
            f"flush_precision='tf32x3' with the UT-transform flush on {rows}-row tiles and "
            f"{warps} warps faults on the GPU (Triton 3.6); use flush_warps=4, "
            "flush_block_v=32 or flush_precision='ieee'")


def gdn_tile_first(capacity: int, narrow: bool = True) -> bool:
    """Default grid order (``tile_first``) of the GDN conventional / non-flush step, measured on
    the H200 at batch 256: (tiles, heads, rows) for the conventional step (Qwen3.5-122B 627 ->
    584 us, 4B 291.5 -> 285.5 us, reports/kernels/tune_r27_grid_order.log) and for the
    one-warp non-flush step that reads the state itself rather than an fp8 / NVFP4 copy
    (``narrow``; 4B 165.3 -> 158.5 us, 122B 308.1 -> 295.0 us, ``tune_r66/r67_fp32_tiles.log``);
    (rows, heads, tiles) for the narrow reads."""
    return capacity == 0 or not narrow


# From this batch the replays of an SR checkpoint's copies take 16-row four-warp tiles
# capped at 64 registers and an fp8 copy's replay is capped at 168 (gdn_flush_knobs,
# gdn_flush_maxnreg_default); below it they were 0-6.6% slower (tune_r252_new_tiles.log).
READ_COPY_FLUSH_MIN_BATCH = 64


def gdn_flush_knobs(cfg, batch: int = 256) -> tuple[str, int, int]:
    """(flush_fold, value rows, warps) defaults of the GDN flush at ``batch`` rows, measured
    on the H200 (reports/kernels/tune_r31_gdn_recompute_records.log): where the flush
    recomputes u (a narrow read copy), ``"records"`` replays the window from the checkpoint
    record by record: Qwen3.5-122B nvfp4-read/fp16-sr flush 4.4 -> 2.4 ms at batch
    256 and 31 -> 21 us at batch 1, against the UT transform's ``X (I + M)^-T``, whose
    products spilled; otherwise ``"dot"`` (the u's from the ring) on one-warp tiles for a
    checkpoint without SR: 16 rows for fp32 (Qwen3.5-122B 1432 -> 937 us, 4B 744 -> 457 us,
    reports/kernels/tune_r46_fp32_flush_*.log), 8 for fp8 / NVFP4 (shared-nvfp4 1829 ->
    1562 us and 932 -> 793 us, tune_r49_wave_flush_shared_*.log; the fp8 checkpoint on 16
    rows once its products run on tensor cores, 1028 -> 712 us and 521 -> 371 us,
    tune_r147_fp8_tiles.log), the NVFP4 checkpoint
    folding record by record once the keys load in the state's layout (1534 -> 1286 us and
    780 -> 657 us, tune_r53_flush_variants.log); else 32 rows and ``flush_warps_default`` warps.

    The replays of a read copy take 16 rows: an fp8 copy of an fp32 checkpoint on one warp
    (4B 1106 -> 1016 us, tune_r51), an NVFP4 copy of one on two warps and, from
    ``READ_COPY_FLUSH_MIN_BATCH``, an SR checkpoint's copies on four (32 rows on eight
    below it), the last two with the register caps of ``gdn_flush_maxnreg_default``. Window
    us against 16 rows on one warp (NVFP4 copy) and 32 rows on eight (SR, capped at 80 from
    batch 256) on Qwen3.5-4B / 122B (reports/kernels/tune_r252_new_tiles.log):

    - nvfp4-read/fp32: batch 8 8.5 / 13.1 against 9.6 / 14.1, batch 64 30.4 / 56.2 against
      33.9 / 58.2, batch 256 107.2 / 204.3 against 113.1 / 207.6, batch 512 206.4 / 400.0
      against 215.8 / 403.5 (L = 8: 3-10% faster, tune_r251_flush_tiles_window.log);
    - nvfp4-read/fp16-sr 1.4-2.7% faster from batch 64 (batch 256: 119.5 / 228.0 against
      122.8 / 233.6), nvfp4-read/fp8-sr 0.5-1.5%; at batch 8 and 16 they were 0-6.6%
      slower."""
    if cfg.recompute_u:
        if not cfg.uses_sr:  # fp8 / NVFP4 copy of an fp32 checkpoint
            return "records", 16, 2 if cfg.read.name == "nvfp4" else 1
        return ("records", 16, 4) if batch >= READ_COPY_FLUSH_MIN_BATCH else ("records", 32, 8)
    if cfg.ckpt.name == "nvfp4" and not cfg.uses_sr:  # 122B 1534 -> 1286 us (tune_r53)
        return "records", 8, 1
    if not cfg.uses_sr:  # fp32 or fp8 checkpoint (bf16x3 products on a bf16 ring)
        return "dot", 16, 1
    return "dot", 32, flush_warps_default(cfg)


def gdn_flush_stages(precision: str, records: bool, cfg=None, tma: bool = False) -> int | None:
    """Software-pipelining stages of the persistent GDN flush loop with the tensor-core
    ``"bf16x3"`` dot fold (H200, batch 256, one-warp 16-row tiles): 3 for an fp32 checkpoint
    loaded with cp.async (Qwen3.5-4B 416 -> 362 us, 122B 793 -> 709 us against Triton's
    choice, ``reports/kernels/tune_r74_fp32_flush_stages.log``); 2 for one loaded through TMA
    (``resolve_flush_tma``; 354.0 -> 350.7 and 690.7 -> 682.4 us against 3) and for an fp8
    checkpoint (shared-fp8: 371.0 -> 358.8 and 716.3 -> 700.5 us, tune_r152_tma.log; 371 ->
    360 and 712 -> 702 in tune_r148_fp8_stages.log); None (Triton's choice) otherwise, where
    1-3 stages moved the FMA fold by 2% or less."""
    if precision != "bf16x3" or records:
        return None
    return 2 if tma or (cfg is not None and cfg.ckpt.name.startswith("fp8")) else 3


GDN_NVFP4_DECODES = ("words", "lut", "mma")


def gdn_nvfp4_decode_of(mode: str | None, lut: bool) -> str:
    """How a GDN non-flush step decodes an NVFP4 source (the plan's ``decode``):

    - ``"words"`` (default): three integer operations per element into fp32 bit patterns
      (``common.e2m1_word_scaled``), two FMAs per element for S k and S q;
    - ``"lut"`` (also ``lut=True``): each nibble's value from a 16-entry table;
    - ``"mma"``: the codes through E4M3 bytes into fp16 times their block scale (exact), and
      S k and S q as one tensor-core product with k's and q's fp16 pieces, which the
      ring-products launch writes (``common.nvfp4_mma_dot``; a step with that launch only).
      Compiled for sm_90 (Triton 3.6), Qwen3.5-4B's 64-row program takes 1592 instructions
      instead of 2248 (6.2 per element against the 9.6 that 85% of copy bandwidth leaves)
      and 124 registers instead of 96 (16 programs per SM instead of 20;
      ``tools/sass_stats.py gdn-nonflush --nvfp4-decode mma --budget``). Not yet timed on
      the H200, so not a default."""
    if lut:
        if mode not in (None, "lut"):
            raise ValueError(f"lut=True decodes NVFP4 through a table; nvfp4_decode={mode!r} "
                             "asks for another decode")
        return "lut"
    mode = mode or "words"
    if mode not in GDN_NVFP4_DECODES:
        raise ValueError(f"nvfp4_decode must be one of {GDN_NVFP4_DECODES}, got {mode!r}")
    return mode


def gdn_fp8_decode_default(batch: int) -> str:
    """``fp8_decode`` of a GDN step that reads an fp8 source: ``"words"`` at batch 1 and from
    batch 256, ``"cvt"`` between. Measured on the H200 (reports/kernels/tune_r220_b1_*.log,
    tune_r221_gdn_fp8.log), window us cvt -> words:

    - batch 1, every state from HBM (conventional 4.7 / 5.4 us): fp8-read/fp32 on Qwen3.5-4B
      5.5 -> 5.1, on 122B 6.1 -> 5.7; shared-fp8 5.3 -> 5.1 and 5.8 -> 5.7;
    - batch 4 and 64: 0-0.8 and 1.0-2.2 us slower;
    - batch 256: fp8-read/fp32 134.6 -> 132.9 and 259.7 -> 252.9, shared-fp8 98.4 -> 97.1
      and 188.9 -> 183.2 (L = 8: -2.7 to +0.9)."""
    return "words" if batch == 1 or batch >= 256 else "cvt"


def gdn_nonflush_maxnreg_default(decode: str, rows: int, warps: int, default_rows: int,
                                 default_warps: int, fused: bool) -> int | None:
    """The register cap of a GDN non-flush program left at its default ``maxnreg``, measured
    on the H200: 80 for an fp8 source decoded from int32 words (``fp8_decode="words"``, the
    default from batch 256) on its default one-warp 32-row tiles, in a step of separate
    launches. It takes 96 registers uncapped and 80 capped, with 1584 instructions instead of
    1544 and no spills; an SM then holds 24 one-warp programs instead of 20
    (``persistent.programs_per_sm``). The non-flush step is 6.9-9.1% faster and the window
    4.1-6.2%: fp8-read/fp32 78.5 -> 72.9 and 150.1 -> 137.3 us on Qwen3.5-4B, 144.5 -> 132.5
    and 283.5 -> 257.6 us on 122B at batch 256 / 512 (reports/kernels/
    tune_r244_regcap_default.log, tune_r243_nonflush_regcap.log). Elsewhere
    None: the byte-tile decode takes 158 registers and spills at 80, an NVFP4 source spills
    at 80 and ran 2-4% slower, and a step with its ring products fused in holds more."""
    if (decode == "words8" and rows == default_rows and warps == default_warps == 1
            and not fused):
        return 80
    return None


def gdn_flush_maxnreg_default(cfg, records: bool, rows: int, warps: int, batch: int) -> int | None:
    """The register cap of a GDN flush program left at its default ``flush_maxnreg``,
    measured on the H200, where the flush replays the window record by record on its
    default tiles at ``batch`` (``gdn_flush_knobs``; programs per SM from
    ``persistent.programs_per_sm``):

    - an SR checkpoint's copies, from ``READ_COPY_FLUSH_MIN_BATCH`` (16 rows on 4 warps):
      64. 96-127 registers and 4-5 programs per SM uncapped, 64 with 64-71 spill
      instructions and 8 per SM; the flush alone at batch 256 1140.5 -> 1097.1 us
      (nvfp4-read/fp16-sr, Qwen3.5-4B) and 1265.1 -> 1208.5 (fp8-sr),
      reports/kernels/tune_r250_flush_tiles.log;
    - an NVFP4 copy of an fp32 checkpoint (16 rows on 2 warps): 128. 158 registers and 6
      per SM uncapped, 128 with 1 spill instruction and 8 per SM;
    - an fp8 copy of an fp32 checkpoint (16 rows on 1 warp), from
      ``READ_COPY_FLUSH_MIN_BATCH``: 168. 225 registers and 8 per SM uncapped, 168 with
      6-21 spill instructions and 12 per SM. Flush us without -> with the cap at batch 256 /
      512 on Qwen3.5-4B and 122B (tune_r247_flush_caps.log): 920.7 -> 875.4, 1821.4 ->
      1709.3, 1807.1 -> 1679.3, 3593.1 -> 3332.3; windows 6.2-9.4% faster
      (tune_r249_flush_cap_default.log), at batch 64 36.5 -> 34.6 and 66.0 -> 61.7 us, at
      batch 8 8.0 -> 8.2 and 13.7 -> 13.7 (tune_r252_new_tiles.log). Its 8-row tiles at 96
      and two-warp tiles at 128 ran the flush alone 3-8% faster at batch 256 but the windows
      0.4-1.8% slower (tune_r250, tune_r251).

    Elsewhere None: the NVFP4 checkpoint's flush ran 2.8-4.2% slower at 128, and Mamba-2's
    flushes at the next step ran 1.3% faster to 9.7% slower."""
    if not (records and cfg.recompute_u):
        return None
    if (rows, warps) != gdn_flush_knobs(cfg, batch)[1:]:
        return None
    if cfg.read.name == "nvfp4" and not cfg.uses_sr:
        return 128
    if batch < READ_COPY_FLUSH_MIN_BATCH:
        return None
    return 64 if cfg.uses_sr else (168 if cfg.read.name.startswith("fp8") else None)


def gdn_step_knobs(cfg, V: int) -> tuple[int, int]:
    """(value rows, warps) per program of the conventional / non-flush step, measured on the
    H200 at batch 256 (reports/kernels): conventional 32 rows / 8 warps, 8 / 2 with fp16 SR
    (Qwen3.5-122B 624 -> 588 us, ``tune_r14_small_tiles.log``), 16 / 1 for an fp32 state
    (4B 281 -> 269 us, 122B 582 -> 555-580 us, ``tune_r66/r67_fp32_tiles.log``); non-flush
    32 rows / 1 warp (tile-first: 4B 171.8 -> 158.5 us, 122B 325.0 -> 295.0 us against 2 warps,
    same logs), 64 rows / 1 warp reading an NVFP4 copy (NVFP4 on
    Qwen3.5-4B 168 -> 69 us, ``tune_r11_nvfp4.log``), 32 rows / 1 warp reading an fp8 one: at
    64 rows its two row products take 255 registers and spill (fp8-read/fp32 on Qwen3.5-4B
    93.1 -> 90.3 us, 122B 167.4 -> 165.2 us, ``tune_r60_gdn_fp8_nonflush.log``)."""
    vp = triton.next_power_of_2(V)
    if cfg.L == 1:
        if cfg.uses_sr and cfg.ckpt.name == "fp16":
            return min(vp, 8), 2
        return (min(vp, 16), 1) if cfg.ckpt.name == "fp32" else (min(vp, 32), 8)
    if reads_narrow_copy(cfg):
        return (min(vp, 32 if (cfg.read or cfg.ckpt).name.startswith("fp8") else 64), 1)
    return min(vp, 32), 1


def _check(cache: ReplayCache, q, k, v, g, beta, slots):
    if cache.kind != "gdn":
        raise ValueError(f"expected a gdn cache, got {cache.kind}")
    HK, K = q.shape[-2:]
    HV, V = v.shape[-2:]
    if HV % HK:
        raise ValueError(f"value heads ({HV}) must be a multiple of key heads ({HK})")
    if k.shape != q.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ")
    if cache.ckpt.data.shape[1] != HV or cache.ckpt.data.shape[2] != V:
        raise ValueError(f"inputs have {HV} value heads x {V}, cache has "
                         f"{tuple(cache.ckpt.data.shape[1:3])}")
    if K % 32 or K & (K - 1):
        raise ValueError(f"d_k must be a power of two >= 32, got {K}")
    if g.dtype != torch.float32 or beta.dtype != torch.float32:
        raise ValueError("g and beta must be fp32")
    if slots.dtype != torch.int32:
        raise ValueError("slots must be int32")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    return HV, HK, V, K


def gdn_decode_step(cache: ReplayCache, q, k, v, g, beta, slots, *, advance: bool = True,
                    out: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """One GDN decode step: q, k (B, Hk, K) normalised (q scaled), v (B, Hv, V), g (B, Hv)
    log-decay, beta (B, Hv), slots (B,) int32. Returns o (B, Hv, V) fp32. The launch knobs
    are keyword arguments, resolved and checked by ``gdn_step_plan``. ReplaySSM configs
    run three launches like Mamba-2's (ring products + flush list, non-flush rows,
    persistent flush over the flushing rows' tiles, which also advances the cursors unless
    ``fuse_advance=False``; ``fuse_prep``, ``maxnreg`` (default
    ``gdn_nonflush_maxnreg_default``), ``flush_maxnreg`` (default
    ``gdn_flush_maxnreg_default``; None: no cap), ``one_launch``,
    ``pdl``, ``early_loads``, ``prep_groups`` (key heads per ring-products program),
    ``fp8_decode`` (default ``gdn_fp8_decode_default``), ``nvfp4_decode``
    (``gdn_nvfp4_decode_of``) and ``flush_tma`` as for Mamba-2,
    except that ``early_loads`` is off by default: at batch 1 it added 1.1-3.2 us to the
    NVFP4 / fp8 flush steps for 0.2-0.4 us off the non-flush ones
    (reports/kernels/tune_r111_early_b1.log), and with every state from HBM it slowed
    the fp8-read/fp32 window 5.5 -> 6.2 us on Qwen3.5-4B (tune_r206_b1_hbm_knobs.log);
    the UT-transform flush, ``flush_fold="dot"`` with a read copy, needs its own launch and
    is never one launch)."""
    if runs_reference(q):
        check_knob_names(gdn_step_plan, knobs)
        return reference_call(cache, lambda st: ref.decode_step(st, q, k, v, g, beta, slots),
                              advance=advance, out=out)
    HV, HK, V, K = _check(cache, q, k, v, g, beta, slots)
    cfg = cache.cfg
    plan = gdn_step_plan(cfg, cache.capacity, HV, HK, V, K, q.shape[0], q.device,
                         # a conventional cache may hold no ring (the vLLM plugin's pages)
                         ring_dtype=cache.ring["k"].dtype if "k" in cache.ring else k.dtype,
                         ckpt_data=cache.ckpt.data, advance=advance, **knobs)
    note_plan(plan)
    Bsz = q.shape[0]
    o = out if out is not None else torch.empty(Bsz, HV, V, device=q.device, dtype=torch.float32)
    ck = state_args(cache.ckpt, slots)
    if plan.conventional:
        _gdn_conv_kernel[plan.grid](q, k, v, g, beta, slots, o, *ck, cache.flush_index,
                                    cache.nan_count, cache.seed, cache.layer, cache.ticket,
                                    cache.cursor, Bsz, HV=HV, HK=HK, V=V, K=K,
                                    CK_FMT=fmt_code(cache.ckpt), SR=cfg.uses_sr, BV=plan.rows,
                                    TILE_FIRST=plan.tile_first, ADVANCE=plan.ticket,
                                    num_warps=plan.warps, **register_cap(plan.maxnreg))
        if plan.separate_advance:
            advance_cursor(cache, slots)
        return o
    rd = state_args(cache.read, slots)
    LB = max(16, triton.next_power_of_2(cache.capacity))
    kd = torch.empty(Bsz, HK, 2 * LB + 1, device=q.device, dtype=torch.float32)
    work = torch.empty(2 * Bsz + 1, device=q.device, dtype=torch.int32)
    ring = _ring_args(cache)
    kr, gr, br = ring[0], ring[2], ring[4]
    fl = plan.flush
    ut = fl is not None and fl.ut  # the flush solves the window with (I + M)^-T
    ti = torch.empty(Bsz * HV * LB * LB if ut else 1, device=q.device, dtype=torch.float32)
    mma = plan.decode == "mma" and cache.capacity > 0
    # k's and q's fp16 pieces for the tensor-core products (nvfp4_decode="mma")
    mm = torch.empty(Bsz * HK * K * 16 if mma else 1, device=q.device, dtype=torch.float16)
    ms = torch.empty(Bsz * HK * 2 if mma else 1, device=q.device, dtype=torch.float32)
    if plan.prep_grid is not None:
        _gdn_prep_kernel[plan.prep_grid](
            q, k, slots, kr, gr, br, slot_stride(kr), slot_stride(gr), slot_stride(br),
            cache.cursor, cache.flush_index, kd, ti, work, Bsz, mm, ms, HV=HV, HK=HK, K=K,
            L=cfg.L, CAP=cache.capacity, LB=LB, LOG_LB=LB.bit_length() - 1, RB=256, UT=ut,
            FOLD_PREC="ieee" if fl.precision == "bf16x3" else fl.precision,
            PDL=plan.prep_pdl, PK=plan.prep_groups, MMA=mma, num_warps=4)
    fl_pdl = fl is not None and fl.pdl
    src = rd if cache.read is not None else ck
    _gdn_nonflush_kernel[plan.grid](
        q, k, v, g, beta, slots, o, *src, *ring, cache.cursor, kd,
        lut_table(plan.lut, o), cache.flush_index, work, Bsz, *ck, *rd, cache.nan_count,
        cache.seed, cache.layer, cache.ticket, mm, ms, HV=HV, HK=HK, V=V, K=K,
        L=cfg.L, CAP=cache.capacity, LB=LB,
        SRC_FMT=fmt_code(cache.read or cache.ckpt), RECOMPUTE=cfg.recompute_u, BV=plan.rows,
        LUT=plan.lut,
        TILE_FIRST=plan.tile_first, FUSED_PREP=plan.fused_prep, ONE_LAUNCH=plan.one_launch,
        ADVANCE=plan.ticket, CK_FMT=fmt_code(cache.ckpt), RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr,
        PDL=plan.step_pdl, FLUSH_PDL=fl_pdl, EARLY=plan.early_loads,
        WORDS8=plan.decode == "words8", launch_pdl=plan.step_pdl,
        FR=plan.step_flush_rows, FR_DOT=plan.step_flush_fold == "dot", MMA=mma,
        num_warps=plan.warps, **register_cap(plan.maxnreg))
    if fl is not None:
        launch_persistent(
            _gdn_flush_kernel, q.device, fl.tiles, fl.per_sm,
            q, k, v, g, beta, slots, o, *ck, *rd, *ring, kd, ti, work, cache.cursor,
            cache.flush_index, cache.nan_count, cache.seed, cache.layer, Bsz, HV=HV, HK=HK, V=V,
            K=K, L=cfg.L, CAP=cache.capacity, LB=LB, CK_FMT=fmt_code(cache.ckpt),
            RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr, RECOMPUTE=cfg.recompute_u, BVF=fl.rows,
            RECORDS=fl.fold == "records", STAGES=fl.stages, FOLD_PREC=fl.precision,
            ADVANCE=fl.advances_cursor, PDL=fl.pdl, launch_pdl=fl.pdl, num_warps=fl.warps,
            ck_desc=state_descriptor(cache.ckpt, fl.rows, fl.tma) if fl.tma else ck[0],
            TMA=fl.tma, **register_cap(fl.maxnreg))
    if plan.separate_advance:
        advance_cursor(cache, slots)
    return o


def gdn_step_plan(cfg, capacity: int, HV: int, HK: int, V: int, K: int, batch: int,
                  target: Target | torch.device, *, ring_dtype: torch.dtype = torch.bfloat16,
                  ckpt_data: torch.Tensor | None = None, block_v: int | None = None,
                  advance: bool = True, num_warps: int | None = None,
                  flush_block_v: int | None = None, flush_warps: int | None = None,
                  flush_per_sm: int | None = None, lut: bool = False,
                  flush_stages: int | None = None, flush_fold: str | None = None,
                  flush_precision: str | None = None, tile_first: bool | None = None,
                  fuse_advance: bool = True, fuse_prep: bool | None = None,
                  maxnreg: int | None | object = DEFAULT,
                  flush_maxnreg: int | None | object = DEFAULT,
                  one_launch: bool | None = None, pdl: bool | str | None = None,
                  early_loads: bool = False, prep_groups: int | None = None,
                  flush_tma: bool | None = None, fp8_decode: str | None = None,
                  nvfp4_decode: str | None = None, step_flush_rows: int | None = None,
                  step_flush_fold: str | None = None) -> StepPlan:
    """The launches of ``gdn_decode_step`` for HV value heads of V rows x K key columns and
    HK key heads, ring capacity ``capacity`` (0: conventional), ``batch`` rows on
    ``target``, with its knobs (same names and defaults); every knob is checked here, before
    any launch. ``ring_dtype`` (the keys') picks the flush's default products, ``ckpt_data``
    lets the flush check that TMA can address the checkpoint."""
    target = Target.of(target)
    check_prep_groups(prep_groups, HK, "key heads")
    register_cap(None if maxnreg is DEFAULT else maxnreg)
    fmaxnreg = None if flush_maxnreg is DEFAULT else flush_maxnreg
    register_cap(fmaxnreg)
    src = cfg.read or cfg.ckpt
    nvfp4 = gdn_nvfp4_decode_of(nvfp4_decode, lut)  # checked whatever the source
    decode = (nvfp4 if src.name == "nvfp4" else
              fp8_decode_of(fp8_decode, src.name, capacity, gdn_fp8_decode_default(batch)))
    flush_knobs = (flush_block_v, flush_warps, flush_per_sm, flush_stages, flush_fold,
                   flush_precision, fmaxnreg, flush_tma or None)
    ol = resolve_one_launch(one_launch, batch, flush_knobs, conventional=capacity == 0,
                            step_state=batch * HV * V * K,
                            light_flush=cfg.read is None and cfg.ckpt.name == "fp32")
    advance = advance and keeps_counters(cfg, capacity)
    ticket = ol and advance and fuse_advance  # each row's last program advances its cursor
    use_pdl, pdl_edges = resolve_pdl(pdl, target), pdl_edges_of(pdl)
    kb, kw = gdn_step_knobs(cfg, V)
    BV = block_v or small_grid_rows(cfg, kb, V, HV, batch, ol)
    tf = gdn_tile_first(capacity, reads_narrow_copy(cfg)) if tile_first is None else tile_first
    tiles = triton.cdiv(V, BV)
    base = dict(kind="gdn", config=str(cfg), batch=batch, heads=HV, dim=V, d_state=K, groups=HK,
                capacity=capacity, target=target, one_launch=ol, ticket=ticket, rows=BV,
                rows2=0, tiles=tiles, tile_first=bool(tf), grid=step_grid(batch, HV, tiles, tf),
                warps=num_warps or kw, maxnreg=None if maxnreg is DEFAULT else maxnreg,
                lut=bool(lut))
    if capacity == 0:
        return StepPlan(**base, separate_advance=advance and not ticket, fused_prep=False,
                        prep_groups=None, prep_grid=None, step_pdl=False, flush=None)
    # row passes of a one-launch flush: a knob only on GDN (no default measured yet)
    fr, fr_fold = check_step_flush(step_flush_rows, step_flush_fold, ol, BV, 0, ring_dtype)
    if fr_fold == "dot" and cfg.recompute_u:
        raise ValueError("step_flush_fold='dot' folds the ring's u records; a read copy's flush "
                         "recomputes them record by record (use 'records')")
    base.update(step_flush_rows=fr, step_flush_fold=fr_fold)
    fold, fblock, fwarps = gdn_flush_knobs(cfg, batch)
    records = records_fold(flush_fold or fold)
    ut = cfg.recompute_u and not records  # the flush solves the window with (I + M)^-T
    BVF = min(flush_block_v or fblock, triton.next_power_of_2(V))
    FW = flush_warps or fwarps
    fprec = fold_precision(flush_precision, ring_dtype,
                           default_fold_precision(cfg, records, BVF, ring_dtype))
    _check_ut_tile(ut, fprec, BVF, FW)
    # the UT transform needs its own launch; otherwise small batches fold it away
    fp = ol or (not ut and (fused_prep_default(batch) if fuse_prep is None else fuse_prep))
    if decode == "mma" and capacity and fp:
        raise ValueError("nvfp4_decode='mma' reads the fp16 pieces of k and q that the "
                         "ring-products launch writes: it needs a step with that launch "
                         "(fuse_prep=False and one_launch=False, the defaults from batch 5)")
    if maxnreg is DEFAULT:
        base["maxnreg"] = gdn_nonflush_maxnreg_default(decode, BV, base["warps"], kb, kw, fp)
    pk = None if fp else (1 if ut else prep_groups or gdn_prep_groups_default(cfg, batch, HK))
    flush = None
    if not ol:
        tma = resolve_flush_tma(flush_tma, cfg, V, BVF, ol, target, ckpt_data)
        if flush_maxnreg is DEFAULT:
            fmaxnreg = gdn_flush_maxnreg_default(cfg, records, BVF, FW, batch)
        flush = FlushPlan(
            fold="records" if records else "dot", rows=BVF, warps=FW, precision=fprec,
            stages=flush_stages or gdn_flush_stages(fprec, records, cfg, tma), tma=tma,
            tiles=batch * HV * triton.cdiv(V, BVF), per_sm=flush_per_sm, maxnreg=fmaxnreg,
            pdl=use_pdl and "flush" in pdl_edges, advances_cursor=advance and fuse_advance,
            recompute_u=cfg.recompute_u, ut=ut)
    return StepPlan(**base, separate_advance=advance and not (ticket if ol else fuse_advance),
                    fused_prep=fp, prep_groups=pk,
                    prep_grid=None if fp else (batch, HK // pk, HV // HK if ut else 1),
                    prep_pdl=use_pdl and "prep" in pdl_edges and not fp,
                    step_pdl=use_pdl and not fp and "prep" in pdl_edges, flush=flush,
                    decode=decode, early_loads=bool(early_loads))


# ------------------------------------------------------------------------------ speculative
# Log-decay the verify raises a smaller g (a draft's or a committed record's) to: exp(-120) is
# 0 in float32, so every decay across such a record stays exactly 0, and differences of the
# prefix sums stay finite (a -inf would give -inf - -inf = NaN).
VERIFY_G_FLOOR = tl.constexpr(-120.0)


@triton.jit
def _draft_columns(T: tl.constexpr, TB2: tl.constexpr):
    """The verify's stacked columns: c < T is draft c's key, T <= c < 2T draft c - T's query.
    Returns (index, is key, is query, draft of the column)."""
    col = tl.arange(0, TB2)
    isk = col < T
    isq = (col >= T) & (col < 2 * T)
    return col, isk, isq, tl.where(isk, col, col - T)


@triton.jit
def _gdn_verify_prep_kernel(
    q_ptr, k_ptr, slots_ptr, kr_ptr, s_kr, cur_ptr, kd_ptr,
    T: tl.constexpr, TB2: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, CAP: tl.constexpr,
    LB: tl.constexpr, KC: tl.constexpr, PREC: tl.constexpr = "ieee", PDL: tl.constexpr = False,
):
    """Per (row, key head): the stacked drafts' keys and queries (``_draft_columns``) dotted
    with the committed keys (TB2 x LB) and with the drafts' keys (TB2 x TB2), over key
    chunks of KC. Every value head of the key head reads them, so the verify programs keep
    only the state product. PDL as in the Mamba-2 verify's products launch."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    release_dependents(PDL)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        col, isk, isq, d = _draft_columns(T, TB2)
        kc = tl.arange(0, KC)
        j = tl.arange(0, LB)
        c = tl.load(cur_ptr + slot)
        row = ((b * T + d) * HK + hk) * K
        rr = tl.zeros((TB2, LB), dtype=tl.float32)
        dd = tl.zeros((TB2, TB2), dtype=tl.float32)
        for k0 in tl.range(0, K, KC):
            KQ = tl.load(k_ptr + row[:, None] + k0 + kc[None, :], mask=isk[:, None], other=0.0)
            KQ += tl.load(q_ptr + row[:, None] + k0 + kc[None, :], mask=isq[:, None], other=0.0)
            KQ = KQ.to(tl.float32)
            KdT = tl.load(k_ptr + row[None, :] + k0 + kc[:, None], mask=isk[None, :],
                          other=0.0).to(tl.float32)
            KrT = tl.load(kr_ptr + slot * s_kr + (hk * CAP + j[None, :]) * K + k0 + kc[:, None],
                          mask=(j < c)[None, :], other=0.0).to(tl.float32)
            if PREC == "bf16x3":  # bf16 activations: one exact product each
                rr = split_dot(KQ, KrT, rr, 1)
                dd = split_dot(KQ, KdT, dd, 1)
            else:
                rr += tl.dot(KQ, KrT, input_precision=PREC)
                dd += tl.dot(KQ, KdT, input_precision=PREC)
        out = kd_ptr + (b * HK + hk) * (TB2 * LB + TB2 * TB2)
        tl.store(out + col[:, None] * LB + j[None, :], rr)
        tl.store(out + TB2 * LB + col[:, None] * TB2 + col[None, :], dd)


@triton.jit
def _gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, slots_ptr, o_ptr,
    src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
    kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br, cur_ptr, kd_ptr,
    T: tl.constexpr, TB2: tl.constexpr,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
    CAP: tl.constexpr, LB: tl.constexpr,
    SRC_FMT: tl.constexpr, RECOMPUTE: tl.constexpr, BV: tl.constexpr, KC: tl.constexpr,
    LOG_TB2: tl.constexpr, PREC: tl.constexpr, SMALL: tl.constexpr, TERMS: tl.constexpr,
    TILE_FIRST: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """All T drafts in chunk form on stacked columns (``_draft_columns``): Z (BV, TB2) =
    e^{g cum} S [k_i | q_i] + committed records, accumulated over fp32 ``tl.dot``s whose
    inner dimension is KC state columns or 16 records, so no wide operand lives in
    registers. Key columns give w_i, from which the draft u's follow as one product with the
    UT transform ``(I + M)^-T``; query columns plus the drafts' u's give the outputs. Appends
    the drafts after the committed records (the cursor does not move). PREC is the state
    product's ``dot_precision`` (``"bf16x3"``: ``split_dot`` with TERMS pieces, the row scale
    applied after), SMALL the others'. PDL as in the Mamba-2 verify."""
    b, h, vt = row_head_tile(TILE_FIRST)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        RATIO: tl.constexpr = HV // HK
        hk = h // RATIO
        vv = vt * BV + tl.arange(0, BV)
        mv = vv < V
        kc = tl.arange(0, KC)
        r16 = tl.arange(0, 16)
        col, isk, isq, d = _draft_columns(T, TB2)
        c = tl.load(cur_ptr + slot)
        gk = tl.load(g_ptr + (b * T + col) * HV + h, mask=isk, other=0.0).to(tl.float32)
        # a zero decay (g = -inf) as VERIFY_G_FLOOR, whose exp is 0 in float32 as well, here and
        # for the committed records: the decays below are differences of prefix sums, where
        # -inf - -inf would be NaN (NaN g stays NaN; the ring keeps the raw g). Every g above
        # the floor gives the same bits as without it
        gkc = tl.where(gk < VERIFY_G_FLOOR, VERIFY_G_FLOOR, gk)
        bd = tl.load(beta_ptr + (b * T + col) * HV + h, mask=isk, other=0.0).to(tl.float32)
        # cd[c]: g summed over drafts 0..d(c); one order for every column
        cd = tl.sum(tl.where((col[None, :] <= d[:, None]) & isk[None, :], gkc[None, :], 0.0), 1)
        gr = tl.load(gr_ptr + slot * s_gr + h * CAP + tl.arange(0, LB),
                     mask=tl.arange(0, LB) < c, other=0.0)
        # (TB2,) g since the checkpoint up to the column's draft
        total = tl.sum(tl.where(gr < VERIFY_G_FLOOR, VERIFY_G_FLOOR, gr), 0) + cd
        row = ((b * T + d) * HK + hk) * K
        Z = tl.zeros((BV, TB2), dtype=tl.float32)
        SPLIT: tl.constexpr = PREC == "bf16x3"
        for k0 in tl.range(0, K, KC):
            S = load_cols(src_ptr + slot * s_src, src_rs_ptr + slot * s_srcrs,
                          src_bs_ptr + slot * s_srcbs, h * V + vv, k0, mv, SRC_FMT, BV, K, KC,
                          True, not SPLIT)
            KQT = tl.load(k_ptr + row[None, :] + k0 + kc[:, None], mask=isk[None, :], other=0.0)
            KQT += tl.load(q_ptr + row[None, :] + k0 + kc[:, None], mask=isq[None, :], other=0.0)
            if SPLIT:
                Z = split_dot(S, KQT.to(tl.float32), Z, TERMS)
            else:
                Z += tl.dot(S, KQT.to(tl.float32), input_precision=PREC)
        if SPLIT:
            Z = row_scales(src_rs_ptr + slot * s_srcrs, h * V + vv, mv, SRC_FMT, BV)[:, None] * Z
        Z = tl.exp(total)[None, :] * Z
        wait_prior_grid(PDL)
        kd = kd_ptr + (b * HK + hk) * (TB2 * LB + TB2 * TB2)
        done = 0.0
        for j0 in tl.range(0, c, 16):  # committed records, 16 at a time
            j = j0 + r16
            mj = j < c
            gj = tl.load(gr_ptr + slot * s_gr + h * CAP + j, mask=mj, other=0.0)
            gj = tl.where(gj < VERIFY_G_FLOOR, VERIFY_G_FLOOR, gj)
            cr = done + tl.cumsum(gj, 0)
            done += tl.sum(gj, 0)
            E = tl.where(mj[:, None], tl.exp(total[None, :] - cr[:, None]), 0.0)
            RT = tl.load(kd + col[None, :] * LB + j[:, None], mask=mj[:, None], other=0.0)
            U = tl.load(ur_ptr + slot * s_ur + (h * CAP + j[None, :]) * V + vv[:, None],
                        mask=mj[None, :] & mv[:, None], other=0.0)
            Z += tl.dot(U, E * RT, input_precision=SMALL)
        # drafts: (I + M) u = beta (v - w) on key columns, then the query columns' outputs
        DD = tl.load(kd + TB2 * LB + col[:, None] * TB2 + col[None, :])
        earlier = (col[None, :] <= d[:, None]) & isk[None, :]
        ED = tl.where(earlier, tl.exp(cd[:, None] - cd[None, :]), 0.0) * DD
        M = tl.where(isk[:, None] & (col[None, :] < col[:, None]), bd[:, None] * ED, 0.0)
        TI = tl.trans(unit_lower_inverse(M, TB2, LOG_TB2, SMALL))
        mk = isk[None, :] & mv[:, None]
        Vd = tl.load(v_ptr + ((b * T + col[None, :]) * HV + h) * V + vv[:, None], mask=mk,
                     other=0.0).to(tl.float32)
        X = tl.where(isk[None, :], bd[None, :] * (Vd - Z), 0.0)
        Ud = tl.dot(X, TI, input_precision=SMALL)
        N2 = tl.where(isq[:, None], ED, 0.0)
        O = Z + tl.dot(Ud, tl.trans(N2), input_precision=SMALL)
        tl.store(o_ptr + ((b * T + d[None, :]) * HV + h) * V + vv[:, None], O,
                 mask=isq[None, :] & mv[:, None])
        pos = c + col
        tl.store(ur_ptr + slot * s_ur + (h * CAP + pos[None, :]) * V + vv[:, None], Ud, mask=mk)
        if RECOMPUTE:
            tl.store(vr_ptr + slot * s_vr + (h * CAP + pos[None, :]) * V + vv[:, None],
                     Vd.to(vr_ptr.dtype.element_ty), mask=mk)
        if vt == 0:
            tl.store(gr_ptr + slot * s_gr + h * CAP + pos, gk, mask=isk)
            if RECOMPUTE:
                tl.store(br_ptr + slot * s_br + h * CAP + pos, bd, mask=isk)
            if h % RATIO == 0:
                kk = tl.arange(0, K)
                Kd = tl.load(k_ptr + row[:, None] + kk[None, :], mask=isk[:, None])
                tl.store(kr_ptr + slot * s_kr + (hk * CAP + pos[:, None]) * K + kk[None, :],
                         Kd.to(kr_ptr.dtype.element_ty), mask=isk[:, None])
    wait_prior_grid(PDL)


@triton.jit(do_not_specialize=["seed", "layer"])
def _gdn_fold_kernel(
    slots_ptr, acc_ptr,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
    kr_ptr, ur_ptr, gr_ptr, vr_ptr, br_ptr, s_kr, s_ur, s_gr, s_vr, s_br,
    cur_ptr, fi_ptr, nan_ptr, seed, layer,
    HV: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr, RECOMPUTE: tl.constexpr,
    BV: tl.constexpr,
):
    """Commit, part 1: rows reaching L records fold the first L into the checkpoint (u's
    recomputed from the checkpoint when non-flush steps read a copy)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    vt = tl.program_id(2)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        c = tl.load(cur_ptr + slot) + tl.load(acc_ptr + b)
        if c >= L:
            hk = h // (HV // HK)
            vv = vt * BV + tl.arange(0, BV)
            mv = vv < V
            kk = tl.arange(0, K)
            j = tl.arange(0, LB)
            mj = j < L
            gr = tl.load(gr_ptr + slot * s_gr + h * CAP + j, mask=mj, other=0.0)
            Kr = tl.load(kr_ptr + slot * s_kr + (hk * CAP + j[:, None]) * K + kk[None, :],
                         mask=mj[:, None], other=0.0).to(tl.float32)
            rows = h * V + vv
            S = load_rows(ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                          ck_bs_ptr + slot * s_ckbs, rows, kk, mv, CK_FMT, BV, K)
            if RECOMPUTE:
                Vr = tl.load(vr_ptr + slot * s_vr + (h * CAP + j[None, :]) * V + vv[:, None],
                             mask=mj[None, :] & mv[:, None], other=0.0).to(tl.float32)
                br = tl.load(br_ptr + slot * s_br + h * CAP + j, mask=mj, other=0.0)
                gn = tl.load(gr_ptr + slot * s_gr + h * CAP + j + 1, mask=j + 1 < L, other=0.0)
                U = _recompute_u(S, Kr, Vr, br, gr, gn, j, LB, BV, L)
            else:
                U = tl.load(ur_ptr + slot * s_ur + (h * CAP + j[None, :]) * V + vv[:, None],
                            mask=mj[None, :] & mv[:, None], other=0.0)
            _, after, total, _ = log_decay_suffixes(gr_ptr + slot * s_gr + h * CAP, L, 0.0, LB)
            dec = tl.where(mj, tl.exp(after), 0.0)
            S = tl.exp(total) * S + tl.dot(U * dec[None, :], Kr, input_precision="ieee")
            fi = tl.load(fi_ptr + slot) + 1
            nans = write_state(S, slot, fi, seed, layer, rows, kk, mv,
                                ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                                ck_bs_ptr + slot * s_ckbs,
                                rd_ptr + slot * s_rd, rd_rs_ptr + slot * s_rdrs,
                                rd_bs_ptr + slot * s_rdbs,
                                CK_FMT, RD_FMT, SR, BV, K)
            if nans > 0:
                tl.atomic_add(nan_ptr, nans)


def _ring_args(cache: ReplayCache):
    r = cache.ring
    vr = r["v"] if "v" in r else r["u"]
    br = r["beta"] if "beta" in r else r["g"]
    return (r["k"], r["u"], r["g"], vr, br, slot_stride(r["k"]), slot_stride(r["u"]),
            slot_stride(r["g"]), slot_stride(vr), slot_stride(br))


def gdn_verify(cache: ReplayCache, q, k, v, g, beta, slots, *, block_v: int = 128,
               num_warps: int = 2, chunk: int = 32, dot_precision: str = "auto",
               tile_first: bool = False, pdl: bool = False,
               maxnreg: int | None | object = DEFAULT) -> torch.Tensor:
    """Speculative verify: q, k (B, T, Hk, K), v (B, T, Hv, V), g, beta (B, T, Hv) ->
    o (B, T, Hv, V); appends the drafts after each row's committed records.
    ``block_v`` value rows (>= 16) per program, ``chunk`` key columns per product,
    ``dot_precision`` as in ``mamba2.verify_precision``, ``tile_first`` the grid order
    (``common.row_head_tile``); the defaults measured fastest on the H200 at batch 256
    (reports/kernels/verify_r22_sweep.log; tile-first gained nothing for GDN,
    verify_r29_grid_order.log). ``pdl`` as in ``mamba2_verify`` (off by default); ``maxnreg``
    caps the verify programs' registers (default ``mamba2.verify_maxnreg_default``; None: no
    cap)."""
    if runs_reference(q):
        return reference_call(cache, lambda st: ref.verify(st, q, k, v, g, beta, slots))
    Bsz, T, HK, K = q.shape
    HV, V = v.shape[-2:]
    if cache.kind != "gdn":
        raise ValueError(f"expected a gdn cache, got {cache.kind}")
    if T > cache.capacity - cache.cfg.L + 1:
        raise ValueError(f"verify of {T} drafts needs spec_tokens >= {T - 1} beyond L; "
                         f"the cache has capacity {cache.capacity} for L={cache.cfg.L}")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if slots.dtype != torch.int32:
        raise ValueError("slots must be int32")
    if block_v < 16:
        raise ValueError(f"block_v must be >= 16, got {block_v}")
    src = cache.read if cache.read is not None else cache.ckpt
    act = {q.dtype, k.dtype, cache.ring["k"].dtype}
    KC = verify_chunk(K, chunk)
    prec = verify_precision(dot_precision, act.pop() if len(act) == 1 else torch.float32)
    cap = register_cap(verify_maxnreg_default(Bsz) if maxnreg is DEFAULT else maxnreg)
    o = torch.empty(Bsz, T, HV, V, device=q.device, dtype=torch.float32)
    BV = min(block_v, max(16, triton.next_power_of_2(V)))
    TB2, LB = max(16, triton.next_power_of_2(2 * T)), max(16, triton.next_power_of_2(cache.capacity))
    kd = torch.empty(Bsz, HK, TB2 * LB + TB2 * TB2, device=q.device, dtype=torch.float32)
    kr = cache.ring["k"]
    use_pdl = bool(pdl) and resolve_pdl(pdl, q.device)
    _gdn_verify_prep_kernel[(Bsz, HK)](q, k, slots, kr, slot_stride(kr), cache.cursor, kd,
                                       T=T, TB2=TB2, HK=HK, K=K, CAP=cache.capacity, LB=LB, KC=KC,
                                       PREC=prec, PDL=use_pdl, num_warps=1)
    _gdn_verify_kernel[step_grid(Bsz, HV, triton.cdiv(V, BV), tile_first)](
        q, k, v, g, beta, slots, o, *state_args(src, slots), *_ring_args(cache), cache.cursor,
        kd, T=T, TB2=TB2, HV=HV, HK=HK, V=V, K=K, CAP=cache.capacity, LB=LB,
        SRC_FMT=fmt_code(src), RECOMPUTE=cache.cfg.recompute_u, BV=BV, KC=KC,
        LOG_TB2=TB2.bit_length() - 1, PREC=prec, SMALL="tf32x3" if prec == "bf16x3" else prec,
        TERMS=split_terms(fmt_code(src)), TILE_FIRST=tile_first, PDL=use_pdl, launch_pdl=use_pdl,
        num_warps=num_warps, **cap)
    return o


def gdn_commit(cache: ReplayCache, accepted: torch.Tensor, slots: torch.Tensor, *,
               block_v: int = 16, num_warps: int = 4) -> None:
    """Accept ``accepted (B,)`` int32 drafts per row; fold full windows like a flush."""
    if accepted.dtype != torch.int32:
        raise ValueError("accepted must be int32")
    if runs_reference(accepted):
        reference_call(cache, lambda st: ref.commit(st, accepted, slots))
        return
    HV, V, K = cache.ckpt.data.shape[1], cache.ckpt.data.shape[2], cache.ring["k"].shape[-1]
    HK = cache.ring["k"].shape[1]
    cfg = cache.cfg
    BV = min(block_v, triton.next_power_of_2(V))
    _gdn_fold_kernel[(slots.shape[0], HV, triton.cdiv(V, BV))](
        slots, accepted, *state_args(cache.ckpt, slots), *state_args(cache.read, slots),
        *_ring_args(cache), cache.cursor, cache.flush_index, cache.nan_count, cache.seed,
        cache.layer, HV=HV, HK=HK, V=V, K=K, L=cfg.L, CAP=cache.capacity,
        LB=max(16, triton.next_power_of_2(cache.capacity)), CK_FMT=fmt_code(cache.ckpt),
        RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr, RECOMPUTE=cfg.recompute_u, BV=BV,
        num_warps=num_warps)
    shift_and_commit(cache, accepted, slots)
