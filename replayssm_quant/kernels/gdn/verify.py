"""Speculative decoding for GDN: the verify of T draft tokens after each row's committed ring
records and the commit that accepts a prefix, folding full windows into the checkpoint.
Reference: ``ssm.gdn.verify`` / ``ssm.gdn.commit``; test: ``tests/test_kernels_spec.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...ssm import gdn as ref
from ..core.cache import ReplayCache, reference_call, runs_reference, slot_stride
from ..core.memory import register_cap, release_dependents, row_head_tile, step_grid, wait_prior_grid
from ..core.ring import fmt_code, shift_and_commit, state_args
from ..core.state_io import load_cols, load_rows, row_scales, split_dot, write_state
from ..core.sums import log_decay_suffixes, unit_lower_inverse
from ..core.target import Target, on_tensor_device
from ..knobs import DEFAULT, resolve_pdl, split_terms, verify_chunk, verify_precision
from ..tuning import table_for
from ..tuning.rules import verify_maxnreg_default
from .flush import _recompute_u
from .launch import ring_args

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


@on_tensor_device
def gdn_verify(cache: ReplayCache, q, k, v, g, beta, slots, *, block_v: int = 128,
               num_warps: int = 2, chunk: int = 32, dot_precision: str = "auto",
               tile_first: bool = False, pdl: bool = False,
               maxnreg: int | None | object = DEFAULT) -> torch.Tensor:
    """Speculative verify: q, k (B, T, Hk, K), v (B, T, Hv, V), g, beta (B, T, Hv) ->
    o (B, T, Hv, V); appends the drafts after each row's committed records.
    ``block_v`` value rows (>= 16) per program, ``chunk`` key columns per product,
    ``dot_precision`` as in ``knobs.verify_precision``, ``tile_first`` the grid order
    (``core.memory.row_head_tile``); the defaults measured fastest on the H200 at batch 256
    (tile-first gained nothing for GDN). ``pdl`` as in ``mamba2_verify`` (off by default); ``maxnreg``
    caps the verify programs' registers (default ``tuning.rules.verify_maxnreg_default``; None: no
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
    table = table_for(Target.of(q.device))
    src = cache.read if cache.read is not None else cache.ckpt
    act = {q.dtype, k.dtype, cache.ring["k"].dtype}
    KC = verify_chunk(K, chunk)
    prec = verify_precision(dot_precision, act.pop() if len(act) == 1 else torch.float32,
                            table=table)
    cap = register_cap(verify_maxnreg_default(Bsz, table=table) if maxnreg is DEFAULT
                       else maxnreg)
    o = torch.empty(Bsz, T, HV, V, device=q.device, dtype=torch.float32)
    BV = min(block_v, max(16, triton.next_power_of_2(V)))
    TB2, LB = max(16, triton.next_power_of_2(2 * T)), max(16, triton.next_power_of_2(cache.capacity))
    kd = torch.empty(Bsz, HK, TB2 * LB + TB2 * TB2, device=q.device, dtype=torch.float32)
    kr = cache.ring["k"]
    use_pdl = bool(pdl) and resolve_pdl(pdl, q.device, table=table)
    _gdn_verify_prep_kernel[(Bsz, HK)](q, k, slots, kr, slot_stride(kr), cache.cursor, kd,
                                       T=T, TB2=TB2, HK=HK, K=K, CAP=cache.capacity, LB=LB, KC=KC,
                                       PREC=prec, PDL=use_pdl, num_warps=1)
    _gdn_verify_kernel[step_grid(Bsz, HV, triton.cdiv(V, BV), tile_first)](
        q, k, v, g, beta, slots, o, *state_args(src, slots), *ring_args(cache), cache.cursor,
        kd, T=T, TB2=TB2, HV=HV, HK=HK, V=V, K=K, CAP=cache.capacity, LB=LB,
        SRC_FMT=fmt_code(src), RECOMPUTE=cache.cfg.recompute_u, BV=BV, KC=KC,
        LOG_TB2=TB2.bit_length() - 1, PREC=prec, SMALL="tf32x3" if prec == "bf16x3" else prec,
        TERMS=split_terms(fmt_code(src)), TILE_FIRST=tile_first, PDL=use_pdl, launch_pdl=use_pdl,
        num_warps=num_warps, **cap)
    return o


@on_tensor_device
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
        *ring_args(cache), cache.cursor, cache.flush_index, cache.nan_count, cache.seed,
        cache.layer, HV=HV, HK=HK, V=V, K=K, L=cfg.L, CAP=cache.capacity,
        LB=max(16, triton.next_power_of_2(cache.capacity)), CK_FMT=fmt_code(cache.ckpt),
        RD_FMT=fmt_code(cache.read), SR=cfg.uses_sr, RECOMPUTE=cfg.recompute_u, BV=BV,
        num_warps=num_warps)
    shift_and_commit(cache, accepted, slots)
