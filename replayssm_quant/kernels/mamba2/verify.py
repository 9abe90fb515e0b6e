"""Speculative decoding for Mamba-2: the verify of T draft tokens after each row's committed ring
records (one products launch, one verify launch on tensor cores), and the commit that accepts a
prefix, folding full windows into the checkpoint. Reference: ``ssm.mamba2.verify`` /
``ssm.mamba2.commit``; test: ``tests/test_kernels_spec.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...ssm import mamba2 as ref
from ..core.cache import ReplayCache, reference_call, runs_reference, slot_stride
from ..core.memory import register_cap, release_dependents, row_head_tile, step_grid, wait_prior_grid
from ..core.ring import fmt_code, shift_and_commit, state_args
from ..core.state_io import load_cols, load_rows, row_scales, split_dot, write_state
from ..core.sums import log_decay_suffixes
from ..core.target import Target, on_tensor_device
from ..knobs import DEFAULT, resolve_pdl, split_terms, verify_chunk, verify_precision
from ..tuning import table_for
from ..tuning.mamba2_rules import verify_block
from ..tuning.rules import verify_maxnreg_default
from .launch import check_inputs


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


@on_tensor_device
def mamba2_verify(cache: ReplayCache, x, dt, A, Bm, C, D, slots, *, block_p: int | None = None,
                  num_warps: int = 1, chunk: int = 32, dot_precision: str = "auto",
                  tile_first: bool = True, pdl: bool = False,
                  maxnreg: int | None | object = DEFAULT) -> torch.Tensor:
    """Speculative verify: x (B, T, H, P), dt (B, T, H), Bm/C (B, T, G, N) -> y (B, T, H, P).
    Appends the T drafts after each row's committed records; ``mamba2_commit`` accepts a
    prefix. Needs ring capacity >= cursor + T (allocate with ``spec_tokens >= T``).
    ``block_p`` head-dim rows (>= 16) per program, ``chunk`` d_state columns per product,
    ``dot_precision`` as in ``verify_precision``, ``tile_first`` the grid order
    (``core.memory.row_head_tile``); the defaults measured fastest on the H200 at batch 256
    (tile-first: Nemotron-3-Super 438 -> 414 us). ``pdl=True`` starts the verify launch while the products'
    launch runs (programmatic dependent launch); off by default: at batch 256 it changed
    nothing beyond run-to-run spread. ``maxnreg``
    caps the verify programs' registers (``register_cap``; default ``verify_maxnreg_default``,
    None: no cap)."""
    if runs_reference(x):
        return reference_call(cache, lambda st: ref.verify(st, x, dt, A, Bm, C, D, slots))
    Bsz, T, H, P = x.shape
    G, N = Bm.shape[-2:]
    check_inputs(cache, x[:, 0].contiguous(), dt[:, 0].contiguous(), A, Bm[:, 0].contiguous(),
                  C[:, 0].contiguous(), slots)
    if T > cache.capacity - cache.cfg.L + 1:
        raise ValueError(f"verify of {T} drafts needs spec_tokens >= {T - 1} beyond L; "
                         f"the cache has capacity {cache.capacity} for L={cache.cfg.L}")
    for name, t in (("x", x), ("dt", dt), ("Bm", Bm), ("C", C)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    table = table_for(Target.of(x.device))
    block_p = block_p or verify_block(P, table=table)
    if block_p < 16:
        raise ValueError(f"block_p must be >= 16, got {block_p}")
    src = cache.read if cache.read is not None else cache.ckpt
    act = {C.dtype, Bm.dtype, cache.ring["B"].dtype}
    KC = verify_chunk(N, chunk)
    prec = verify_precision(dot_precision, act.pop() if len(act) == 1 else torch.float32,
                            table=table)
    cap = register_cap(verify_maxnreg_default(Bsz, table=table) if maxnreg is DEFAULT
                       else maxnreg)
    y = torch.empty(Bsz, T, H, P, device=x.device, dtype=torch.float32)
    xr, dtr, Br = cache.ring["x"], cache.ring["dt"], cache.ring["B"]
    BP = min(block_p, max(16, triton.next_power_of_2(P)))
    TB, LB = max(16, triton.next_power_of_2(T)), max(16, triton.next_power_of_2(cache.capacity))
    cb = torch.empty(Bsz, G, TB * LB + TB * TB, device=x.device, dtype=torch.float32)
    use_pdl = bool(pdl) and resolve_pdl(pdl, x.device, table=table)
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


@on_tensor_device
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
