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

This module holds the conventional, ring-products and non-flush kernels (the flush is in
``flush.py``, the launcher in ``launch.py``). Reference: ``ssm.mamba2.conventional_step`` /
``nonflush_step`` / ``decode_step``; test: ``tests/test_kernels_decode.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.codes import pow2_prescale_of
from ..core.memory import release_dependents, row_head_tile, tile_rows, wait_prior_grid
from ..core.products import mma_vector_pieces, nvfp4_mma_rows_dot, rows_dot
from ..core.ring import finish_row, flush_list
from ..core.rounding import sr_words_for
from ..core.state_io import load_rows, store_rows
from ..core.sums import ring_records
from .flush import _mamba2_flush_rows, _ring_weights


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
    # batch 256 / 512; an fp8 source's took 104 instead of 95 and ran 6.6-7.7% slower.
    # Nemotron-3-Nano-4B's whole-head passes (64 + 16 rows) keep it: without it 88 registers
    # instead of 96, and 0.9-3.0% slower at batch 231-512
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
