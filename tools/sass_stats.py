"""Compile one of this project's Triton kernels for an NVIDIA GPU on any machine (no GPU needed:
Triton ships ptxas and cuobjdump) and summarise its SASS: registers, local-memory (spill)
instructions, barriers and instructions, for the whole kernel and for its main loop.

    python tools/sass_stats.py emulate-gdn-window --preset nvfp4-read/fp16-sr --block 32 --warps 8
    python tools/sass_stats.py emulate-gdn-conv --preset bf16-sr --block 4 --warps 1
    python tools/sass_stats.py emulate-gdn-prep --preset replay-fp32 --block 16 --warps 4
    python tools/sass_stats.py gdn-verify --preset replay-fp32 --block 32 --warps 4 --by-line 12
    python tools/sass_stats.py gdn-verify --preset replay-fp32 --block 32 --warps 4 --json
    python tools/sass_stats.py mamba2-flush --preset replay-fp32 --block 32 --warps 4
    python tools/sass_stats.py mamba2-nonflush --preset nvfp4-read/fp32 --block 64 --warps 4
    python tools/sass_stats.py gdn-nonflush --preset nvfp4-read/fp16-sr --block 64 --warps 1
    python tools/sass_stats.py gdn-flush --preset replay-fp32 --block 32 --warps 4 --fold records
    python tools/sass_stats.py gdn-conv --preset fp32 --block 32 --warps 8
    python tools/sass_stats.py mamba2-flush --preset nvfp4-read/fp16-sr --block 16 --warps 2 \
        --fold records --maxnreg 168 --budget   # instructions per element vs 85% of copy

Shapes are Qwen3.5-4B's GDN layer (32 value heads, 16 key heads, d_k = d_v = 128) and
Nemotron-3-Super's Mamba-2 layer (128 heads, head_dim 64, d_state 128, 8 groups). The counts
come from the running Python's Triton; to count what the GPU machine compiles, run the tool
with that machine's Triton version (the H200 has 3.6.0), e.g. from a separate environment:

    python -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 torch numpy
    /tmp/t36/bin/python tools/sass_stats.py mamba2-flush --preset replay-fp32 --block 32

Arguments are specialized the way a launch specializes them (``launch_attrs``). The counts
explain timings (in a latency-bound loop, barriers and spills are what cost); they are not
timings.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the GPU machine's Triton default

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replayssm_quant.kernels import knobs  # noqa: E402
from replayssm_quant.kernels.core.emulation import window_sizes  # noqa: E402
from replayssm_quant.kernels.core.persistent import programs_per_sm  # noqa: E402
from replayssm_quant.kernels.core.rounding import FMT_CODES, FMT_NONE  # noqa: E402
from replayssm_quant.kernels.gdn import emulate as gdn_emulate  # noqa: E402
from replayssm_quant.kernels.gdn import flush as gdn_flush  # noqa: E402
from replayssm_quant.kernels.gdn import step as gdn_step  # noqa: E402
from replayssm_quant.kernels.gdn import verify as gdn_verify  # noqa: E402
from replayssm_quant.kernels.mamba2 import flush as mamba2_flush  # noqa: E402
from replayssm_quant.kernels.mamba2 import step as mamba2_step  # noqa: E402
from replayssm_quant.kernels.mamba2 import verify as mamba2_verify  # noqa: E402
from replayssm_quant.kernels.tuning import gdn_rules, mamba2_rules, rules  # noqa: E402
from replayssm_quant.precision import PRESETS, SHAPES, step_bytes  # noqa: E402

HV, HK, V, K = 32, 16, 128, 128

# The H200 as it ran the decode sweeps: 132 SMs at 1980 MHz under load (reports/kernels/
# probe_r84_smi.csv), each SM's four schedulers issuing one warp-instruction per cycle, and a
# device-to-device copy at 4.25 TB/s read + write (reports/kernels/README.md).
H200_THREAD_ISSUE = 132 * 4 * 1.98e9 * 32  # thread-instructions per second
H200_COPY = 4.25e12  # bytes per second
# Decode-step targets whose tiles are (rows, 128) state elements: the shape the target compiles
# for and the part of a step whose counted bytes (a ``step_bytes`` field) the kernel moves.
BUDGET_PARTS = {
    "mamba2-flush": ("nemotron-3-super-120b", "flush"),
    "mamba2-nonflush": ("nemotron-3-super-120b", "nonflush"),
    "mamba2-conv": ("nemotron-3-super-120b", "window_average"),
    "gdn-flush": ("qwen3.5-4b", "flush"),
    "gdn-nonflush": ("qwen3.5-4b", "nonflush"),
    "gdn-conv": ("qwen3.5-4b", "window_average"),
}
_PART_NAMES = {"flush": "flush step", "nonflush": "non-flush step",
               "window_average": "conventional step"}
_ADDR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/")


def _fmt(f) -> int:
    return FMT_NONE if f is None else FMT_CODES[f.name]


def _sig(names: str, types: dict[str, str], default: str) -> dict[str, str]:
    return {n: types.get(n, default) for n in names.split()}


def _step_state_sig(ck: int, rd: int) -> dict[str, str]:
    """The checkpoint / read-copy / counter arguments a non-flush step kernel takes for its
    one-launch flush (``ONE_LAUNCH``)."""
    data = {FMT_CODES["fp16"]: "*fp16", FMT_CODES["bf16"]: "*bf16",
            FMT_CODES["fp8e4m3"]: "*fp8e4nv", FMT_CODES["nvfp4"]: "*u8"}
    sig = {"ck_ptr": data.get(ck, "*fp32"), "ck_rs_ptr": "*fp32", "ck_bs_ptr": "*fp8e4nv",
           "s_ck": "i64", "s_ckrs": "i64", "s_ckbs": "i64",
           "rd_ptr": data.get(rd, "*fp32"), "rd_rs_ptr": "*fp32", "rd_bs_ptr": "*fp8e4nv",
           "s_rd": "i64", "s_rdrs": "i64", "s_rdbs": "i64"}
    sig.update(nan_ptr="*i32", seed="i32", layer="i32", ticket_ptr="*i32")
    return sig


def _flush_descriptor(sig: dict, consts: dict, cfg, tma: bool, rows: int, d: int) -> None:
    """A flush target's checkpoint descriptor argument: a (1, rows, d) fp32 tensor
    descriptor with TMA, else the checkpoint pointer as the launch passes it."""
    if tma:
        if cfg.ckpt.name != "fp32" or cfg.read is not None:
            raise SystemExit("--tma moves an fp32 checkpoint without a read copy")
        sig["ck_desc"] = f"tensordesc<fp32[1,{rows},{d}]>"
    else:  # unused without TMA: the launch passes the checkpoint pointer
        sig["ck_desc"] = sig["ck_ptr"]
    consts["TMA"] = tma


def _verify_precision(precision: str, src_fmt: int) -> dict:
    """The verify kernel's product constexprs, as ``mamba2_verify`` / ``gdn_verify`` pass them."""
    return dict(PREC=precision, SMALL="tf32x3" if precision == "bf16x3" else precision,
                TERMS=knobs.split_terms(src_fmt), TILE_FIRST=False)


def target(name: str, preset: str, block: int, T: int = 8, chunk: int = 32,
           fold: str = "dot", precision: str | None = None, one_launch: bool = False,
           nvfp4_decode: str = "e4m3", pdl: bool = False, tma: bool = False,
           fp8_decode: str = "cvt") -> tuple:
    """(kernel, signature, constexprs) of a named target for one preset. ``precision``: the
    verify products' dot_precision (default bf16x3) or the flush fold's (default ieee).
    ``one_launch``: the non-flush / conventional step as one launch per step (flushing rows
    flush in the step, the last program advances the cursors). ``nvfp4_decode``: how a
    mamba2-nonflush step decodes an NVFP4 source (``mamba2.NVFP4_DECODES``), ``fp8_decode``
    how a non-flush step decodes an fp8 one (``mamba2.FP8_DECODES``). ``pdl``: the
    decode steps' and verifies' launches as programmatic dependent launches (their
    ``griddepcontrol`` waits and releases). ``tma``: a flush target's fp32 checkpoint moved
    through a tensor descriptor (``flush_tma``, the GPU default for that checkpoint)."""
    one = dict(ONE_LAUNCH=one_launch, ADVANCE=one_launch, CK_FMT=_fmt(PRESETS[preset].ckpt),
               RD_FMT=_fmt(PRESETS[preset].read), SR=PRESETS[preset].uses_sr)
    cfg = PRESETS[preset]
    fold_prec = precision or "ieee"
    precision = precision or "bf16x3"
    ck, rd, sr = _fmt(cfg.ckpt), _fmt(cfg.read), cfg.uses_sr
    act = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "seq_ptr": "*i64"}
    if name == "emulate-gdn-conv":
        if cfg.L != 1:
            raise SystemExit(f"{preset} is windowed (L={cfg.L}); emulate-gdn-conv needs L = 1")
        sig = _sig("q_ptr k_ptr v_ptr g_ptr beta_ptr s0_ptr seq_ptr o_ptr sf_ptr", act, "*fp32")
        sig.update(T="i32", seed="i32", layer="i32")
        consts = dict(HV=HV, HK=HK, V=V, K=K, BV=block, CK=ck, SR=sr)
        return gdn_emulate._gdn_conv_kernel, sig, consts
    if name == "emulate-gdn-window":
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; emulate-gdn-window needs L > 1")
        LB, _ = window_sizes(cfg.L)
        sig = _sig("q_ptr k_ptr v_ptr beta_ptr pre_ptr s0_ptr seq_ptr o_ptr sf_ptr", act, "*fp32")
        sig.update(T="i32", seed="i32", layer="i32", w0="i32", nfull="i32")
        consts = dict(HV=HV, HK=HK, V=V, K=K, L=cfg.L, LB=LB, BV=block, CK=ck, RD=rd, SR=sr,
                      FIRST=True, TAIL=True, PREFETCH=False, MERGE=gdn_emulate._MERGE_RQ)
        return gdn_emulate._gdn_window_kernel, sig, consts
    if name == "emulate-gdn-prep":
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; emulate-gdn-prep needs L > 1")
        LB, LOG_LB = window_sizes(cfg.L)
        sig = _sig("q_ptr k_ptr g_ptr beta_ptr pre_ptr", act, "*fp32")
        sig.update(T="i32", w0="i32")
        consts = dict(HV=HV, HK=HK, K=K, L=cfg.L, LB=LB, LOG_LB=LOG_LB)
        return gdn_emulate._gdn_window_prep_kernel, sig, consts
    if name == "gdn-verify":
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; gdn-verify needs a ReplaySSM preset")
        cap = cfg.L + T - 1
        types = dict(act, slots_ptr="*i32", cur_ptr="*i32", kr_ptr="*bf16",
                     src_ptr="*u8" if rd == FMT_CODES["nvfp4"] else "*fp32")
        sig = _sig("q_ptr k_ptr v_ptr g_ptr beta_ptr slots_ptr o_ptr src_ptr src_rs_ptr "
                   "src_bs_ptr", types, "*fp32")
        sig.update(s_src="i64", s_srcrs="i64", s_srcbs="i64")
        sig.update(_sig("kr_ptr ur_ptr gr_ptr vr_ptr br_ptr", types, "*fp32"))
        sig.update(s_kr="i64", s_ur="i64", s_gr="i64", s_vr="i64", s_br="i64")
        sig.update(_sig("cur_ptr kd_ptr", types, "*fp32"))
        tb2 = max(16, triton.next_power_of_2(2 * T))
        consts = dict(T=T, TB2=tb2, HV=HV, HK=HK, V=V, K=K,
                      CAP=cap, LB=max(16, triton.next_power_of_2(cap)),
                      SRC_FMT=rd if rd != FMT_NONE else ck, RECOMPUTE=cfg.recompute_u, BV=block,
                      KC=knobs.verify_chunk(K, chunk), LOG_TB2=tb2.bit_length() - 1,
                      PDL=pdl, **_verify_precision(precision, rd if rd != FMT_NONE else ck))
        return gdn_verify._gdn_verify_kernel, sig, consts
    if name == "gdn-verify-prep":  # Qwen3.5-4B's GDN layer: the drafts' key / query products
        cap = max(cfg.L, 2) + T - 1
        types = dict(act, slots_ptr="*i32", cur_ptr="*i32", kr_ptr="*bf16")
        sig = _sig("q_ptr k_ptr slots_ptr kr_ptr", types, "*fp32")
        sig.update(s_kr="i64", **_sig("cur_ptr kd_ptr", types, "*fp32"))
        consts = dict(T=T, TB2=max(16, triton.next_power_of_2(2 * T)), HK=16, K=128, CAP=cap,
                      LB=max(16, triton.next_power_of_2(cap)), KC=knobs.verify_chunk(128, chunk),
                      PREC=precision, PDL=pdl)
        return gdn_verify._gdn_verify_prep_kernel, sig, consts
    if name == "mamba2-verify-prep":  # Nemotron-3-Super's Mamba-2 layer: the drafts' C . B
        cap = max(cfg.L, 2) + T - 1
        types = {"B_ptr": "*bf16", "C_ptr": "*bf16", "slots_ptr": "*i32", "cur_ptr": "*i32",
                 "Br_ptr": "*bf16"}
        sig = _sig("B_ptr C_ptr slots_ptr Br_ptr", types, "*fp32")
        sig.update(s_Br="i64", **_sig("cur_ptr cb_ptr", types, "*fp32"))
        consts = dict(T=T, TB=max(16, triton.next_power_of_2(T)), G=8, N=128, CAP=cap,
                      LB=max(16, triton.next_power_of_2(cap)), KC=knobs.verify_chunk(128, chunk),
                      PREC=precision, PDL=pdl)
        return mamba2_verify._mamba2_verify_prep_kernel, sig, consts
    if name == "mamba2-verify":  # Nemotron-3-Super's Mamba-2 layer
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; mamba2-verify needs a ReplaySSM preset")
        H, P, N, G = 128, 64, 128, 8
        cap = cfg.L + T - 1
        types = {"x_ptr": "*bf16", "B_ptr": "*bf16", "C_ptr": "*bf16", "slots_ptr": "*i32",
                 "cur_ptr": "*i32", "xr_ptr": "*bf16", "Br_ptr": "*bf16",
                 "src_ptr": "*u8" if rd == FMT_CODES["nvfp4"] else "*fp32"}
        sig = _sig("x_ptr dt_ptr A_ptr B_ptr C_ptr D_ptr slots_ptr y_ptr src_ptr src_rs_ptr "
                   "src_bs_ptr", types, "*fp32")
        sig.update(s_src="i64", s_srcrs="i64", s_srcbs="i64")
        sig.update(_sig("xr_ptr dtr_ptr Br_ptr", types, "*fp32"))
        sig.update(s_xr="i64", s_dtr="i64", s_Br="i64")
        sig.update(_sig("cur_ptr cb_ptr", types, "*fp32"))
        consts = dict(T=T, TB=max(16, triton.next_power_of_2(T)), H=H, P=P, N=N, G=G, CAP=cap,
                      LB=max(16, triton.next_power_of_2(cap)),
                      SRC_FMT=rd if rd != FMT_NONE else ck, HAS_D=True, BP=block,
                      KC=knobs.verify_chunk(N, chunk), PDL=pdl,
                      **_verify_precision(precision, rd if rd != FMT_NONE else ck))
        return mamba2_verify._mamba2_verify_kernel, sig, consts
    if name == "mamba2-flush":  # Nemotron-3-Super's Mamba-2 layer, decode flush at L
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; mamba2-flush needs a ReplaySSM preset")
        H, P, N, G = 128, 64, 128, 8
        data = {FMT_CODES["fp16"]: "*fp16", FMT_CODES["bf16"]: "*bf16",
                FMT_CODES["fp8e4m3"]: "*fp8e4nv", FMT_CODES["nvfp4"]: "*u8"}
        types = {"slots_ptr": "*i32", "list_ptr": "*i32", "fi_ptr": "*i32", "nan_ptr": "*i32",
                 "xr_ptr": "*bf16", "Br_ptr": "*bf16", "B_ptr": "*bf16", "C_ptr": "*bf16",
                 "x_ptr": "*bf16", "ck_ptr": data.get(ck, "*fp32"),
                 "rd_ptr": data.get(rd, "*fp32"), "ck_bs_ptr": "*fp8e4nv", "rd_bs_ptr": "*fp8e4nv"}
        sig = _sig("x_ptr dt_ptr A_ptr B_ptr C_ptr D_ptr slots_ptr y_ptr ck_ptr ck_rs_ptr "
                   "ck_bs_ptr", types, "*fp32")
        sig.update(s_ck="i64", s_ckrs="i64", s_ckbs="i64")
        sig.update(_sig("rd_ptr rd_rs_ptr rd_bs_ptr", types, "*fp32"))
        sig.update(s_rd="i64", s_rdrs="i64", s_rdbs="i64")
        sig.update(_sig("xr_ptr dtr_ptr Br_ptr", types, "*fp32"))
        sig.update(s_xr="i64", s_dtr="i64", s_Br="i64")
        types["cur_ptr"] = "*i32"
        sig.update(_sig("list_ptr cur_ptr fi_ptr nan_ptr", types, "*fp32"))
        sig.update(seed="i32", layer="i32", nrows="i32")
        consts = dict(H=H, P=P, N=N, G=G, L=cfg.L, CAP=cfg.L, LB=max(16, cfg.L), CK_FMT=ck,
                      RD_FMT=rd, SR=sr, HAS_D=True, BPF=block, RECORDS=fold == "records",
                      STAGES=mamba2_rules.flush_stages_for(cfg, tma), FOLD_PREC=fold_prec, ADVANCE=True,
                      PDL=pdl)
        _flush_descriptor(sig, consts, cfg, tma, block, N)
        return mamba2_flush._mamba2_flush_kernel, sig, consts
    if name == "mamba2-nonflush":  # Nemotron-3-Super's Mamba-2 layer, non-flush decode step
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; mamba2-nonflush needs a ReplaySSM preset")
        H, P, N, G = 128, 64, 128, 8
        src = rd if rd != FMT_NONE else ck
        data = {FMT_CODES["fp16"]: "*fp16", FMT_CODES["bf16"]: "*bf16",
                FMT_CODES["fp8e4m3"]: "*fp8e4nv", FMT_CODES["nvfp4"]: "*u8"}
        types = {"slots_ptr": "*i32", "cur_ptr": "*i32", "xr_ptr": "*bf16", "Br_ptr": "*bf16",
                 "x_ptr": "*bf16", "B_ptr": "*bf16", "C_ptr": "*bf16",
                 "src_ptr": data.get(src, "*fp32"), "src_bs_ptr": "*fp8e4nv"}
        sig = _sig("x_ptr dt_ptr A_ptr B_ptr D_ptr C_ptr slots_ptr y_ptr src_ptr src_rs_ptr "
                   "src_bs_ptr", types, "*fp32")
        sig.update(s_src="i64", s_srcrs="i64", s_srcbs="i64")
        sig.update(_sig("xr_ptr dtr_ptr Br_ptr", types, "*fp32"))
        sig.update(s_xr="i64", s_dtr="i64", s_Br="i64")
        sig.update(_sig("cur_ptr bc_ptr lut_ptr", types, "*fp32"))
        sig.update(fi_ptr="*i32", list_ptr="*i32", nrows="i32", **_step_state_sig(ck, rd))
        sig.update(mm_ptr="*fp16", ms_ptr="*fp32")
        mma = nvfp4_decode == "mma" and src == FMT_CODES["nvfp4"]
        if mma and one_launch:
            raise SystemExit("--nvfp4-decode mma reads the ring-products launch's pieces: "
                             "not with --one-launch")
        consts = dict(H=H, P=P, N=N, G=G, L=cfg.L, CAP=cfg.L, LB=max(16, cfg.L), SRC_FMT=src,
                      HAS_D=True, BP=block, LUT=False,
                      E4M3=nvfp4_decode == "e4m3" and src == FMT_CODES["nvfp4"],
                      WORDS8=fp8_decode == "words" and src == FMT_CODES["fp8e4m3"],
                      TILE_FIRST=mamba2_rules.mamba2_tile_first(cfg.L, 64, block,
                                                                 rules.reads_narrow_copy(cfg)),
                      FUSED_PREP=one_launch, BP2=0, PDL=pdl and not one_launch,
                      FLUSH_PDL=pdl and not one_launch, EARLY=False, FR=0, FR_DOT=False,
                      MMA=mma, **one)
        return mamba2_step._mamba2_nonflush_kernel, sig, consts
    if name == "mamba2-prep":  # Nemotron-3-Super's Mamba-2 layer: the ring products
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; mamba2-prep needs a ReplaySSM preset")
        types = {"B_ptr": "*bf16", "C_ptr": "*bf16", "slots_ptr": "*i32", "Br_ptr": "*bf16",
                 "cur_ptr": "*i32", "fi_ptr": "*i32", "list_ptr": "*i32", "mm_ptr": "*fp16"}
        sig = _sig("B_ptr C_ptr slots_ptr Br_ptr", types, "*fp32")
        sig.update(s_Br="i64", **_sig("cur_ptr fi_ptr bc_ptr list_ptr", types, "*fp32"))
        sig.update(nrows="i32", **_sig("mm_ptr ms_ptr", types, "*fp32"))
        consts = dict(G=8, N=128, L=cfg.L, CAP=cfg.L, LB=max(16, cfg.L), RB=256, PDL=pdl,
                      PG=block, MMA=nvfp4_decode == "mma")
        return mamba2_step._mamba2_prep_kernel, sig, consts
    if name == "gdn-nonflush":  # Qwen3.5-4B's GDN layer, non-flush decode step
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; gdn-nonflush needs a ReplaySSM preset")
        src = rd if rd != FMT_NONE else ck
        data = {FMT_CODES["fp16"]: "*fp16", FMT_CODES["bf16"]: "*bf16",
                FMT_CODES["fp8e4m3"]: "*fp8e4nv", FMT_CODES["nvfp4"]: "*u8"}
        types = dict(act, slots_ptr="*i32", cur_ptr="*i32", kr_ptr="*bf16", vr_ptr="*bf16",
                     src_ptr=data.get(src, "*fp32"), src_bs_ptr="*fp8e4nv")
        sig = _sig("q_ptr k_ptr v_ptr g_ptr beta_ptr slots_ptr o_ptr src_ptr src_rs_ptr "
                   "src_bs_ptr", types, "*fp32")
        sig.update(s_src="i64", s_srcrs="i64", s_srcbs="i64")
        sig.update(_sig("kr_ptr ur_ptr gr_ptr vr_ptr br_ptr", types, "*fp32"))
        sig.update(s_kr="i64", s_ur="i64", s_gr="i64", s_vr="i64", s_br="i64")
        sig.update(_sig("cur_ptr kd_ptr lut_ptr", types, "*fp32"))
        sig.update(fi_ptr="*i32", list_ptr="*i32", nrows="i32", **_step_state_sig(ck, rd))
        sig.update(mm_ptr="*fp16", ms_ptr="*fp32")
        mma = nvfp4_decode == "mma" and src == FMT_CODES["nvfp4"]
        if mma and one_launch:
            raise SystemExit("--nvfp4-decode mma reads the ring-products launch's pieces: "
                             "not with --one-launch")
        consts = dict(HV=HV, HK=HK, V=V, K=K, L=cfg.L, CAP=cfg.L, LB=max(16, cfg.L),
                      SRC_FMT=src, RECOMPUTE=cfg.recompute_u, BV=block, LUT=False,
                      TILE_FIRST=False, FUSED_PREP=one_launch, PDL=pdl and not one_launch,
                      FLUSH_PDL=pdl and not one_launch, EARLY=False,
                      WORDS8=fp8_decode == "words" and src == FMT_CODES["fp8e4m3"],
                      FR=0, FR_DOT=False, MMA=mma, **one)
        return gdn_step._gdn_nonflush_kernel, sig, consts
    if name == "gdn-prep":  # Qwen3.5-4B's GDN layer: the ring products (one key head each)
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; gdn-prep needs a ReplaySSM preset")
        types = dict(act, slots_ptr="*i32", cur_ptr="*i32", fi_ptr="*i32", list_ptr="*i32",
                     kr_ptr="*bf16", mm_ptr="*fp16")
        sig = _sig("q_ptr k_ptr slots_ptr kr_ptr gr_ptr br_ptr", types, "*fp32")
        sig.update(s_kr="i64", s_gr="i64", s_br="i64")
        sig.update(_sig("cur_ptr fi_ptr kd_ptr ti_ptr list_ptr", types, "*fp32"))
        sig.update(nrows="i32", **_sig("mm_ptr ms_ptr", types, "*fp32"))
        LB = max(16, cfg.L)
        consts = dict(HV=HV, HK=HK, K=K, L=cfg.L, CAP=cfg.L, LB=LB, LOG_LB=LB.bit_length() - 1,
                      RB=256, UT=False, FOLD_PREC="ieee", PDL=pdl, PK=block,
                      MMA=nvfp4_decode == "mma")
        return gdn_step._gdn_prep_kernel, sig, consts
    if name == "gdn-flush":  # Qwen3.5-4B's GDN layer, decode flush at L
        if cfg.L == 1:
            raise SystemExit(f"{preset} is conventional; gdn-flush needs a ReplaySSM preset")
        data = {FMT_CODES["fp16"]: "*fp16", FMT_CODES["bf16"]: "*bf16",
                FMT_CODES["fp8e4m3"]: "*fp8e4nv", FMT_CODES["nvfp4"]: "*u8"}
        types = dict(act, slots_ptr="*i32", list_ptr="*i32", fi_ptr="*i32", nan_ptr="*i32",
                     kr_ptr="*bf16", vr_ptr="*bf16", ck_ptr=data.get(ck, "*fp32"),
                     rd_ptr=data.get(rd, "*fp32"), ck_bs_ptr="*fp8e4nv", rd_bs_ptr="*fp8e4nv")
        sig = _sig("q_ptr k_ptr v_ptr g_ptr beta_ptr slots_ptr o_ptr ck_ptr ck_rs_ptr ck_bs_ptr",
                   types, "*fp32")
        sig.update(s_ck="i64", s_ckrs="i64", s_ckbs="i64")
        sig.update(_sig("rd_ptr rd_rs_ptr rd_bs_ptr", types, "*fp32"))
        sig.update(s_rd="i64", s_rdrs="i64", s_rdbs="i64")
        sig.update(_sig("kr_ptr ur_ptr gr_ptr vr_ptr br_ptr", types, "*fp32"))
        sig.update(s_kr="i64", s_ur="i64", s_gr="i64", s_vr="i64", s_br="i64")
        types["cur_ptr"] = "*i32"
        sig.update(_sig("kd_ptr ti_ptr list_ptr cur_ptr fi_ptr nan_ptr", types, "*fp32"))
        sig.update(seed="i32", layer="i32", nrows="i32")
        consts = dict(HV=HV, HK=HK, V=V, K=K, L=cfg.L, CAP=cfg.L, LB=max(16, cfg.L),
                      CK_FMT=ck, RD_FMT=rd, SR=sr, RECOMPUTE=cfg.recompute_u, BVF=block,
                      RECORDS=fold == "records",
                      STAGES=gdn_rules.gdn_flush_stages(fold_prec, fold == "records", cfg, tma),
                      FOLD_PREC=fold_prec, ADVANCE=True, PDL=pdl)
        _flush_descriptor(sig, consts, cfg, tma, block, K)
        return gdn_flush._gdn_flush_kernel, sig, consts
    if name in ("gdn-conv", "mamba2-conv"):  # the conventional decode step
        if cfg.L != 1:
            raise SystemExit(f"{preset} is windowed; {name} needs a conventional preset")
        data = {FMT_CODES["fp16"]: "*fp16", FMT_CODES["bf16"]: "*bf16",
                FMT_CODES["fp8e4m3"]: "*fp8e4nv", FMT_CODES["nvfp4"]: "*u8"}
        types = dict(act, slots_ptr="*i32", fi_ptr="*i32", nan_ptr="*i32",
                     ck_ptr=data.get(ck, "*fp32"), ck_bs_ptr="*fp8e4nv", x_ptr="*bf16",
                     B_ptr="*bf16", C_ptr="*bf16")
        if name == "gdn-conv":
            sig = _sig("q_ptr k_ptr v_ptr g_ptr beta_ptr slots_ptr o_ptr ck_ptr ck_rs_ptr "
                       "ck_bs_ptr", types, "*fp32")
            sig.update(s_ck="i64", s_ckrs="i64", s_ckbs="i64")
            sig.update(_sig("fi_ptr nan_ptr", types, "*fp32"))
            sig.update(seed="i32", layer="i32", ticket_ptr="*i32", cur_ptr="*i32", nrows="i32")
            return gdn_step._gdn_conv_kernel, sig, dict(HV=HV, HK=HK, V=V, K=K, CK_FMT=ck, SR=sr,
                                                  BV=block, TILE_FIRST=True, ADVANCE=one_launch)
        sig = _sig("x_ptr dt_ptr A_ptr B_ptr C_ptr D_ptr slots_ptr y_ptr ck_ptr ck_rs_ptr "
                   "ck_bs_ptr", types, "*fp32")
        sig.update(s_ck="i64", s_ckrs="i64", s_ckbs="i64")
        sig.update(_sig("fi_ptr nan_ptr", types, "*fp32"))
        sig.update(seed="i32", layer="i32", ticket_ptr="*i32", cur_ptr="*i32", nrows="i32")
        return mamba2_step._mamba2_conv_kernel, sig, dict(H=128, P=64, N=128, G=8, CK_FMT=ck, SR=sr,
                                                 HAS_D=True, BP=block, TILE_FIRST=True,
                                                 ADVANCE=one_launch)
    raise SystemExit(f"unknown target {name!r}")


def _op(line: str) -> str:
    return re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", line).split()[0].split(".")[0]


def summarize(sass: str) -> dict:
    """Counts over the whole SASS listing and over its largest backward branch (the main loop)."""
    lines = [ln for ln in sass.splitlines() if _ADDR.match(ln)]

    def addr(ln: str) -> int:
        return int(_ADDR.match(ln).group(1), 16)

    def counts(ls: list[str]) -> dict:
        ops = collections.Counter(_op(ln) for ln in ls)
        return {"instructions": len(ls), "barriers": ops["BAR"],
                "local_memory": ops["LDL"] + ops["STL"], "shuffles": ops["SHFL"],
                # griddepcontrol.wait / .launch_dependents (programmatic dependent launch)
                "grid_waits": ops["ACQBULK"], "grid_releases": ops["PREEXIT"],
                # prefetch.global.L2 (``prefetch_l2``)
                "l2_prefetches": sum("CCTL" in ln and ".PF2" in ln for ln in ls),
                # tensor-core instructions (mma.sync, wgmma)
                "tensor_ops": ops["HMMA"] + ops["HGMMA"],
                "top_ops": dict(ops.most_common(8))}

    out = {"kernel": counts(lines)}
    loops = []
    for ln in lines:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < addr(ln):
            loops.append((int(m.group(1), 16), addr(ln)))
    if loops:
        a, b = max(loops, key=lambda x: x[1] - x[0])
        out["main_loop"] = counts([ln for ln in lines if a <= addr(ln) <= b])
        out["loop_span"] = (a, b)
    return out


_LOC = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')


def _project_loc(m: re.Match) -> str:
    """The innermost project source line of an annotation (Triton's own library code is
    attributed to the project line it is inlined at when the annotation names one)."""
    for path, line in ((m.group(1), m.group(2)), (m.group(3), m.group(4))):
        if path and "replayssm_quant" in path:
            return f"{path[path.index('replayssm_quant'):]}:{line}"
    return f"{Path(m.group(1)).name}:{m.group(2)}"


def line_table(annotated: str) -> dict[int, str]:
    """Instruction address -> source line, from ``nvdisasm -gi`` output."""
    table, loc = {}, "?"
    for ln in annotated.splitlines():
        m = _LOC.search(ln)
        if m:
            loc = _project_loc(m)
        elif _ADDR.match(ln):
            table[int(_ADDR.match(ln).group(1), 16)] = loc
    return table


def by_line(sass: str, table: dict[int, str], span: tuple[int, int] | None = None) -> list:
    """Per source line: (line, instructions, barriers, local-memory ops), most barriers and
    spills first, over the whole kernel or the address span of its main loop."""
    rows: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for ln in sass.splitlines():
        m = _ADDR.match(ln)
        if not m:
            continue
        a = int(m.group(1), 16)
        if span and not span[0] <= a <= span[1]:
            continue
        r, op = rows[table.get(a, "?")], _op(ln)
        r[0] += 1
        r[1] += op == "BAR"
        r[2] += op in ("LDL", "STL")
    return sorted(((k, *v) for k, v in rows.items()), key=lambda x: (-x[2], -x[3], -x[1]))


def launch_attrs(fn, signature: dict) -> dict:
    """The specialization a launch gives: Triton's JIT marks every pointer (torch allocations
    are 16-byte aligned) and every integer divisible by 16 that is not ``do_not_specialize``
    with ``tt.divisibility = 16``. Without it loads are not vectorized and the layouts differ
    from what the GPU runs."""
    dns = getattr(fn, "do_not_specialize", None)
    if dns is None:  # the interpreter's function object keeps the jit keywords
        dns = getattr(fn, "kwargs", {}).get("do_not_specialize") or ()
    skip = {fn.arg_names[i] if isinstance(i, int) else i for i in dns}
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items()
            if t.startswith("*") or (t in ("i32", "i64") and n not in skip)}


def sass_stats(fn, signature: dict, constexprs: dict, num_warps: int, arch: int = 90,
               lines: bool = False, maxnreg: int | None = None) -> dict:
    """Compile ``fn`` for sm_<arch> and summarise the SASS (registers from ptxas, and the
    programs of ``num_warps`` warps an SM holds at them, ``programs_per_sm``); with
    ``lines``, also the per-source-line counts of the main loop (or of the whole kernel).
    ``maxnreg`` caps the registers per thread as the launch option of that name does."""
    sig = dict(signature, **{k: "constexpr" for k in constexprs})
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=launch_attrs(fn, signature))
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": num_warps, "maxnreg": maxnreg})
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(bindir / "cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
        res = subprocess.run([str(bindir / "cuobjdump"), "-res-usage", str(cubin)],
                             capture_output=True, text=True, check=True).stdout
        annotated = subprocess.run([str(bindir / "nvdisasm"), "-gi", str(cubin)],
                                   capture_output=True, text=True).stdout if lines else ""
    regs = re.search(r"REG:(\d+)", res)
    out = {"registers": int(regs.group(1)) if regs else None, **summarize(sass)}
    if out["registers"]:  # registers are split among the SM's four schedulers
        out["programs_per_sm"] = programs_per_sm(out["registers"], num_warps,
                                                 kernel.metadata.shared)
    if lines:
        out["by_line"] = by_line(sass, line_table(annotated), out.get("loop_span"))
    return out


def issue_budget(name: str, preset: str, block: int, warps: int, stats: dict,
                 fraction: float = 0.85, copy: float = H200_COPY,
                 issue: float = H200_THREAD_ISSUE) -> dict:
    """How many instructions per state element a decode kernel may issue and still move its
    counted bytes at ``fraction`` of the copy bandwidth: ``issue * bytes / (fraction * copy)``
    thread-instructions per element, at one instruction per scheduler per cycle (an upper
    bound: no kernel issues on every cycle). Beside it the compiled count per element: the
    persistent flushes' main loop (one tile per iteration), the other kernels' whole listing
    (one tile per program), over the tile's ``block * d`` elements shared by ``warps * 32``
    threads. Counts are static (both sides of every branch, each loop body once), so they
    bound what a tile issues from above where a branch is rarely taken (the SR fallbacks)."""
    if name not in BUDGET_PARTS:
        raise ValueError(f"--budget covers the decode-step targets ({', '.join(BUDGET_PARTS)})")
    shape_name, part = BUDGET_PARTS[name]
    shape = SHAPES[shape_name]
    per_elem = getattr(step_bytes(PRESETS[preset], shape), part) / (shape.rows * shape.d_state)
    where = "main_loop" if name.endswith("-flush") and "main_loop" in stats else "kernel"
    elems = block * shape.d_state / (warps * 32)
    count = stats[where]["instructions"] / elems
    budget = issue * per_elem / (fraction * copy)
    return {"shape": shape_name, "part": _PART_NAMES[part], "bytes_per_element": per_elem,
            "fraction": fraction, "budget": budget, "counted": where,
            "elements_per_thread": elems, "instructions_per_element": count,
            "over_budget": count / budget}


def constexpr_overrides(items: list[str], names: list[str]) -> dict:
    """``NAME=VALUE`` items (``--const``) as constexprs: values are Python literals, and a name
    must be one of the kernel's arguments ``names`` (a typo would otherwise compile the
    unchanged kernel)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"{item!r}: expected NAME=VALUE")
        if name not in names:
            raise ValueError(f"{name!r} is not an argument of this kernel ({', '.join(names)})")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"{item!r}: VALUE must be a Python literal") from None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", choices=["emulate-gdn-conv", "emulate-gdn-window", "emulate-gdn-prep",
                                       "gdn-verify",
                                       "gdn-verify-prep", "mamba2-verify-prep", "mamba2-verify",
                                       "mamba2-flush", "mamba2-nonflush",
                                       "gdn-nonflush", "gdn-flush", "gdn-conv", "mamba2-conv",
                                       "gdn-prep", "mamba2-prep"])
    ap.add_argument("--preset", required=True, choices=list(PRESETS))
    ap.add_argument("--block", type=int, required=True,
                    help="state rows per program (value rows for GDN, head-dim rows for Mamba-2; "
                         "gdn-prep / mamba2-prep: key heads / groups per program)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=32,
                    help="gdn-verify / mamba2-verify: state columns per product")
    ap.add_argument("--precision", choices=["bf16x3", "tf32x3", "ieee"], default=None,
                    help="verify targets: the products' dot_precision (default bf16x3); "
                         "flush targets: the fold's flush_precision (default ieee)")
    ap.add_argument("--fold", choices=["dot", "records"], default="dot",
                    help="mamba2-flush / gdn-flush: the decode step's flush_fold")
    ap.add_argument("--nvfp4-decode", choices=sorted({*knobs.NVFP4_DECODES, *knobs.GDN_NVFP4_DECODES}),
                    default="e4m3",
                    help="mamba2-nonflush / gdn-nonflush: how an NVFP4 source is decoded (the "
                         "step's nvfp4_decode; GDN takes 'mma', else its words); gdn-prep / "
                         "mamba2-prep: 'mma' also writes the vectors' pieces for it")
    ap.add_argument("--fp8-decode", choices=list(knobs.FP8_DECODES), default="cvt",
                    help="non-flush targets: how an fp8 source is decoded (the step's fp8_decode)")
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    ap.add_argument("--by-line", type=int, default=0, metavar="N",
                    help="also the N source lines with the most barriers / spills in the main "
                         "loop (the whole kernel when it has none)")
    ap.add_argument("--maxnreg", type=int, default=None,
                    help="cap the registers per thread (the launch option of that name)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--budget", action="store_true",
                    help="decode-step targets: instructions per state element against what the "
                         "H200 can issue per element while the kernel moves its counted bytes at "
                         "85%% of copy bandwidth (the decode issue's bar)")
    ap.add_argument("--one-launch", action="store_true",
                    help="step targets as one launch per step (flush and cursor advance inside)")
    ap.add_argument("--pdl", action="store_true",
                    help="decode-step and verify targets as programmatic dependent launches")
    ap.add_argument("--tma", action="store_true",
                    help="flush targets: the fp32 checkpoint through a tensor descriptor")
    ap.add_argument("--const", action="append", default=[], metavar="NAME=VALUE",
                    help="set a constexpr of the kernel (a Python literal), e.g. STAGES=3; repeatable")
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("sass_stats compiles kernels: unset TRITON_INTERPRET")
    fn, sig, consts = target(a.target, a.preset, a.block, chunk=a.chunk, precision=a.precision,
                             fold=a.fold, one_launch=a.one_launch, nvfp4_decode=a.nvfp4_decode,
                             pdl=a.pdl, tma=a.tma, fp8_decode=a.fp8_decode)
    try:
        consts.update(constexpr_overrides(a.const, list(fn.arg_names)))
    except ValueError as err:
        sys.exit(f"--const: {err}")
    if a.budget and a.one_launch:
        sys.exit("--budget: a one-launch step mixes the non-flush and flush steps' bytes")
    if a.budget and a.target not in BUDGET_PARTS:
        sys.exit(f"--budget covers the decode-step targets ({', '.join(BUDGET_PARTS)})")
    s = sass_stats(fn, sig, consts, a.warps, a.arch, lines=a.by_line > 0, maxnreg=a.maxnreg)
    if a.budget:
        s["budget"] = issue_budget(a.target, a.preset, a.block, a.warps, s)
    if a.json:
        print(json.dumps(s, indent=1))
        return
    print(f"{a.target} {a.preset} block {a.block} warps {a.warps} sm_{a.arch}: "
          f"{s['registers']} registers, {s.get('programs_per_sm', '?')} programs per SM")
    for part in ("kernel", "main_loop"):
        if part in s:
            c = s[part]
            print(f"  {part:9s} {c['instructions']:6d} instructions, {c['barriers']:4d} barriers, "
                  f"{c['local_memory']:4d} local-memory ops, {c['shuffles']:4d} shuffles; "
                  f"top {c['top_ops']}")
    if "budget" in s:
        b = s["budget"]
        print(f"  budget    {b['instructions_per_element']:.1f} instructions per state element "
              f"({b['counted'].replace('_', ' ')}, static; {b['elements_per_thread']:g} per "
              f"thread) against {b['budget']:.1f} that {b['fraction']:.0%} of a copy leaves the "
              f"{b['part']}'s {b['bytes_per_element']:.3f} counted bytes per element on "
              f"{b['shape']} ({b['over_budget']:.1f}x the budget)")
    if a.by_line:
        where = "main loop" if "main_loop" in s else "kernel"
        print(f"  {where} by source line (instructions, barriers, local-memory ops):")
        for loc, n, bars, local in s["by_line"][:a.by_line]:
            print(f"    {loc:48s} {n:6d} {bars:4d} {local:4d}")


if __name__ == "__main__":
    main()
