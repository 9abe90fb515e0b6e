"""The persistent flush of a Mamba-2 ReplaySSM step: resident programs walk the flushing rows'
tiles from the device-built flush list, fold each row's L ring records into its checkpoint and
write the checkpoint (and read copy) back. Also the flush-row body that a one-launch step runs on
its own tiles. Reference: ``ssm.mamba2.flush``; test: ``tests/test_kernels_decode.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..core.memory import wait_prior_grid
from ..core.ring import advance_rows
from ..core.state_io import count_nans, load_rows, split_dot, write_state
from ..core.sums import log_decay_suffixes


@triton.jit
def _ring_weights(dtr_ptr, slot, s_dtr, h, c, dt, A, CAP: tl.constexpr, LB: tl.constexpr,
                  ECAP: tl.constexpr = 0):
    """Per buffered record j < c: exp(A * sum of dt after j up to now) * dt_j, and the total
    dt since the checkpoint (including this token). ECAP as ``log_decay_suffixes``'s CAP."""
    dtr, after, total, mj = log_decay_suffixes(dtr_ptr + slot * s_dtr + h * CAP, c, dt, LB,
                                               ECAP)
    w = tl.where(mj, tl.exp(A * after) * dtr, 0.0)
    return w, total, mj


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
