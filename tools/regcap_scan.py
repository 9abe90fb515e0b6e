"""Which register caps could lift a decode program into the next step of programs per SM?

For every program a decode step launches on a shape (the non-flush program and the flush
program of each ReplaySSM preset, tiles as ``step_plan`` picks them for the H200 at the batch
asked), compile it for sm_90 uncapped and then capped at each step of the per-scheduler
count below its registers (``kernels.persistent.programs_per_sm``: for a one-warp program
96 registers give 20 per SM, 80 give 24, 72 give 28), and print the registers, spill
instructions and instructions at each cap. A cap that reaches the next step without spills
is the one worth timing (``benchmarks/time_variants.py`` with ``{"maxnreg": N}`` or
``{"flush_maxnreg": N}``); the counts are not timings.

    python tools/regcap_scan.py --shapes qwen3.5-4b --presets fp8-read/fp32 --batch 256
    python tools/regcap_scan.py --programs flush --max-spills 40 --json

Compiles with the running Python's Triton (no GPU needed); count with the H200's Triton
(3.6.0) from a separate environment, as ``tools/sass_stats.py`` explains.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replayssm_quant.kernels.core.persistent import programs_per_sm  # noqa: E402
from replayssm_quant.kernels.plan import step_plan  # noqa: E402
from replayssm_quant.precision import PRESETS, SHAPES  # noqa: E402

PROGRAMS = ("nonflush", "flush")


def _sass_stats():
    spec = importlib.util.spec_from_file_location("sass_stats", ROOT / "tools" / "sass_stats.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cap_steps(regs: int, warps: int, floor: int = 32) -> list[int]:
    """The largest register count of each step of programs per SM above that of ``regs``
    registers, highest first: the caps that each add programs."""
    steps, have = [], programs_per_sm(regs, warps)
    for r in range(((regs - 1) // 8) * 8, floor - 1, -8):
        n = programs_per_sm(r, warps)
        if n > have:
            steps.append(r)
            have = n
    return steps


def program_target(shape: str, preset: str, batch: int, program: str) -> dict:
    """The ``sass_stats`` target, tile and constexprs of one program of ``step_plan``'s step:
    the shape's sizes, the plan's tile, decode, grid order and launch flags."""
    s, plan = SHAPES[shape], step_plan(shape, preset, batch, "h200")
    kind = s.kind
    sizes = (dict(H=s.heads, P=s.head_dim, N=s.d_state, G=s.groups) if kind == "mamba2"
             else dict(HV=s.heads, HK=s.groups, V=s.head_dim, K=s.d_state))
    if program == "nonflush":
        kw = dict(pdl=plan.step_pdl, one_launch=plan.one_launch,
                  nvfp4_decode="words" if plan.decode == "words" else "e4m3",
                  fp8_decode="words" if plan.decode == "words8" else "cvt")
        consts = dict(sizes, TILE_FIRST=plan.tile_first, EARLY=plan.early_loads, LUT=plan.lut,
                      FUSED_PREP=plan.fused_prep or plan.one_launch)
        if kind == "mamba2":
            consts["BP2"] = plan.rows2
        return dict(target=f"{kind}-nonflush", block=plan.rows, warps=plan.warps, kw=kw,
                    consts=consts, plan_cap=plan.maxnreg)
    f = plan.flush
    consts = dict(sizes)
    if f.stages is not None:
        consts["STAGES"] = f.stages
    return dict(target=f"{kind}-flush", block=f.rows, warps=f.warps,
                kw=dict(fold=f.fold, precision=f.precision, pdl=f.pdl, tma=f.tma),
                consts=consts, plan_cap=f.maxnreg)


def scan(shape: str, preset: str, batch: int, program: str, max_spills: int = 40,
         ss=None) -> dict:
    """One program's counts uncapped and at each cap of ``cap_steps``, down to the first
    cap whose spill instructions exceed ``max_spills``."""
    ss = ss or _sass_stats()
    t = program_target(shape, preset, batch, program)
    fn, sig, consts = ss.target(t["target"], preset, t["block"], **t["kw"])
    consts.update({k: v for k, v in t["consts"].items() if k in fn.arg_names})

    def count(cap):
        c = ss.sass_stats(fn, sig, consts, t["warps"], 90, maxnreg=cap)
        return dict(cap=cap, registers=c["registers"], spills=c["kernel"]["local_memory"],
                    instructions=c["kernel"]["instructions"],
                    programs_per_sm=programs_per_sm(c["registers"], t["warps"]))

    base = count(None)
    caps = []
    for cap in cap_steps(base["registers"], t["warps"]):
        caps.append(count(cap))
        if caps[-1]["spills"] > max_spills:
            break
    return dict(shape=shape, preset=preset, batch=batch, program=program,
                target=t["target"], rows=t["block"], warps=t["warps"], plan_cap=t["plan_cap"],
                uncapped=base, caps=caps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    windowed = [p for p, c in PRESETS.items() if c.L > 1]
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--presets", nargs="+", default=windowed, choices=windowed,
                    help="ReplaySSM presets (default: all of them)")
    ap.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    ap.add_argument("--batch", type=int, default=256, help="the batch the plans are made for")
    ap.add_argument("--max-spills", type=int, default=40,
                    help="stop lowering a program's cap once it spills more instructions than this")
    ap.add_argument("--json", action="store_true", help="print the results as a JSON list")
    a = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("regcap_scan compiles kernels: unset TRITON_INTERPRET")
    if a.batch < 1:
        sys.exit("--batch must be at least 1")
    ss = _sass_stats()
    rows = []
    for shape in a.shapes:
        for preset in a.presets:
            for program in a.programs:
                r = scan(shape, preset, a.batch, program, a.max_spills, ss)
                rows.append(r)
                if a.json:
                    continue
                u = r["uncapped"]
                plan = f", the plan caps it at {r['plan_cap']}" if r["plan_cap"] else ""
                print(f"{shape} {preset} {program} ({r['rows']} rows, {r['warps']} warps{plan}): "
                      f"{u['registers']} registers, {u['instructions']} instructions, "
                      f"{u['programs_per_sm']} per SM", flush=True)
                for c in r["caps"]:
                    print(f"    cap {c['cap']:3d}: {c['registers']:3d} registers, "
                          f"{c['spills']:3d} spill instructions, {c['instructions']} "
                          f"instructions, {c['programs_per_sm']} per SM", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
