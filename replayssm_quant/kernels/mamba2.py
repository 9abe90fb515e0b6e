"""Triton decode kernels for Mamba-2 layers: conventional step, ReplaySSM step (non-flush or
flush per row, decided on the device from the cursor), speculative verify and commit.

A program handles one (batch row, head, tile of head-dim rows) and holds those state rows
(rows x d_state) in registers, so no kernel needs a reduction across programs and nothing
depends on the launch configuration. A ReplaySSM step is three launches: per (row, group) the
ring products ``B_j . C`` every head of the group reads, plus the list of rows that flush this
step (built on the device); the non-flush kernel, which flushing rows leave at once, so it stays
lean; and a persistent flush grid that walks the flushing rows' tiles. Launch shapes depend
only on tensor shapes: CUDA-graph safe. At small batch a step is one launch instead
(``one_launch_default``, up to batch 8): flushing rows flush on the step's own tiles, in
passes of a few rows once a program holds more (``step_flush_default``), and each row's last
program advances its cursor (``finish_row``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ssm import mamba2 as ref
from .core.cache import ReplayCache, reference_call, runs_reference, slot_stride
from .core.codes import lut_table, pow2_prescale_of
from .core.memory import (
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
from .core.sums import log_decay_suffixes, ring_records
from .core.target import Target
from .knobs import (
    DEFAULT,
    check_prep_groups,
    check_step_flush,
    fold_precision,
    fp8_decode_of,
    nvfp4_decode_of,
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
def _mamba2_conv_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, slots_ptr, y_ptr,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    fi_ptr, nan_ptr, seed, layer, ticket_ptr, cur_ptr, nrows,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
    CK_FMT: tl.constexpr, SR: tl.constexpr, HAS_D: tl.constexpr, BP: tl.constexpr,
    TILE_FIRST: tl.constexpr = False, ADVANCE: tl.constexpr = False,
):
    """Conventional step per (row, head, BP head-dim rows). With ADVANCE the row's last
    program also advances its counters (``finish_row``): the step is one launch."""
    b, h, pt = row_head_tile(TILE_FIRST)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        g = h // (H // G)
        p = pt * BP + tl.arange(0, BP)
        mp = p < P
        n = tl.arange(0, N)
        x = tl.load(x_ptr + (b * H + h) * P + p, mask=mp, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
        A = tl.load(A_ptr + h).to(tl.float32)
        Bv = tl.load(B_ptr + (b * G + g) * N + n).to(tl.float32)
        Cv = tl.load(C_ptr + (b * G + g) * N + n).to(tl.float32)
        rows = h * P + p
        S = load_rows(ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs, ck_bs_ptr + slot * s_ckbs,
                      rows, n, mp, CK_FMT, BP, N)
        a = tl.exp(dt * A)
        S = a * S + (dt * x)[:, None] * Bv[None, :]
        y = tl.sum(S * Cv[None, :], axis=1)
        if HAS_D:
            y += tl.load(D_ptr + h).to(tl.float32) * x
        tl.store(y_ptr + (b * H + h) * P + p, y, mask=mp)
        fi = tl.load(fi_ptr + slot) + 1
        elem = rows[:, None] * N + n[None, :]
        r = sr_words_for(seed, layer, slot, fi, elem, CK_FMT) if SR else elem.to(tl.uint32)
        _, nans = store_rows(S, r, ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                             ck_bs_ptr + slot * s_ckbs, rows, n, mp, CK_FMT, SR, BP, N, False,
                             y)
        if nans > 0:
            tl.atomic_add(nan_ptr, nans)
        if ADVANCE:
            finish_row(ticket_ptr, slot, cur_ptr, fi_ptr, 0, fi, 1, TILE_FIRST)


@triton.jit
def _ring_weights(dtr_ptr, slot, s_dtr, h, c, dt, A, CAP: tl.constexpr, LB: tl.constexpr,
                  ECAP: tl.constexpr = 0):
    """Per buffered record j < c: exp(A * sum of dt after j up to now) * dt_j, and the total
    dt since the checkpoint (including this token). ECAP as ``log_decay_suffixes``'s CAP."""
    dtr, after, total, mj = log_decay_suffixes(dtr_ptr + slot * s_dtr + h * CAP, c, dt, LB,
                                               ECAP)
    w = tl.where(mj, tl.exp(A * after) * dtr, 0.0)
    return w, total, mj


@triton.jit(do_not_specialize=["nrows"])
def _mamba2_prep_kernel(
    B_ptr, C_ptr, slots_ptr, Br_ptr, s_Br, cur_ptr, fi_ptr, bc_ptr, list_ptr, nrows,
    mm_ptr, ms_ptr,
    G: tl.constexpr, N: tl.constexpr, L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    RB: tl.constexpr, PDL: tl.constexpr = False, PG: tl.constexpr = 1, MMA: tl.constexpr = False,
):
    """Per (row, PG groups), once per step: ``B_j . C`` for the buffered records, ``B . C`` for
    the current token and C's NVFP4-decode prescales (``pow2_prescale``): every head of a
    group reads these ``LB + 3`` floats (``bc_stride``) instead of the LB x N records and a
    reduction over C; program (0, 0) also builds the flush list. A program's PG groups are
    loaded at once (``prep_groups_default``). With PDL the non-flush launch may start at once
    (``release_dependents``): it writes nothing this launch reads (its ring record goes to
    position c, these products read the records before c). With MMA it also stores C's fp16
    pieces (``mma_vector_pieces``) for the non-flush step's NVFP4 tensor-core product
    (``nvfp4_decode="mma"``): (N, MMA_COLS) at ``mm_ptr`` and a factor at ``ms_ptr`` per
    (row, group)."""
    b = tl.program_id(0)
    g = tl.program_id(1) * PG + tl.arange(0, PG)
    release_dependents(PDL)
    if (b == 0) & (tl.program_id(1) == 0):
        flush_list(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L, RB)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        n = tl.arange(0, N)
        j = tl.arange(0, LB)
        c = tl.load(cur_ptr + slot)
        Cv = tl.load(C_ptr + (b * G + g)[:, None] * N + n[None, :]).to(tl.float32)
        Bv = tl.load(B_ptr + (b * G + g)[:, None] * N + n[None, :]).to(tl.float32)
        Br = tl.load(Br_ptr + slot * s_Br
                     + (g[:, None, None] * CAP + j[None, :, None]) * N + n[None, None, :],
                     mask=(j < c)[None, :, None], other=0.0).to(tl.float32)
        out = bc_ptr + (b * G + g) * (LB + 3)
        tl.store(out[:, None] + j[None, :], tl.sum(Br * Cv[:, None, :], axis=2))
        tl.store(out + LB, tl.sum(Bv * Cv, axis=1))
        sc, cc = pow2_prescale_of(Cv)
        tl.store(out + LB + 1, sc)
        tl.store(out + LB + 2, cc)
        if MMA:
            for i in tl.static_range(PG):
                row = b * G + tl.program_id(1) * PG + i
                mma_vector_pieces(C_ptr + row * N, mm_ptr + row * (N * 16), ms_ptr + row, 0, N,
                                  True)


@triton.jit
def _nonflush_y(p, mp, b, h, g, slot, dt, decay, w, mj, bc, bcc, j,
                x_ptr, D_ptr, C_ptr, src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs,
                s_srcbs, xr_ptr, s_xr, lut_ptr, bc_row,
                H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
                CAP: tl.constexpr, LB: tl.constexpr, SRC_FMT: tl.constexpr,
                HAS_D: tl.constexpr, BP: tl.constexpr, LUT: tl.constexpr,
                PRESCALED: tl.constexpr, E4M3: tl.constexpr, LOAD_BC: tl.constexpr,
                PDL: tl.constexpr, ECAP: tl.constexpr, WORDS8: tl.constexpr = False,
                mm_ptr=None, ms_ptr=None, MMA: tl.constexpr = False):
    """The non-flush output y of head-dim rows ``p`` (BP of them, ``mp`` valid) from the read
    source and the ring, and this token's x (the record to append). With LOAD_BC the ring
    products ``bc``, ``bcc`` (and with PRESCALED the NVFP4 prescales) come from the
    ring-products launch's row ``bc_row``; with PDL that launch may still be running, so the
    state product is formed first and the products are read after ``wait_prior_grid``.
    ECAP as ``ring_records``'s CAP, WORDS8 as ``rows_dot``'s. With MMA (an NVFP4 source, the
    ring-products launch writing C's pieces) the state product is one tensor-core product of
    the decoded rows (``nvfp4_mma_dot``), formed once the codes are decoded and that launch
    is done."""
    if MMA:
        tl.static_assert(SRC_FMT == 4 and LOAD_BC,
                         "the tensor-core product reads an NVFP4 source and the pieces the "
                         "ring-products launch writes")
        sc, _ = nvfp4_mma_rows_dot(src_ptr + slot * s_src, src_rs_ptr + slot * s_srcrs,
                                   src_bs_ptr + slot * s_srcbs, h * P + p, mp,
                                   mm_ptr + (b * G + g) * (N * 16), ms_ptr + b * G + g, BP, N,
                                   False, PDL)
    else:
        sc, _ = rows_dot(src_ptr + slot * s_src, src_rs_ptr + slot * s_srcrs,
                         src_bs_ptr + slot * s_srcbs, h * P + p, mp,
                         C_ptr + (b * G + g) * N, C_ptr, lut_ptr, SRC_FMT, BP, N, False, LUT,
                         bc_row + LB + 1, PRESCALED, E4M3, WORDS8)
    x = tl.load(x_ptr + (b * H + h) * P + p, mask=mp, other=0.0).to(tl.float32)
    xr = ring_records(xr_ptr + slot * s_xr + (h * CAP + j[:, None]) * P + p[None, :],
                      mj[:, None] & mp[None, :], (j < CAP)[:, None] & mp[None, :],
                      ECAP).to(tl.float32)
    if LOAD_BC:
        wait_prior_grid(PDL)
        bc = tl.load(bc_row + j, mask=mj, other=0.0)
        bcc = tl.load(bc_row + LB)
    y = decay * sc + tl.sum((w * bc)[:, None] * xr, axis=0)
    y += (dt * x) * bcc
    if HAS_D:
        y += tl.load(D_ptr + h).to(tl.float32) * x
    return y, x


@triton.jit
def _nonflush_outputs(b, h, g, pt, slot, c, x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, C_ptr,
                      src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
                      xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, bc_ptr, lut_ptr,
                      H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
                      CAP: tl.constexpr, LB: tl.constexpr, SRC_FMT: tl.constexpr,
                      HAS_D: tl.constexpr, BP: tl.constexpr, BP2: tl.constexpr,
                      LUT: tl.constexpr, FUSED_PREP: tl.constexpr, E4M3: tl.constexpr,
                      PDL: tl.constexpr, ECAP: tl.constexpr, WORDS8: tl.constexpr = False,
                      mm_ptr=None, ms_ptr=None, MMA: tl.constexpr = False):
    """A non-flush program's outputs and records, ``(y, x)`` of rows ``[pt BP, pt BP + BP)``
    and, with BP2 > 0, of the whole head's second pass ``[BP, BP + BP2)`` (else the first
    pass again): ring weights, the group's ring products (formed here with FUSED_PREP, else
    read from the ring-products launch) and ``_nonflush_y``."""
    j = tl.arange(0, LB)
    dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
    A = tl.load(A_ptr + h).to(tl.float32)
    w, total, mj = _ring_weights(dtr_ptr, slot, s_dtr, h, c, dt, A, CAP, LB, ECAP)
    if FUSED_PREP:
        n = tl.arange(0, N)
        Cv = tl.load(C_ptr + (b * G + g) * N + n).to(tl.float32)
        Brj = ring_records(Br_ptr + slot * s_Br + (g * CAP + j[:, None]) * N + n[None, :],
                           mj[:, None], (j < CAP)[:, None], ECAP).to(tl.float32)
        bc = tl.sum(Brj * Cv[None, :], axis=1)
        bcc = tl.sum(tl.load(B_ptr + (b * G + g) * N + n).to(tl.float32) * Cv, axis=0)
    else:  # read from the ring-products launch's row in ``_nonflush_y``
        bc = tl.zeros((LB,), dtype=tl.float32)
        bcc = 0.0
    decay = tl.exp(A * total)
    # an NVFP4 source's program drops its row mask where its tiles divide P: 96 -> 72
    # registers on Nemotron-3-Super (Triton 3.6, sm_90), non-flush step 1.7-2.6% faster at
    # batch 256 / 512; an fp8 source's took 104 instead of 95 and ran 6.6-7.7% slower
    # (reports/kernels/tune_r235_mamba2_whole_tiles.log). Nemotron-3-Nano-4B's whole-head
    # passes (64 + 16 rows) keep it: without it 88 registers instead of 96, and 0.9-3.0%
    # slower at batch 231-512 (tune_r237_mamba2_whole_pass.log, tune_r239_*)
    p, mp = tile_rows(pt, P, BP, (P % BP == 0) and (SRC_FMT == 4))
    bc_row = bc_ptr + (b * G + g) * (LB + 3)  # read only without FUSED_PREP
    # with PDL the prescales are formed here, so the state product need not wait
    PRESCALED: tl.constexpr = not FUSED_PREP and not PDL
    y, x = _nonflush_y(p, mp, b, h, g, slot, dt, decay, w, mj, bc, bcc, j,
                       x_ptr, D_ptr, C_ptr, src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs,
                       s_srcbs, xr_ptr, s_xr, lut_ptr, bc_row, H, P, N, G, CAP, LB, SRC_FMT,
                       HAS_D, BP, LUT, PRESCALED, E4M3, not FUSED_PREP, PDL, ECAP, WORDS8,
                       mm_ptr, ms_ptr, MMA)
    if BP2 > 0:
        p2 = BP + tl.arange(0, BP2)
        y2, x2 = _nonflush_y(p2, p2 < P, b, h, g, slot, dt, decay, w, mj, bc, bcc, j,
                             x_ptr, D_ptr, C_ptr, src_ptr, src_rs_ptr, src_bs_ptr, s_src,
                             s_srcrs, s_srcbs, xr_ptr, s_xr, lut_ptr, bc_row, H, P, N, G, CAP,
                             LB, SRC_FMT, HAS_D, BP2, LUT, PRESCALED, E4M3, not FUSED_PREP,
                             PDL, ECAP, WORDS8, mm_ptr, ms_ptr, MMA)
    else:
        y2, x2 = y, x
    return y, x, y2, x2


@triton.jit
def _nonflush_store(y, x, p, b, h, slot, c, y_ptr, xr_ptr, s_xr, H: tl.constexpr,
                    P: tl.constexpr, CAP: tl.constexpr, WHOLE: tl.constexpr = False):
    """Store a non-flush pass's outputs and append its x to the ring at the cursor (every
    row of the pass with WHOLE, else those below P)."""
    mp = tl.full(p.shape, 1, tl.int1) if WHOLE else p < P
    tl.store(y_ptr + (b * H + h) * P + p, y, mask=mp)
    tl.store(xr_ptr + slot * s_xr + (h * CAP + c) * P + p, x.to(xr_ptr.dtype.element_ty), mask=mp)


@triton.jit(do_not_specialize=["seed", "layer", "nrows"])
def _mamba2_nonflush_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, C_ptr, slots_ptr, y_ptr,
    src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, cur_ptr, bc_ptr, lut_ptr,
    fi_ptr, list_ptr, nrows,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs, nan_ptr, seed, layer, ticket_ptr,
    mm_ptr, ms_ptr,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    SRC_FMT: tl.constexpr, HAS_D: tl.constexpr, BP: tl.constexpr, LUT: tl.constexpr,
    TILE_FIRST: tl.constexpr = False, FUSED_PREP: tl.constexpr = False, BP2: tl.constexpr = 0,
    ONE_LAUNCH: tl.constexpr = False, ADVANCE: tl.constexpr = False, CK_FMT: tl.constexpr = 0,
    RD_FMT: tl.constexpr = 0, SR: tl.constexpr = False, E4M3: tl.constexpr = False,
    PDL: tl.constexpr = False, FLUSH_PDL: tl.constexpr = False, EARLY: tl.constexpr = False,
    WORDS8: tl.constexpr = False, FR: tl.constexpr = 0, FR_DOT: tl.constexpr = False,
    MMA: tl.constexpr = False,
):
    """Non-flush step per (row, head, BP head-dim rows): y from the read source (never a
    dequantized tile for NVFP4) + the ring, then append the record. Flushing rows exit at once:
    the flush kernel serves them. With PDL the launch may start while the ring-products launch
    still runs (programmatic dependent launch): every program waits for it (``wait_prior_grid``)
    only before it reads the products, after its state product, and before it ends, so the flush
    launch, which waits for this one, sees the products too. With FLUSH_PDL each program of a
    non-flushing row lets the flush launch start once its cursor is known
    (``release_dependents``); a flushing row's programs end without it (an ended program counts
    as released), since a release in each of a flush step's tens of thousands of exiting
    programs held the flush back ~20 us (``resolve_pdl``). With EARLY every load of the
    non-flush output (state tile, ring records, inputs) is issued before the cursor is known,
    the stale ring records selected away afterwards (``ring_records``): at batch 1 the cursor
    load is then no longer a memory round trip in front of the others. With FUSED_PREP the
    program forms its group's ``B_j . C`` itself and the first program builds the flush list, so
    the ring-products launch is skipped (small batches, where every launch costs microseconds).
    With BP2 > 0 a program covers its whole head in two passes, rows ``[0, BP)`` then ``[BP, BP
    + BP2)`` (``whole_head_rows``): a head dim that is no power of two then computes no padding
    rows and spends the per-program work once per head. With ONE_LAUNCH (implies FUSED_PREP) the
    programs of a flushing row flush their own rows instead (``_mamba2_flush_rows``, records
    folded one by one: a tile may be narrower than a tensor-core product) and, with ADVANCE,
    each row's last program to finish advances its cursor (``finish_row``): the step is this
    launch alone. FR > 0 has a one-launch program flush its rows in passes of FR rows (a loop,
    so the flush holds no more registers than one pass needs), each pass folding its records
    as one bf16x3 product with FR_DOT (FR >= 16, a bf16 ring), else one by one. WORDS8
    decodes an fp8 read source from int32 words (``rows_dot``). MMA forms an NVFP4 source's
    state product on tensor cores from the pieces at ``mm_ptr`` / ``ms_ptr`` (``_nonflush_y``)."""
    b, h, pt = row_head_tile(TILE_FIRST)
    if FUSED_PREP and not ONE_LAUNCH:
        if (b == 0) & (h == 0) & (pt == 0):
            flush_list(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L, 256)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        c = tl.load(cur_ptr + slot)
        fi = tl.load(fi_ptr + slot) + 1 if ONE_LAUNCH else 0
        HPG: tl.constexpr = H // G
        g = h // HPG
        if EARLY:  # before the cursor arrives; flushing rows discard the results
            y, x, y2, x2 = _nonflush_outputs(
                b, h, g, pt, slot, c, x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, C_ptr,
                src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
                xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, bc_ptr, lut_ptr, H, P, N, G, CAP,
                LB, SRC_FMT, HAS_D, BP, BP2, LUT, FUSED_PREP, E4M3, PDL, CAP, WORDS8,
                mm_ptr, ms_ptr, MMA)
        if c != L - 1:
            release_dependents(FLUSH_PDL)  # programs of flushing rows end without it
            if not EARLY:
                y, x, y2, x2 = _nonflush_outputs(
                    b, h, g, pt, slot, c, x_ptr, dt_ptr, A_ptr, B_ptr, D_ptr, C_ptr,
                    src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
                    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, bc_ptr, lut_ptr, H, P, N, G,
                    CAP, LB, SRC_FMT, HAS_D, BP, BP2, LUT, FUSED_PREP, E4M3, PDL, 0, WORDS8,
                    mm_ptr, ms_ptr, MMA)
            _nonflush_store(y, x, pt * BP + tl.arange(0, BP), b, h, slot, c, y_ptr, xr_ptr,
                            s_xr, H, P, CAP, (P % BP == 0) and (SRC_FMT == 4))
            if BP2 > 0:
                _nonflush_store(y2, x2, BP + tl.arange(0, BP2), b, h, slot, c, y_ptr, xr_ptr,
                                s_xr, H, P, CAP)
            if pt == 0:
                dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
                tl.store(dtr_ptr + slot * s_dtr + h * CAP + c, dt)
                if h % HPG == 0:
                    n = tl.arange(0, N)
                    Bv = tl.load(B_ptr + (b * G + g) * N + n)
                    tl.store(Br_ptr + slot * s_Br + (g * CAP + c) * N + n,
                             Bv.to(Br_ptr.dtype.element_ty))
        elif ONE_LAUNCH and FR > 0:
            nans = tl.zeros((), dtype=tl.int32)
            ROWS: tl.constexpr = BP + BP2
            for p0 in tl.range(0, ROWS, FR, num_stages=1):
                p = pt * BP + p0 + tl.arange(0, FR)
                nans += _mamba2_flush_rows(
                    b, h, p, p < P, slot, fi, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, y_ptr,
                    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, seed, layer,
                    H, P, N, G, L, CAP, LB, CK_FMT, RD_FMT, SR, HAS_D, FR, not FR_DOT,
                    "bf16x3" if FR_DOT else "ieee", ck_ptr, 0, False)
            if nans > 0:
                tl.atomic_add(nan_ptr, nans)
        elif ONE_LAUNCH:
            p = pt * BP + tl.arange(0, BP)
            nans = _mamba2_flush_rows(
                b, h, p, p < P, slot, fi, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, y_ptr,
                ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, seed, layer,
                H, P, N, G, L, CAP, LB, CK_FMT, RD_FMT, SR, HAS_D, BP, True, "ieee",
                ck_ptr, 0, False)
            if BP2 > 0:
                p2 = BP + tl.arange(0, BP2)
                nans += _mamba2_flush_rows(
                    b, h, p2, p2 < P, slot, fi, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, y_ptr,
                    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, seed, layer,
                    H, P, N, G, L, CAP, LB, CK_FMT, RD_FMT, SR, HAS_D, BP2, True, "ieee",
                    ck_ptr, 0, False)
            if nans > 0:
                tl.atomic_add(nan_ptr, nans)
        if ONE_LAUNCH and ADVANCE:
            finish_row(ticket_ptr, slot, cur_ptr, fi_ptr, c, fi, L, TILE_FIRST)
    wait_prior_grid(PDL)  # no program ends before the ring products are written


@triton.jit
def _mamba2_flush_rows(b, h, pf, mpf, slot, fi, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, y_ptr,
                       ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
                       rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
                       xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, seed, layer,
                       H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
                       L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
                       CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr,
                       HAS_D: tl.constexpr, BPF: tl.constexpr, RECORDS: tl.constexpr,
                       FOLD_PREC: tl.constexpr, ck_desc, p0, TMA: tl.constexpr):
    """The flush of head-dim rows ``pf`` (BPF of them, ``mpf`` valid) of head h of row b: fold
    the L-1 buffered records and the current token into the checkpoint, write y, the
    checkpoint (SR with flush index ``fi``) and the read copy made from its new value.
    With TMA (an fp32 checkpoint without a read copy, whole tiles ``p0 ..``) the checkpoint
    rows move through ``ck_desc``, a tensor descriptor of its (slots, H * P, N) view.
    Returns the NaNs written."""
    n = tl.arange(0, N)
    j = tl.arange(0, LB)
    g = h // (H // G)
    rowsf = h * P + pf
    if TMA:
        Sf = tl.reshape(ck_desc.load([slot, h * P + p0, 0]), (BPF, N))
    else:
        Sf = load_rows(ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                       ck_bs_ptr + slot * s_ckbs, rowsf, n, mpf, CK_FMT, BPF, N)
    dt = tl.load(dt_ptr + b * H + h).to(tl.float32)
    A = tl.load(A_ptr + h).to(tl.float32)
    xf = tl.load(x_ptr + (b * H + h) * P + pf, mask=mpf, other=0.0).to(tl.float32)
    Bv = tl.load(B_ptr + (b * G + g) * N + n).to(tl.float32)
    Cv = tl.load(C_ptr + (b * G + g) * N + n).to(tl.float32)
    if RECORDS:  # rank-1 updates, newest record first: the decay since record j is a
        # suffix sum of dt, and each record's x and B come straight from the ring
        total = dt
        updf = tl.zeros((BPF, N), dtype=tl.float32)
        for t in tl.static_range(L - 1):
            jj = L - 2 - t
            dj = tl.load(dtr_ptr + slot * s_dtr + h * CAP + jj)
            xj = tl.load(xr_ptr + slot * s_xr + (h * CAP + jj) * P + pf, mask=mpf,
                         other=0.0).to(tl.float32)
            # B_j loaded as a (rows, N) tile of one record (the same addresses on every
            # row): it then arrives in the fold's layout instead of being shuffled into it
            Bj = tl.load(Br_ptr + slot * s_Br + (g * CAP + jj) * N + n[None, :]
                         + 0 * pf[:, None]).to(tl.float32)
            updf += (tl.exp(A * total) * dj * xj)[:, None] * Bj
            total += dj
    else:
        w, total, mj = _ring_weights(dtr_ptr, slot, s_dtr, h, L - 1, dt, A, CAP, LB)
        Br = tl.load(Br_ptr + slot * s_Br + (g * CAP + j[:, None]) * N + n[None, :],
                     mask=mj[:, None], other=0.0)
        xrf = tl.load(xr_ptr + slot * s_xr + (h * CAP + j[:, None]) * P + pf[None, :],
                      mask=mj[:, None] & mpf[None, :], other=0.0).to(tl.float32)
        if FOLD_PREC == "bf16x3":  # B_j exact in bf16: exact products on tensor cores
            updf = split_dot(tl.trans(xrf * w[:, None]), Br,
                             tl.zeros((BPF, N), dtype=tl.float32), 3)
        else:
            updf = tl.dot(tl.trans(xrf * w[:, None]), Br.to(tl.float32),
                          input_precision=FOLD_PREC)
    Sf = tl.exp(A * total) * Sf + updf + (dt * xf)[:, None] * Bv[None, :]
    yf = tl.sum(Sf * Cv[None, :], axis=1)
    if HAS_D:
        yf += tl.load(D_ptr + h).to(tl.float32) * xf
    tl.store(y_ptr + (b * H + h) * P + pf, yf, mask=mpf)
    if TMA:
        ck_desc.store([slot, h * P + p0, 0], tl.reshape(Sf, (1, BPF, N)))
        return count_nans(Sf, mpf, None, False)
    return write_state(Sf, slot, fi, seed, layer, rowsf, n, mpf,
                       ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs, ck_bs_ptr + slot * s_ckbs,
                       rd_ptr + slot * s_rd, rd_rs_ptr + slot * s_rdrs, rd_bs_ptr + slot * s_rdbs,
                       CK_FMT, RD_FMT, SR, BPF, N, yf)


@triton.jit(do_not_specialize=["seed", "layer", "nrows"])
def _mamba2_flush_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, slots_ptr, y_ptr,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br,
    list_ptr, cur_ptr, fi_ptr, nan_ptr, seed, layer, nrows,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr, HAS_D: tl.constexpr,
    BPF: tl.constexpr, STAGES: tl.constexpr = None, RECORDS: tl.constexpr = False,
    FOLD_PREC: tl.constexpr = "ieee", ADVANCE: tl.constexpr = False, PDL: tl.constexpr = False,
    ck_desc=None, TMA: tl.constexpr = False,
):
    """Flush, persistent: the programs walk the (flushing row, head, BPF rows) tiles of the
    flush list (``_mamba2_flush_rows`` each; TMA and ``ck_desc`` as there). With PDL the
    launch may start before the non-flush launch ends, and its programs wait for it
    (``wait_prior_grid``) first. STAGES (None: Triton's default) software-pipelines the
    loop: the next tile's loads are issued while this one folds. With ADVANCE the programs
    then move every row's cursor on (``advance_rows``): the flush reads its flush indices
    from the list and the cursors were read by the earlier
    launches, so no separate launch is needed."""
    TILES: tl.constexpr = (P + BPF - 1) // BPF
    wait_prior_grid(PDL)
    nflush = tl.load(list_ptr)
    nans = tl.zeros((), dtype=tl.int32)
    for item in tl.range(tl.program_id(0), nflush * (H * TILES), tl.num_programs(0),
                         num_stages=STAGES):
        b = tl.load(list_ptr + 1 + 2 * (item // (H * TILES)))
        fi = tl.load(list_ptr + 2 + 2 * (item // (H * TILES)))
        h = (item // TILES) % H
        p0 = (item % TILES) * BPF
        pf = p0 + tl.arange(0, BPF)
        slot = tl.load(slots_ptr + b)
        nans += _mamba2_flush_rows(
            b, h, pf, pf < P, slot, fi, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, y_ptr,
            ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
            rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
            xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, seed, layer,
            H, P, N, G, L, CAP, LB, CK_FMT, RD_FMT, SR, HAS_D, BPF, RECORDS, FOLD_PREC,
            ck_desc, p0, TMA)
    if ADVANCE:
        advance_rows(slots_ptr, cur_ptr, fi_ptr, tl.program_id(0), tl.num_programs(0), nrows, L, 256)
    if nans > 0:
        tl.atomic_add(nan_ptr, nans)


def _check_inputs(cache: ReplayCache, x, dt, A, Bm, C, slots):
    H, P = x.shape[-2:]
    G, N = Bm.shape[-2:]
    if cache.kind != "mamba2":
        raise ValueError(f"expected a mamba2 cache, got {cache.kind}")
    if cache.ckpt.data.shape[1] != H or cache.ckpt.data.shape[2] != P:
        raise ValueError(f"inputs have {H} heads x {P} head_dim, cache has "
                         f"{tuple(cache.ckpt.data.shape[1:3])}")
    if H % G:
        raise ValueError(f"heads ({H}) must be a multiple of groups ({G})")
    if N % 32 or N & (N - 1):
        raise ValueError(f"d_state must be a power of two >= 32, got {N}")
    if dt.dtype != torch.float32:
        raise ValueError("dt must be fp32 (after bias and softplus)")
    if slots.dtype != torch.int32:
        raise ValueError("slots must be int32")
    if not (x.is_contiguous() and Bm.is_contiguous() and C.is_contiguous() and dt.is_contiguous()):
        raise ValueError("x, dt, B and C must be contiguous")
    if A.shape != (H,):
        raise ValueError(f"A must have shape ({H},)")
    return H, P, N, G


def _block_p(P: int, N: int) -> int:
    """Head-dim rows per decode program: the largest power of two up to 64 (32 when
    d_state > 128) whose tiles pad P by at most a quarter. Nemotron-3-Nano's head_dim 80 takes
    32 (96 rows) rather than 64 (128 rows): its non-flush step ran 299 instead of 355 us at
    batch 256 on the H200 (reports/kernels/tune_r7_nano_122b.log)."""
    b = min(triton.next_power_of_2(P), 64 if N <= 128 else 32)
    while b > 16 and triton.cdiv(P, b) * b * 4 > P * 5:
        b //= 2
    return b


def mamba2_decode_step(cache: ReplayCache, x, dt, A, Bm, C, D, slots, *, advance: bool = True,
                       out: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """One decode step for a batch of rows (CUDA).

    x (B, H, P), dt (B, H) fp32 post-softplus, A (H,), Bm/C (B, G, N), D (H,) or None,
    slots (B,) int32 cache slots (< 0: padding row, skipped). Returns y (B, H, P) fp32.
    The launch knobs below are keyword arguments; ``mamba2_step_plan`` resolves and checks
    them before any launch and returns what the step launches (``kernels.plan``).
    Conventional configs (L = 1, no spec capacity) run the conventional kernel. ReplaySSM
    configs run three launches: per-group ring products and the flush list, the non-flush
    rows (``block_p`` rows per program, ``num_warps``), and a persistent grid over the
    flushing rows' tiles (``flush_block_p`` rows, ``flush_warps``), which also advances the
    cursors unless ``fuse_advance=False`` (then a fourth launch does). ``fuse_prep`` (default
    ``fused_prep_default``: small batches) has the non-flush launch form the ring products
    and the flush list itself, one launch fewer. ``whole_head`` (default
    ``whole_head_default``, at the default tile rows) has each non-flush program cover a whole
    head whose dim is no power of two in two row passes (``whole_head_rows``). ``maxnreg`` /
    ``flush_maxnreg`` cap the registers of the step / flush programs (``register_cap``; None:
    no cap; ``maxnreg`` by default ``mamba2_nonflush_maxnreg_default``).
    ``one_launch`` (default ``one_launch_default``: small batches) makes the whole step one
    launch: conventional programs and flushing rows' programs do their work on the step's
    tiles (so the flush knobs do not apply) and the last program to finish advances the
    cursors (a launch of its own with ``fuse_advance=False``). ``step_flush_rows`` /
    ``step_flush_fold`` (default ``step_flush_default``) have such a program flush its rows in
    passes of that many rows, each folded record by record (``"records"``) or as one bf16x3
    product (``"dot"``); ``fuse_prep=False`` keeps the ring-products launch before it.
    ``nvfp4_decode`` picks how a non-flush step decodes an NVFP4 source (``NVFP4_DECODES``;
    default ``"e4m3"``); ``lut=True`` reads a 16-entry table instead; ``fp8_decode`` how it
    decodes an fp8 one (``FP8_DECODES``, ``fp8_decode_of``; default ``"cvt"``). ``pdl`` (default: on
    GPUs that have it, ``resolve_pdl``) launches the non-flush and flush
    launches with programmatic dependent launch, so each starts while the launch before it
    still runs; ``"prep"`` / ``"flush"`` name one of the two edges. ``early_loads=True``
    issues the non-flush output's loads before the cursor arrives, reading every ring
    record (``ring_records``); default ``early_loads_default``. ``prep_groups`` (default
    ``prep_groups_default``) sets the groups per ring-products program. ``flush_tma`` moves
    an fp32 checkpoint's flush tiles through the tensor memory accelerator (default: where
    it applies, ``common.resolve_flush_tma``).
    """
    if runs_reference(x):
        check_knob_names(mamba2_step_plan, knobs)
        return reference_call(cache, lambda st: ref.decode_step(st, x, dt, A, Bm, C, D, slots),
                              advance=advance, out=out)
    H, P, N, G = _check_inputs(cache, x, dt, A, Bm, C, slots)
    cfg = cache.cfg
    # a conventional cache may hold no ring (the vLLM plugin's pages)
    ring_dtype = cache.ring["B"].dtype if "B" in cache.ring else Bm.dtype
    plan = mamba2_step_plan(cfg, cache.capacity, H, P, N, G, x.shape[0], x.device,
                            ring_dtype=ring_dtype, ckpt_data=cache.ckpt.data, advance=advance,
                            **knobs)
    note_plan(plan)
    Bsz = x.shape[0]
    y = out if out is not None else torch.empty(Bsz, H, P, device=x.device, dtype=torch.float32)
    d = D if D is not None else A
    ck = state_args(cache.ckpt, slots)
    if plan.conventional:
        _mamba2_conv_kernel[plan.grid](
            x, dt, A, Bm, C, d, slots, y, *ck, cache.flush_index, cache.nan_count,
            cache.seed, cache.layer, cache.ticket, cache.cursor, Bsz, H=H, P=P, N=N, G=G,
            CK_FMT=fmt_code(cache.ckpt), SR=cfg.uses_sr, HAS_D=D is not None, BP=plan.rows,
            TILE_FIRST=plan.tile_first, ADVANCE=plan.ticket, num_warps=plan.warps,
            **register_cap(plan.maxnreg))
        if plan.separate_advance:
            advance_cursor(cache, slots)
        return y
    xr, dtr, Br = cache.ring["x"], cache.ring["dt"], cache.ring["B"]
    rd = state_args(cache.read, slots)
    LB = max(16, triton.next_power_of_2(cache.capacity))
    bc = torch.empty(Bsz, G, LB + 3, device=x.device, dtype=torch.float32)
    work = torch.empty(2 * Bsz + 1, device=x.device, dtype=torch.int32)
    mma = plan.decode == "mma"
    # C's fp16 pieces for the tensor-core product (nvfp4_decode="mma")
    mm = torch.empty(Bsz * G * N * 16 if mma else 1, device=x.device, dtype=torch.float16)
    ms = torch.empty(Bsz * G if mma else 1, device=x.device, dtype=torch.float32)
    if plan.prep_grid is not None:
        _mamba2_prep_kernel[plan.prep_grid](
            Bm, C, slots, Br, slot_stride(Br), cache.cursor, cache.flush_index, bc, work, Bsz,
            mm, ms, G=G, N=N, L=cfg.L, CAP=cache.capacity, LB=LB, RB=256,
            PDL=plan.prep_pdl, PG=plan.prep_groups, MMA=mma, num_warps=4)
    fl = plan.flush
    fl_pdl = fl is not None and fl.pdl
    src = rd if cache.read is not None else ck
    _mamba2_nonflush_kernel[plan.grid](
        x, dt, A, Bm, d, C, slots, y, *src, xr, dtr, Br, slot_stride(xr), slot_stride(dtr),
        slot_stride(Br), cache.cursor, bc, lut_table(plan.lut, y), cache.flush_index, work, Bsz,
        *ck, *rd, cache.nan_count, cache.seed, cache.layer, cache.ticket, mm, ms,
        H=H, P=P, N=N, G=G, L=cfg.L,
        CAP=cache.capacity, LB=LB, SRC_FMT=fmt_code(cache.read or cache.ckpt), HAS_D=D is not None,
        BP=plan.rows, LUT=plan.lut, TILE_FIRST=plan.tile_first, FUSED_PREP=plan.fused_prep,
        BP2=plan.rows2, ONE_LAUNCH=plan.one_launch, ADVANCE=plan.ticket,
        FR=plan.step_flush_rows, FR_DOT=plan.step_flush_fold == "dot",
        CK_FMT=fmt_code(cache.ckpt), RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr,
        E4M3=plan.decode == "e4m3", WORDS8=plan.decode == "words8", PDL=plan.step_pdl,
        FLUSH_PDL=fl_pdl, MMA=mma,
        EARLY=plan.early_loads, launch_pdl=plan.step_pdl,
        num_warps=plan.warps, **register_cap(plan.maxnreg))
    if fl is not None:
        launch_persistent(
            _mamba2_flush_kernel, x.device, fl.tiles, fl.per_sm,
            x, dt, A, Bm, C, d, slots, y, *ck, *rd,
            xr, dtr, Br, slot_stride(xr), slot_stride(dtr), slot_stride(Br),
            work, cache.cursor, cache.flush_index, cache.nan_count, cache.seed, cache.layer, Bsz,
            H=H, P=P, N=N, G=G, L=cfg.L, CAP=cache.capacity, LB=LB,
            CK_FMT=fmt_code(cache.ckpt), RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr,
            HAS_D=D is not None, BPF=fl.rows, STAGES=fl.stages, RECORDS=fl.fold == "records",
            FOLD_PREC=fl.precision, ADVANCE=fl.advances_cursor, PDL=fl.pdl, launch_pdl=fl.pdl,
            num_warps=fl.warps,
            ck_desc=state_descriptor(cache.ckpt, fl.rows, fl.tma) if fl.tma else ck[0],
            TMA=fl.tma, **register_cap(fl.maxnreg))
    if plan.separate_advance:
        advance_cursor(cache, slots)
    return y


def mamba2_step_plan(cfg, capacity: int, H: int, P: int, N: int, G: int, batch: int,
                     target: Target | torch.device, *, ring_dtype: torch.dtype = torch.bfloat16,
                     ckpt_data: torch.Tensor | None = None, block_p: int | None = None,
                     advance: bool = True, num_warps: int | None = None,
                     flush_block_p: int | None = None, flush_warps: int | None = None,
                     flush_per_sm: int | None = None, lut: bool = False,
                     flush_stages: int | None = None, flush_fold: str | None = None,
                     flush_precision: str | None = None, tile_first: bool | None = None,
                     fuse_advance: bool = True, fuse_prep: bool | None = None,
                     maxnreg: int | None | object = DEFAULT,
                     flush_maxnreg: int | None | object = DEFAULT,
                     whole_head: bool | None = None, one_launch: bool | None = None,
                     nvfp4_decode: str | None = None, pdl: bool | str | None = None,
                     early_loads: bool | None = None, prep_groups: int | None = None,
                     flush_tma: bool | None = None, fp8_decode: str | None = None,
                     step_flush_rows: int | None = None,
                     step_flush_fold: str | None = None) -> StepPlan:
    """The launches of ``mamba2_decode_step`` for H heads of P rows x N state columns in G
    groups, ring capacity ``capacity`` (0: conventional), ``batch`` rows on ``target``, with
    its knobs (same names and defaults); every knob is checked here, before any launch.
    ``ring_dtype`` (B's) picks the flush's default products, ``ckpt_data`` lets the flush
    check that TMA can address the checkpoint (``plan.step_plan`` prints one)."""
    target = Target.of(target)
    check_prep_groups(prep_groups, G, "groups")
    register_cap(None if maxnreg is DEFAULT else maxnreg)
    fmaxnreg = None if flush_maxnreg is DEFAULT else flush_maxnreg
    register_cap(fmaxnreg)
    src = cfg.read or cfg.ckpt
    mode = nvfp4_decode_of(nvfp4_decode)
    decode = (("lut" if lut else mode) if src.name == "nvfp4" else
              fp8_decode_of(fp8_decode, src.name, capacity))
    flush_knobs = (flush_block_p, flush_warps, flush_per_sm, flush_stages, flush_fold,
                   flush_precision, fmaxnreg, flush_tma or None)
    kb, kw = mamba2_step_knobs(cfg, P, N)
    split = whole_head_rows(P, N) if capacity else None

    def step_rows(ol: bool) -> tuple[int, int]:
        """(rows, second row pass) of a step program, one launch or not."""
        rows = block_p or small_grid_rows(cfg, kb, P, H, batch, ol)
        wh = whole_head
        if wh is None:
            passes = flush_passes_default(cfg, P) or step_flush_rows is not None
            wh = whole_head_default(cfg, ol, passes) and block_p is None and rows == kb
        return split if wh and split is not None else (rows, 0)

    # one launch up to a larger batch where its programs would flush in row passes
    passes = (capacity > 0 and step_flush_rows is None and step_flush_fold is None
              and flush_passes_default(cfg, P)
              and step_flush_default(cfg, *step_rows(True), ring_dtype)[0] is not None)
    ol = resolve_one_launch(one_launch, batch, flush_knobs, conventional=capacity == 0,
                            step_state=batch * H * P * N, passes=passes)
    advance = advance and keeps_counters(cfg, capacity)
    ticket = ol and advance and fuse_advance  # each row's last program advances its cursor
    use_pdl, pdl_edges = resolve_pdl(pdl, target), pdl_edges_of(pdl)
    if early_loads is None:
        early_loads = early_loads_default(cfg, batch, ol)
    BP, BP2 = step_rows(ol)
    tiles = 1 if BP2 else triton.cdiv(P, BP)
    if tile_first is None:
        tile_first = (not reads_narrow_copy(cfg) if BP2 else
                      mamba2_tile_first(capacity, P, BP, reads_narrow_copy(cfg)))
    base = dict(kind="mamba2", config=str(cfg), batch=batch, heads=H, dim=P, d_state=N,
                groups=G, capacity=capacity, target=target, one_launch=ol, ticket=ticket,
                rows=BP, rows2=BP2, tiles=tiles, tile_first=bool(tile_first),
                grid=step_grid(batch, H, tiles, tile_first), warps=num_warps or kw,
                maxnreg=None if maxnreg is DEFAULT else maxnreg, decode=decode,
                early_loads=bool(early_loads), lut=bool(lut))
    if capacity == 0:
        return StepPlan(**{**base, "decode": "", "early_loads": False},
                        separate_advance=advance and not ticket, fused_prep=False,
                        prep_groups=None, prep_grid=None, step_pdl=False, flush=None)
    if ol and step_flush_rows is None and step_flush_fold is None:
        step_flush_rows, step_flush_fold = step_flush_default(cfg, BP, BP2, ring_dtype)
    fr, fr_fold = check_step_flush(step_flush_rows, step_flush_fold, ol, BP, BP2, ring_dtype)
    # a one-launch step forms its ring products unless asked not to (then the products launch
    # runs before it, and the step is two launches)
    fp = ((fuse_prep is None or fuse_prep) if ol else
          (fused_prep_default(batch) if fuse_prep is None else fuse_prep))
    if decode == "mma" and (fp or ol):
        raise ValueError("nvfp4_decode='mma' reads the fp16 pieces of C that the ring-products "
                         "launch writes: it needs a step with that launch (fuse_prep=False and "
                         "one_launch=False, the defaults from batch 5)")
    if maxnreg is DEFAULT:
        base["maxnreg"] = mamba2_nonflush_maxnreg_default(decode, BP2, base["warps"], kw, fp,
                                                          batch)
    pg = None if fp else prep_groups or prep_groups_default(batch, G)
    # programmatic launches: the non-flush launch after the ring products, the flush after it
    prep_pdl = use_pdl and "prep" in pdl_edges
    step_pdl = use_pdl and not fp and "prep" in pdl_edges
    flush = None
    if not ol:
        fold, fblock, fwarps = mamba2_flush_knobs(cfg)
        BPF = min(flush_block_p or fblock, triton.next_power_of_2(P))
        FW = flush_warps or fwarps
        records = records_fold(flush_fold or fold)
        if flush_maxnreg is DEFAULT:
            fmaxnreg = mamba2_flush_maxnreg_default(cfg, BPF, FW) if records else None
        tma = resolve_flush_tma(flush_tma, cfg, P, BPF, ol, target, ckpt_data)
        flush = FlushPlan(
            fold="records" if records else "dot", rows=BPF, warps=FW,
            precision=fold_precision(flush_precision, ring_dtype,
                                     default_fold_precision(cfg, records, BPF, ring_dtype)),
            stages=flush_stages or flush_stages_for(cfg, tma), tma=tma,
            tiles=batch * H * triton.cdiv(P, BPF), per_sm=flush_per_sm, maxnreg=fmaxnreg,
            pdl=use_pdl and "flush" in pdl_edges, advances_cursor=advance and fuse_advance)
    base.update(step_flush_rows=fr, step_flush_fold=fr_fold)
    return StepPlan(**base, separate_advance=advance and not (ticket if ol else fuse_advance),
                    fused_prep=fp, prep_groups=pg, prep_grid=None if fp else (batch, G // pg),
                    prep_pdl=prep_pdl and not fp, step_pdl=step_pdl, flush=flush)


STEP_FLUSH_PASS_ROWS = 8


STEP_FLUSH_DOT_ROWS = 16


def flush_passes_default(cfg, P: int) -> bool:
    """Whether a Mamba-2 ReplaySSM step's one-launch programs, where they would flush in row
    passes (``step_flush_default``: more than 16 rows), make the step one launch up to
    ``ONE_LAUNCH_PASSES_MAX_BATCH`` (``one_launch_default``): every config except an SR
    checkpoint on heads of more than 64 rows, whose whole-head programs
    (Nemotron-3-Nano-4B's 80 rows in ten passes) flush as one long chain. Measured on the
    H200 (reports/kernels/tune_r265_step_flush_batches.log): Nano-4B's nvfp4-read/fp16-sr
    window 8.6 -> 8.8 us at batch 4 and 10.0 -> 9.9 at 8, its flush 25.5 -> 49.0 and 45.7
    -> 65.2 us."""
    return not (cfg.uses_sr and P > 64)


def step_flush_default(cfg, BP: int, BP2: int, ring_dtype: torch.dtype) -> tuple[int | None, str | None]:
    """(``step_flush_rows``, ``step_flush_fold``) of a one-launch step left at their defaults:
    a program of more rows than one pass flushes them in passes, a plain fp32 checkpoint (no
    read copy, bf16 ring) on passes of 16 rows folded as one bf16x3 product, every other
    config on passes of 8 rows folded record by record; a program of 16 rows or fewer
    (batch 1-2, whose grids shrink to 8-16 rows) flushes them at once, as before. Measured on
    the H200, window us (two launches or the one-launch flush at once -> passes;
    reports/kernels/tune_r264_step_flush_small.log, tune_r265_step_flush_batches.log):

    * Nemotron-3-Super, batch 4: replay-fp32 8.8 -> 6.7 (8 rows: 6.8; at once in one launch
      8.0, its flush 34.5 against 11.9 us), nvfp4-read/fp16-sr 7.7 -> 6.0, fp8-read/fp32 7.2
      -> 5.8, nvfp4-read/fp32 7.6 -> 5.7; batch 8: 12.7 -> 9.6, 10.0 -> 8.1, 8.8 -> 8.5,
      10.5 -> 8.2;
    * Nano-4B (whole-head programs of 64 + 16 rows, ``whole_head_default``), batch 4: 8.9 ->
      7.2, fp8-read/fp32 7.5 -> 6.8, nvfp4-read/fp32 8.6 -> 8.3; batch 8: 12.6 -> 9.6, 10.3
      -> 8.7, 10.4 -> 9.4;
    * batch 16 and up the persistent flush wins back (Super replay-fp32 28.5 against 26.0-26.7
      at 16 but nvfp4-read/fp16-sr 15.3 against 15.8; at 32 every preset 0.5-23% slower in one
      launch), hence ``ONE_LAUNCH_PASSES_MAX_BATCH``."""
    rows = BP + BP2
    plain = cfg.read is None and cfg.ckpt.name == "fp32" and ring_dtype == torch.bfloat16
    fr = STEP_FLUSH_DOT_ROWS if plain else STEP_FLUSH_PASS_ROWS
    if rows <= STEP_FLUSH_DOT_ROWS or BP % fr or BP2 % fr:
        return None, None
    return fr, "dot" if plain else "records"


def mamba2_tile_first(capacity: int, P: int, block_p: int, narrow: bool = True) -> bool:
    """Default grid order of the conventional / non-flush step (``tile_first``,
    ``common.row_head_tile``), measured on the H200 at batch 256
    (reports/kernels/tune_r27_grid_order.log): (tiles, heads, rows) for the conventional
    step, whose programs then read and write one slot's state in order (Nemotron-3-Super
    626 -> 590 us, Nano-4B 600 -> 560 us), for non-flush steps whose heads take more than
    one tile (Nano-4B's 80 rows: 283 -> 264 us) and for non-flush steps that read the state
    itself rather than an fp8 / NVFP4 copy (``narrow``; Super's one-warp 64-row tiles 289 ->
    283 us, ``tune_r65/r66_fp32_tiles.log``); (rows, heads, tiles) otherwise.

    A whole-head grid (``whole_head``, one tile per head) orders heads before rows when it
    reads the state itself and rows first for an fp8 / NVFP4 copy (``mamba2_step_plan``):
    Nemotron-3-Nano-4B's replay-fp32 window 283.8 -> 280.2 us at batch 256 (three interleaved
    runs, non-flush 264.1 -> 260.4), 559.1 -> 551.2 at 512, while the narrow reads were
    0.3-0.6 us slower heads first (reports/kernels/tune_r180_nano_tile_first.log)."""
    return capacity == 0 or triton.cdiv(P, block_p) > 1 or not narrow


def flush_stages_for(cfg, tma: bool = False) -> int | None:
    """Software-pipelining stages of the persistent Mamba-2 flush loop (H200, batch 256,
    reports/kernels): for a plain fp32 checkpoint, whose flush is bound by load latency, 3
    with cp.async loads (Nemotron-3-Super 1219 -> 815 us, Nano-4B 1330 -> 881 us) and 2 with
    TMA loads (``resolve_flush_tma``; Super 627.8 -> 622.4 us, Nano-4B 587.3 -> 579.9 against
    3, tune_r152_tma.log); otherwise None, Triton's own choice, which was faster for SR and
    read-copy flushes than either 1 or 3 stages."""
    if cfg.ckpt.name == "fp32" and cfg.read is None:
        return 2 if tma else 3
    return None


def whole_head_rows(P: int, N: int) -> tuple[int, int] | None:
    """Two power-of-two row passes ``(BP, BP2)`` that cover a head dim ``P`` that is no power of
    two with as little padding as two passes allow (Nemotron-3-Nano's 80: 64 + 16), or None
    when ``P`` is one tile already or the first pass would exceed the non-flush tile limit."""
    cap = 64 if N <= 128 else 32
    bp = 1 << (P.bit_length() - 1)
    if bp == P or bp > cap or P - bp > bp:
        return None
    return bp, triton.next_power_of_2(P - bp)


def mamba2_nonflush_maxnreg_default(decode: str, rows2: int, warps: int, default_warps: int,
                                    fused: bool, batch: int) -> int | None:
    """The register cap of a Mamba-2 non-flush program left at its default ``maxnreg``,
    measured on the H200: 80 from batch 256 for a whole-head program of two passes
    (Nemotron-3-Nano-4B's 64 + 16 rows) that decodes an NVFP4 source through E4M3 bytes, on
    its default one warp. It takes 96 registers uncapped and 80 capped, with the same 2336
    instructions and no spills; an SM then holds 24 one-warp programs instead of 20
    (``persistent.programs_per_sm``), and the non-flush step is 1.1-2.2% faster at batch
    256 and 1.5-2.0% at 512 (reports/kernels/tune_r244_regcap_default.log; a cap of 88,
    still 20 programs per SM, was 1.4-2.5% slower, tune_r243_nonflush_regcap.log). At batch
    16 and 64 the three NVFP4 presets moved both ways (-6.9% to +2.0%, 0.1-0.8 us), so the
    cap waits for batch 256. Elsewhere None: Nemotron-3-Super's program takes 72 registers
    uncapped and 80 under that cap (28 -> 24 programs per SM), an fp8 source spills at 80,
    and a step with its ring products fused in holds more."""
    if (decode == "e4m3" and rows2 > 0 and warps == default_warps == 1 and not fused
            and batch >= 256):
        return 80
    return None


def whole_head_default(cfg, one_launch: bool = False, passes: bool = False) -> bool:
    """Whether a non-flush step covers each head in one program (``whole_head``) by default,
    measured on the H200 (reports/kernels):

    * steps reading an fp8 / NVFP4 copy, which are bound by instruction issue, so padding rows
      and a second program per head cost time (batch 256, tune_r57_whole_head.log);
    * steps reading an fp32 state, except one-launch steps (small batches): Nemotron-3-Nano-4B's
      replay-fp32 window with one one-warp program per head (rows 64 + 16) instead of three
      32-row programs, 294.3 -> 287.2 us at batch 256, 572.0 -> 559.5 at 512, 79.9 -> 78.7 at
      64 and 27.1 -> 26.1 at 16. A flush step then ends its non-flush launch of exiting
      programs sooner (632 -> 600 us at 256), and the non-flush step is faster too (271.9 ->
      266.4 us) (tune_r132_nano_whole_head*.log). One-launch steps whose programs flush in
      row passes (``passes``, ``step_flush_default``) take whole heads too: Nano-4B's
      replay-fp32 window 9.3 -> 7.2 us at batch 4 and 14.4 -> 9.6 at 8 against 32-row
      programs (reports/kernels/tune_r265_step_flush_batches.log)."""
    return cfg.L > 1 and (reads_narrow_copy(cfg) or not one_launch or passes)


def early_loads_default(cfg, batch: int, one_launch: bool) -> bool:
    """Whether a Mamba-2 non-flush step issues its output's loads before its cursor arrives
    (``early_loads``) by default, measured on the H200: a one-launch step at batch 1 that
    reads an fp32 state (``replay-fp32``), where the loads of the state, the ring and the
    cursor then overlap. With every state from HBM its window went 5.5 -> 5.3 us on
    Nemotron-3-Super and 5.6 -> 5.1 on Nano-4B (L = 16), 5.8 -> 5.3 and 5.7 -> 5.2 (L = 8);
    from L2 4.3 -> 4.4, 4.3 -> 4.2, 4.5 -> 4.3, 4.4 -> 4.1
    (reports/kernels/tune_r207_mamba2_early.log). A step reading an fp8 / NVFP4 copy keeps
    its loads after the cursor: its flush steps, whose programs also form the discarded
    non-flush output, took 0.2-2.2 us longer (1.1-1.4 for most), so its windows gained
    nothing (-0.2 to +0.3 us). Batches 2-4 are not fully measured with it
    (tune_r210_mamba2_early_b4.log)."""
    return one_launch and batch == 1 and (cfg.read or cfg.ckpt).name == "fp32"


def mamba2_step_knobs(cfg, P: int, N: int) -> tuple[int, int]:
    """(head-dim rows, warps) per program of the conventional / non-flush step, measured on
    the H200 at batch 256 (reports/kernels):

    * conventional step with SR: 8 rows, 2 warps (Philox and the rounding are the work; fp16-SR
      on Nemotron-3-Super 795 -> 596 us, bf16-SR 562 -> 424 us, ``tune_r14_small_tiles.log``);
    * non-flush step reading an fp8 / NVFP4 copy: one warp per tile, which is bound by
      instruction issue, not bytes (NVFP4 on Super 175 -> 84 us, ``tune_r11_nvfp4.log``);
    * conventional step of an fp32 state: 16 rows, one warp (Nemotron-3-Nano-4B 557 -> 543 us,
      Super 588 -> 575 us against ``_block_p`` rows and 4 warps, ``tune_r66/r67_fp32_tiles.log``);
    * otherwise ``_block_p`` rows and one warp: the non-flush step with one warp per 32 rows
      ran Nemotron-3-Nano-4B 300 -> 280 us (``tune_r14_small_tiles.log``), and with one warp
      on Super's 64-row tiles, tile-first, 289 -> 283 us (``tune_r65/r66_fp32_tiles.log``)."""
    bp = _block_p(P, N)
    if cfg.L == 1:
        if cfg.uses_sr:
            return min(8, triton.next_power_of_2(P)), 2
        return (min(16, triton.next_power_of_2(P)), 1) if cfg.ckpt.name == "fp32" else (bp, 4)
    return bp, 1


# Mamba-2 flush knobs (fold, tile rows, warps) measured fastest on the H200 at batch 256 for
# Nemotron-3-Nano-4B and -Super (reports/kernels/tune_r12_flush_fold.log; the read-copy
# flushes of an fp32 checkpoint with one-warp tiles: tune_r39_flush_warps_m2.log; the plain
# fp32 checkpoint's, Super 892 -> 692-741 us: tune_r46_fp32_flush_*.log; the NVFP4 read
# copy over an fp16-SR checkpoint, 1782 -> 1640 us: tune_r49_wave_flush_*.log, then on 16
# rows of two warps capped at 168 registers (``MAMBA2_FLUSH_MAXNREG``), windows 2.1-2.5%
# faster at batch 256-512: tune_r253_m2_flush_tiles.log, tune_r254_m2_sr_tiles.log; over fp8-SR
# and the fp8 / NVFP4 checkpoints without a read copy: tune_r51_wave_flush_m2.log; the
# record folds of the fp8 copy of an fp32 checkpoint, Nano-4B 1650 -> 1290 us, and of the
# NVFP4 checkpoint, 1347 -> 1150 us, once B_j arrives in the fold's layout:
# tune_r53_flush_variants.log; since the e4m3 roundings' integer and hardware forms, the
# NVFP4 copy of an fp8-SR checkpoint on 8-row tiles, Super 1861 -> 1810 us, and the fp8
# checkpoint's bf16x3 products on 16-row one-warp tiles, 947 -> 518 us and Nano-4B 877 ->
# 471 (two warps 666-736 and 626-687 us): tune_r147_fp8_tiles.log, tune_r148_fp8_stages.log),
# keyed by (checkpoint format, SR, read-copy format); other
# configs keep (dot, 32, flush_warps_default).
MAMBA2_FLUSH_KNOBS: dict[tuple[str, bool, str | None], tuple[str, int, int]] = {
    ("fp32", False, None): ("dot", 16, 1),
    ("fp32", False, "nvfp4"): ("records", 8, 1),
    ("fp32", False, "fp8e4m3"): ("records", 8, 1),
    ("fp16", True, "nvfp4"): ("records", 16, 2),
    ("fp8e4m3", True, "nvfp4"): ("records", 8, 1),
    ("fp8e4m3", False, None): ("dot", 16, 1),
    ("nvfp4", False, None): ("records", 8, 1),
}


def _flush_key(cfg) -> tuple[str, bool, str | None]:
    return (cfg.ckpt.name, cfg.uses_sr, cfg.read.name if cfg.read is not None else None)


def mamba2_flush_knobs(cfg) -> tuple[str, int, int]:
    """(flush_fold, flush tile rows, flush warps) defaults for a config."""
    return MAMBA2_FLUSH_KNOBS.get(_flush_key(cfg), ("dot", 32, flush_warps_default(cfg)))


# Register caps of Mamba-2 flush programs on their default tiles (``MAMBA2_FLUSH_KNOBS``),
# keyed the same way; ``mamba2_flush_maxnreg_default`` says what was measured.
MAMBA2_FLUSH_MAXNREG: dict[tuple[str, bool, str | None], int] = {
    ("fp16", True, "nvfp4"): 168,
}


def mamba2_flush_maxnreg_default(cfg, rows: int, warps: int) -> int | None:
    """The register cap of a Mamba-2 flush program left at its default ``flush_maxnreg``, on
    its default tiles (``mamba2_flush_knobs``; other tiles take no cap), measured on the
    H200: 168 for the NVFP4 copy of an fp16-SR checkpoint, whose 16-row two-warp tiles take
    244-252 registers and 4 programs per SM uncapped, 168 with 4 spill instructions and 6
    per SM. Windows against its earlier 4-row one-warp tiles without a cap, Nemotron-3-Super
    / Nano-4B (reports/kernels/tune_r254_m2_sr_tiles.log, tune_r255_m2_sr_small.log): batch
    256 154.7 -> 151.5 / 160.4 -> 156.9 us, 512 302.4 -> 295.0 / 314.3 -> 306.4, at L = 8
    0.1-0.5% faster; batch 4-64 0-4.9% faster, one window 0.5% slower (Nano-4B, L = 8, batch
    64). Uncapped the same tiles were 1.0-5.4% slower than the earlier ones (163.4 / 163.0
    against 155.1 / 161.2 us at batch 256, tune_r253_m2_flush_tiles.log)."""
    cap = MAMBA2_FLUSH_MAXNREG.get(_flush_key(cfg))
    return cap if cap is not None and (rows, warps) == mamba2_flush_knobs(cfg)[1:] else None


# ------------------------------------------------------------------------------ speculative
@triton.jit
def _mamba2_verify_prep_kernel(
    B_ptr, C_ptr, slots_ptr, Br_ptr, s_Br, cur_ptr, cb_ptr,
    T: tl.constexpr, TB: tl.constexpr, G: tl.constexpr, N: tl.constexpr, CAP: tl.constexpr,
    LB: tl.constexpr, KC: tl.constexpr, PREC: tl.constexpr = "ieee", PDL: tl.constexpr = False,
):
    """Per (row, group): the drafts' ``C_i . B_j`` against the committed records (TB x LB)
    and against the drafts (TB x TB), over d_state chunks of KC so an fp32 ``tl.dot`` keeps
    only KC columns of its operands in registers. Every head of the group reads them, so
    the verify programs keep only the state product. With PDL the verify launch may start
    at once (it writes its drafts at c and after, these products read the records before c)."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    release_dependents(PDL)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        kc = tl.arange(0, KC)
        j = tl.arange(0, LB)
        i = tl.arange(0, TB)
        mi = i < T
        c = tl.load(cur_ptr + slot)
        draft = ((b * T + i) * G + g) * N
        cbr = tl.zeros((TB, LB), dtype=tl.float32)
        cbd = tl.zeros((TB, TB), dtype=tl.float32)
        for k0 in tl.range(0, N, KC):
            Cd = tl.load(C_ptr + draft[:, None] + k0 + kc[None, :], mask=mi[:, None],
                         other=0.0).to(tl.float32)
            BdT = tl.load(B_ptr + draft[None, :] + k0 + kc[:, None], mask=mi[None, :],
                          other=0.0).to(tl.float32)
            BrT = tl.load(Br_ptr + slot * s_Br + (g * CAP + j[None, :]) * N + k0 + kc[:, None],
                          mask=(j < c)[None, :], other=0.0).to(tl.float32)
            if PREC == "bf16x3":  # bf16 activations: one exact product each
                cbr = split_dot(Cd, BrT, cbr, 1)
                cbd = split_dot(Cd, BdT, cbd, 1)
            else:
                cbr += tl.dot(Cd, BrT, input_precision=PREC)
                cbd += tl.dot(Cd, BdT, input_precision=PREC)
        out = cb_ptr + (b * G + g) * (TB * LB + TB * TB)
        tl.store(out + i[:, None] * LB + j[None, :], cbr)
        tl.store(out + TB * LB + i[:, None] * TB + i[None, :], cbd)


@triton.jit
def _mamba2_verify_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, slots_ptr, y_ptr,
    src_ptr, src_rs_ptr, src_bs_ptr, s_src, s_srcrs, s_srcbs,
    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br, cur_ptr, cb_ptr,
    T: tl.constexpr, TB: tl.constexpr,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
    CAP: tl.constexpr, LB: tl.constexpr,
    SRC_FMT: tl.constexpr, HAS_D: tl.constexpr, BP: tl.constexpr, KC: tl.constexpr,
    PREC: tl.constexpr, SMALL: tl.constexpr, TERMS: tl.constexpr,
    TILE_FIRST: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """All T draft outputs at once in chunk form, Y (BP, TB) = S C^T e^{A cum} + (committed
    records) + (drafts), as one accumulator over ``tl.dot``s with a 16- or KC-wide inner
    dimension: KC state columns at a time, then 16 committed records at a time (the group's
    ``C . B`` products from ``_mamba2_verify_prep_kernel``), then the drafts. No operand wider
    than KC lives in registers. PREC is the state product's ``dot_precision`` (``"bf16x3"``:
    ``split_dot`` with TERMS pieces, the row scale applied after), SMALL the others'.
    Appends the drafts after the committed records (the cursor does not move). With PDL the
    launch may start while the products' launch still runs: its programs wait for it
    (``wait_prior_grid``) after the state product and before they end."""
    b, h, pt = row_head_tile(TILE_FIRST)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        HPG: tl.constexpr = H // G
        g = h // HPG
        p = pt * BP + tl.arange(0, BP)
        mp = p < P
        kc = tl.arange(0, KC)
        i = tl.arange(0, TB)
        mi = i < T
        r16 = tl.arange(0, 16)
        c = tl.load(cur_ptr + slot)
        A = tl.load(A_ptr + h).to(tl.float32)
        dtd = tl.load(dt_ptr + (b * T + i) * H + h, mask=mi, other=0.0).to(tl.float32)
        dtr = tl.load(dtr_ptr + slot * s_dtr + h * CAP + tl.arange(0, LB),
                      mask=tl.arange(0, LB) < c, other=0.0)
        cd = tl.cumsum(dtd, 0)
        total = tl.sum(dtr, 0) + cd  # (TB,) dt since the checkpoint up to draft i
        Y = tl.zeros((BP, TB), dtype=tl.float32)
        draft = ((b * T + i) * G + g) * N
        SPLIT: tl.constexpr = PREC == "bf16x3"
        for k0 in tl.range(0, N, KC):
            S = load_cols(src_ptr + slot * s_src, src_rs_ptr + slot * s_srcrs,
                          src_bs_ptr + slot * s_srcbs, h * P + p, k0, mp, SRC_FMT, BP, N, KC,
                          True, not SPLIT)
            CdT = tl.load(C_ptr + draft[None, :] + k0 + kc[:, None], mask=mi[None, :],
                          other=0.0).to(tl.float32)
            if SPLIT:
                Y = split_dot(S, CdT, Y, TERMS)
            else:
                Y += tl.dot(S, CdT, input_precision=PREC)
        if SPLIT:
            Y = row_scales(src_rs_ptr + slot * s_srcrs, h * P + p, mp, SRC_FMT, BP)[:, None] * Y
        Y = tl.exp(A * total)[None, :] * Y
        wait_prior_grid(PDL)
        cb = cb_ptr + (b * G + g) * (TB * LB + TB * TB)
        done = 0.0
        for j0 in tl.range(0, c, 16):  # committed records, 16 at a time
            j = j0 + r16
            mj = j < c
            dj = tl.load(dtr_ptr + slot * s_dtr + h * CAP + j, mask=mj, other=0.0)
            cr = done + tl.cumsum(dj, 0)
            done += tl.sum(dj, 0)
            W = tl.where(mj[:, None], tl.exp(A * (total[None, :] - cr[:, None])) * dj[:, None], 0.0)
            CBr = tl.load(cb + i[None, :] * LB + j[:, None], mask=mj[:, None], other=0.0)
            xrT = tl.load(xr_ptr + slot * s_xr + (h * CAP + j[None, :]) * P + p[:, None],
                          mask=mj[None, :] & mp[:, None], other=0.0).to(tl.float32)
            Y += tl.dot(xrT, W * CBr, input_precision=SMALL)
        # drafts k <= i
        Wd = tl.exp(A * (cd[None, :] - cd[:, None])) * dtd[:, None]
        Wd = tl.where((i[:, None] <= i[None, :]) & mi[:, None], Wd, 0.0)
        CBd = tl.load(cb + TB * LB + i[None, :] * TB + i[:, None])
        xdT = tl.load(x_ptr + ((b * T + i[None, :]) * H + h) * P + p[:, None],
                      mask=mi[None, :] & mp[:, None], other=0.0).to(tl.float32)
        Y += tl.dot(xdT, Wd * CBd, input_precision=SMALL)
        if HAS_D:
            Y += tl.load(D_ptr + h).to(tl.float32) * xdT
        mo = mi[None, :] & mp[:, None]
        tl.store(y_ptr + ((b * T + i[None, :]) * H + h) * P + p[:, None], Y, mask=mo)
        pos = c + i
        tl.store(xr_ptr + slot * s_xr + (h * CAP + pos[None, :]) * P + p[:, None],
                 xdT.to(xr_ptr.dtype.element_ty), mask=mo)
        if pt == 0:
            tl.store(dtr_ptr + slot * s_dtr + h * CAP + pos, dtd, mask=mi)
            if h % HPG == 0:
                n = tl.arange(0, N)
                Bd = tl.load(B_ptr + draft[:, None] + n[None, :], mask=mi[:, None], other=0.0)
                tl.store(Br_ptr + slot * s_Br + (g * CAP + pos[:, None]) * N + n[None, :],
                         Bd.to(Br_ptr.dtype.element_ty), mask=mi[:, None])
    wait_prior_grid(PDL)


@triton.jit(do_not_specialize=["seed", "layer"])
def _mamba2_fold_kernel(
    A_ptr, slots_ptr, acc_ptr,
    ck_ptr, ck_rs_ptr, ck_bs_ptr, s_ck, s_ckrs, s_ckbs,
    rd_ptr, rd_rs_ptr, rd_bs_ptr, s_rd, s_rdrs, s_rdbs,
    xr_ptr, dtr_ptr, Br_ptr, s_xr, s_dtr, s_Br,
    cur_ptr, fi_ptr, nan_ptr, seed, layer,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr,
    L: tl.constexpr, CAP: tl.constexpr, LB: tl.constexpr,
    CK_FMT: tl.constexpr, RD_FMT: tl.constexpr, SR: tl.constexpr, BP: tl.constexpr,
):
    """Commit, part 1: rows whose cursor + accepted reaches L fold their first L records
    into the checkpoint (a flush without a current token)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    pt = tl.program_id(2)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        c = tl.load(cur_ptr + slot) + tl.load(acc_ptr + b)
        if c >= L:
            g = h // (H // G)
            p = pt * BP + tl.arange(0, BP)
            mp = p < P
            n = tl.arange(0, N)
            j = tl.arange(0, LB)
            A = tl.load(A_ptr + h).to(tl.float32)
            dtr, after, total, mj = log_decay_suffixes(dtr_ptr + slot * s_dtr + h * CAP, L, 0.0,
                                                       LB)
            w = tl.where(mj, tl.exp(A * after) * dtr, 0.0)
            Br = tl.load(Br_ptr + slot * s_Br + (g * CAP + j[:, None]) * N + n[None, :],
                         mask=mj[:, None], other=0.0).to(tl.float32)
            xr = tl.load(xr_ptr + slot * s_xr + (h * CAP + j[:, None]) * P + p[None, :],
                         mask=mj[:, None] & mp[None, :], other=0.0).to(tl.float32)
            rows = h * P + p
            S = load_rows(ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                          ck_bs_ptr + slot * s_ckbs, rows, n, mp, CK_FMT, BP, N)
            S = tl.exp(A * total) * S + tl.dot(tl.trans(xr * w[:, None]), Br,
                                               input_precision="ieee")
            fi = tl.load(fi_ptr + slot) + 1
            nans = write_state(S, slot, fi, seed, layer, rows, n, mp,
                                ck_ptr + slot * s_ck, ck_rs_ptr + slot * s_ckrs,
                                ck_bs_ptr + slot * s_ckbs,
                                rd_ptr + slot * s_rd, rd_rs_ptr + slot * s_rdrs,
                                rd_bs_ptr + slot * s_rdbs,
                                CK_FMT, RD_FMT, SR, BP, N)
            if nans > 0:
                tl.atomic_add(nan_ptr, nans)


def verify_block(P: int) -> int:
    """Head-dim rows per verify program: 64 or 32, whichever pads P least (64 on a tie);
    Nemotron-3-Nano-4B's 80 rows take 32 (reports/kernels/verify_r21_sweep.log)."""
    return min((64, 32), key=lambda b: (triton.cdiv(P, b) * b, -b))


def mamba2_verify(cache: ReplayCache, x, dt, A, Bm, C, D, slots, *, block_p: int | None = None,
                  num_warps: int = 1, chunk: int = 32, dot_precision: str = "auto",
                  tile_first: bool = True, pdl: bool = False,
                  maxnreg: int | None | object = DEFAULT) -> torch.Tensor:
    """Speculative verify: x (B, T, H, P), dt (B, T, H), Bm/C (B, T, G, N) -> y (B, T, H, P).
    Appends the T drafts after each row's committed records; ``mamba2_commit`` accepts a
    prefix. Needs ring capacity >= cursor + T (allocate with ``spec_tokens >= T``).
    ``block_p`` head-dim rows (>= 16) per program, ``chunk`` d_state columns per product,
    ``dot_precision`` as in ``verify_precision``, ``tile_first`` the grid order
    (``common.row_head_tile``); the defaults measured fastest on the H200 at batch 256
    (reports/kernels/verify_r22_sweep.log; tile-first: Nemotron-3-Super 438 -> 414 us,
    verify_r29_grid_order.log). ``pdl=True`` starts the verify launch while the products'
    launch runs (programmatic dependent launch); off by default: at batch 256 it changed
    nothing beyond run-to-run spread (reports/kernels/tune_r110_pdl_verify.log). ``maxnreg``
    caps the verify programs' registers (``register_cap``; default ``verify_maxnreg_default``,
    None: no cap)."""
    if runs_reference(x):
        return reference_call(cache, lambda st: ref.verify(st, x, dt, A, Bm, C, D, slots))
    Bsz, T, H, P = x.shape
    G, N = Bm.shape[-2:]
    _check_inputs(cache, x[:, 0].contiguous(), dt[:, 0].contiguous(), A, Bm[:, 0].contiguous(),
                  C[:, 0].contiguous(), slots)
    if T > cache.capacity - cache.cfg.L + 1:
        raise ValueError(f"verify of {T} drafts needs spec_tokens >= {T - 1} beyond L; "
                         f"the cache has capacity {cache.capacity} for L={cache.cfg.L}")
    for name, t in (("x", x), ("dt", dt), ("Bm", Bm), ("C", C)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    block_p = block_p or verify_block(P)
    if block_p < 16:
        raise ValueError(f"block_p must be >= 16, got {block_p}")
    src = cache.read if cache.read is not None else cache.ckpt
    act = {C.dtype, Bm.dtype, cache.ring["B"].dtype}
    KC = verify_chunk(N, chunk)
    prec = verify_precision(dot_precision, act.pop() if len(act) == 1 else torch.float32)
    cap = register_cap(verify_maxnreg_default(Bsz) if maxnreg is DEFAULT else maxnreg)
    y = torch.empty(Bsz, T, H, P, device=x.device, dtype=torch.float32)
    xr, dtr, Br = cache.ring["x"], cache.ring["dt"], cache.ring["B"]
    BP = min(block_p, max(16, triton.next_power_of_2(P)))
    TB, LB = max(16, triton.next_power_of_2(T)), max(16, triton.next_power_of_2(cache.capacity))
    cb = torch.empty(Bsz, G, TB * LB + TB * TB, device=x.device, dtype=torch.float32)
    use_pdl = bool(pdl) and resolve_pdl(pdl, x.device)
    _mamba2_verify_prep_kernel[(Bsz, G)](Bm, C, slots, Br, slot_stride(Br), cache.cursor, cb,
                                         T=T, TB=TB, G=G, N=N, CAP=cache.capacity, LB=LB, KC=KC,
                                         PREC=prec, PDL=use_pdl, num_warps=1)
    _mamba2_verify_kernel[step_grid(Bsz, H, triton.cdiv(P, BP), tile_first)](
        x, dt, A, Bm, C, D if D is not None else A, slots, y, *state_args(src, slots),
        xr, dtr, Br, slot_stride(xr), slot_stride(dtr), slot_stride(Br), cache.cursor, cb,
        T=T, TB=TB, H=H, P=P, N=N, G=G, CAP=cache.capacity, LB=LB,
        SRC_FMT=fmt_code(src), HAS_D=D is not None, BP=BP, KC=KC, PREC=prec,
        SMALL="tf32x3" if prec == "bf16x3" else prec, TERMS=split_terms(fmt_code(src)),
        TILE_FIRST=tile_first, PDL=use_pdl, launch_pdl=use_pdl, num_warps=num_warps, **cap)
    return y


def mamba2_commit(cache: ReplayCache, accepted: torch.Tensor, A, slots, *,
                  block_p: int = 16, num_warps: int = 4) -> None:
    """Accept ``accepted (B,)`` int32 drafts per row; rows reaching L records fold the first
    L into the checkpoint (flush numerics and SR key), the rest move to the ring's start."""
    if accepted.dtype != torch.int32:
        raise ValueError("accepted must be int32")
    if runs_reference(accepted):
        reference_call(cache, lambda st: ref.commit(st, accepted, slots, A))
        return
    H, P = cache.ckpt.data.shape[1:3]
    G, N = cache.ring["B"].shape[1], cache.ring["B"].shape[-1]
    cfg = cache.cfg
    xr, dtr, Br = cache.ring["x"], cache.ring["dt"], cache.ring["B"]
    BP = min(block_p, triton.next_power_of_2(P))
    _mamba2_fold_kernel[(slots.shape[0], H, triton.cdiv(P, BP))](
        A, slots, accepted, *state_args(cache.ckpt, slots), *state_args(cache.read, slots),
        xr, dtr, Br, slot_stride(xr), slot_stride(dtr), slot_stride(Br),
        cache.cursor, cache.flush_index, cache.nan_count, cache.seed, cache.layer,
        H=H, P=P, N=N, G=G, L=cfg.L, CAP=cache.capacity,
        LB=max(16, triton.next_power_of_2(cache.capacity)), CK_FMT=fmt_code(cache.ckpt),
        RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr, BP=BP, num_warps=num_warps)
    shift_and_commit(cache, accepted, slots)
