"""``mamba2_decode_step``: one Mamba-2 decode step for a batch of rows. It resolves the step's
plan (``plan.mamba2_step_plan``) and launches exactly that; tensors off CUDA run the reference
``ssm.mamba2.decode_step``. Test: ``tests/test_kernels_decode.py``, ``tests/test_kernels_dispatch.py``.
"""

from __future__ import annotations

import torch
import triton

from ...ssm import mamba2 as ref
from ..core.cache import ReplayCache, reference_call, runs_reference, slot_stride
from ..core.codes import lut_table
from ..core.memory import register_cap, state_descriptor
from ..core.persistent import launch_persistent
from ..core.ring import advance_cursor, fmt_code, state_args
from ..core.target import on_tensor_device
from ..knobs import StepKnobs
from ..plan import mamba2_step_plan, note_plan
from .flush import _mamba2_flush_kernel
from .step import _mamba2_conv_kernel, _mamba2_nonflush_kernel, _mamba2_prep_kernel


def check_inputs(cache: ReplayCache, x, dt, A, Bm, C, slots):
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


@on_tensor_device
def mamba2_decode_step(cache: ReplayCache, x, dt, A, Bm, C, D, slots, *, advance: bool = True,
                       out: torch.Tensor | None = None, **knobs) -> torch.Tensor:
    """One decode step for a batch of rows (CUDA).

    x (B, H, P), dt (B, H) fp32 post-softplus, A (H,), Bm/C (B, G, N), D (H,) or None,
    slots (B,) int32 cache slots (< 0: padding row, skipped). Returns y (B, H, P) fp32.
    The launch knobs below are keyword arguments, gathered once into ``knobs.Mamba2Knobs``
    (``StepKnobs.of``, which refuses an unknown name); ``mamba2_step_plan`` resolves and checks
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
    it applies, ``core.memory.resolve_flush_tma``).
    """
    step_knobs = StepKnobs.of("mamba2", advance=advance, **knobs)
    if runs_reference(x):
        return reference_call(cache, lambda st: ref.decode_step(st, x, dt, A, Bm, C, D, slots),
                              advance=advance, out=out)
    H, P, N, G = check_inputs(cache, x, dt, A, Bm, C, slots)
    cfg = cache.cfg
    # a conventional cache may hold no ring (the vLLM plugin's pages)
    ring_dtype = cache.ring["B"].dtype if "B" in cache.ring else Bm.dtype
    plan = mamba2_step_plan(cfg, cache.capacity, H, P, N, G, x.shape[0], x.device, step_knobs,
                            ring_dtype=ring_dtype, ckpt_data=cache.ckpt.data)
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
