"""``gdn_decode_step``: one GDN decode step for a batch of rows. It resolves the step's plan
(``plan.gdn_step_plan``) and launches exactly that; tensors off CUDA run the reference
``ssm.gdn.decode_step``. Test: ``tests/test_kernels_decode.py``, ``tests/test_kernels_dispatch.py``.
"""

from __future__ import annotations

import torch
import triton

from ...ssm import gdn as ref
from ..core.cache import ReplayCache, reference_call, runs_reference, slot_stride
from ..core.codes import lut_table
from ..core.memory import register_cap, state_descriptor
from ..core.persistent import launch_persistent
from ..core.ring import advance_cursor, fmt_code, state_args
from ..core.target import on_tensor_device
from ..knobs import StepKnobs
from ..plan import gdn_step_plan, note_plan
from .flush import _gdn_flush_kernel
from .step import _gdn_conv_kernel, _gdn_nonflush_kernel, _gdn_prep_kernel


def check_inputs(cache: ReplayCache, q, k, v, g, beta, slots):
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


def ring_args(cache: ReplayCache):
    r = cache.ring
    vr = r["v"] if "v" in r else r["u"]
    br = r["beta"] if "beta" in r else r["g"]
    return (r["k"], r["u"], r["g"], vr, br, slot_stride(r["k"]), slot_stride(r["u"]),
            slot_stride(r["g"]), slot_stride(vr), slot_stride(br))


@on_tensor_device
def gdn_decode_step(cache: ReplayCache, q, k, v, g, beta, slots, *, advance: bool = True,
                    out: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """One GDN decode step: q, k (B, Hk, K) normalised (q scaled), v (B, Hv, V), g (B, Hv)
    log-decay, beta (B, Hv), slots (B,) int32. Returns o (B, Hv, V) fp32. The launch knobs
    are keyword arguments, gathered once into ``knobs.GdnKnobs`` (``StepKnobs.of``) and
    resolved and checked by ``gdn_step_plan``. ReplaySSM configs
    run three launches like Mamba-2's (ring products + flush list, non-flush rows,
    persistent flush over the flushing rows' tiles, which also advances the cursors unless
    ``fuse_advance=False``; ``fuse_prep``, ``maxnreg`` (default
    ``gdn_nonflush_maxnreg_default``), ``flush_maxnreg`` (default
    ``gdn_flush_maxnreg_default``; None: no cap), ``one_launch``,
    ``pdl``, ``early_loads``, ``prep_groups`` (key heads per ring-products program),
    ``fp8_decode`` (default ``gdn_fp8_decode_default``), ``nvfp4_decode``
    (``gdn_nvfp4_decode_of``) and ``flush_tma`` as for Mamba-2,
    except that ``early_loads`` is off by default: at batch 1 it added 1.1-3.2 us to the
    NVFP4 / fp8 flush steps for 0.2-0.4 us off the non-flush ones, and with every state
    from HBM it slowed the fp8-read/fp32 window 5.5 -> 6.2 us on Qwen3.5-4B;
    the UT-transform flush, ``flush_fold="dot"`` with a read copy, needs its own launch and
    is never one launch)."""
    step_knobs = StepKnobs.of("gdn", advance=advance, **knobs)
    if runs_reference(q):
        return reference_call(cache, lambda st: ref.decode_step(st, q, k, v, g, beta, slots),
                              advance=advance, out=out)
    HV, HK, V, K = check_inputs(cache, q, k, v, g, beta, slots)
    cfg = cache.cfg
    plan = gdn_step_plan(cfg, cache.capacity, HV, HK, V, K, q.shape[0], q.device, step_knobs,
                         # a conventional cache may hold no ring (the vLLM plugin's pages)
                         ring_dtype=cache.ring["k"].dtype if "k" in cache.ring else k.dtype,
                         ckpt_data=cache.ckpt.data)
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
    ring = ring_args(cache)
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
