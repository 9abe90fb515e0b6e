"""Launch-knob sweep for the decode kernels on one batch size (CUDA), with correctness checks
at the paper shapes: FP32 configs against a float64 recurrence, every preset against the
pure-torch reference step by step (both start each step from the same state), speculative
verify of 8 drafts + commit against the reference, and the compiled kernels' register and
spill counts.

    python -m benchmarks.tune_decode --batch 256 --check
    python -m benchmarks.tune_decode --check-only     # correctness at the paper shapes only
    python -m benchmarks.tune_decode --smoke          # CPU dry run (interpreter, tiny shapes)
    python -m benchmarks.tune_decode variants --jobs JOBS.json --batch 256   # A/B variants

Kernels are compiled first by worker processes in parallel (Triton's on-disk cache then
serves the main process), so a sweep spends its time measuring.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import sys
import time

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from triton.errors import TritonError  # noqa: E402

from benchmarks.decode import (  # noqa: E402
    VERIFY_CONFIGS,
    Workload,
    measure,
    measure_flush,
    measure_verify,
    precompile,
    verify_workload,
)
from benchmarks.harness import copy_bandwidth  # noqa: E402
from replayssm_quant import formats as F  # noqa: E402
from replayssm_quant.kernels import gdn as kg  # noqa: E402
from replayssm_quant.kernels import knobs  # noqa: E402
from replayssm_quant.kernels import mamba2 as km  # noqa: E402
from replayssm_quant.kernels.core.cache import cache_from_reference  # noqa: E402
from replayssm_quant.precision import PRESETS, SHAPES, step_bytes  # noqa: E402
from replayssm_quant.ssm import gdn, mamba2  # noqa: E402
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"


# ------------------------------------------------------------------------------ correctness
def check_fp32(shape, cfg, steps: int = 40, batch: int = 4, **step_kw) -> float:
    """Relative error of the kernel against a float64 conventional recurrence (bf16
    activations; ``step_kw`` go to the decode step)."""
    w = Workload(shape, batch, cfg, steps=steps, device=DEV)
    c = w.cache
    S = c.ckpt.data.double()
    H, G = shape.heads, shape.groups
    ys, refs = [], []
    for i in range(steps):
        a = w.inputs[i]
        ys.append(w.step(i, **step_kw).double())
        if shape.kind == "mamba2":
            hg = torch.arange(H, device=DEV) // (H // G)
            Bh, Ch = a["Bm"][:, hg].double(), a["C"][:, hg].double()
            dt = a["dt"].double()
            S = torch.exp(dt * w.A.double())[..., None, None] * S + \
                (dt[..., None] * a["x"].double())[..., None] * Bh[:, :, None, :]
            refs.append((S * Ch[:, :, None, :]).sum(-1) + w.D.double()[:, None] * a["x"].double())
        else:
            hk = torch.arange(H, device=DEV) // (H // G)
            k, q = a["k"][:, hk].double(), a["q"][:, hk].double()
            S = torch.exp(a["g"].double())[..., None, None] * S
            u = a["beta"].double()[..., None] * (a["v"].double() - (S * k[:, :, None, :]).sum(-1))
            S = S + u[..., None] * k[:, :, None, :]
            refs.append((S * q[:, :, None, :]).sum(-1))
    y, r = torch.stack(ys), torch.stack(refs)
    return ((y - r).norm() / r.norm()).item()


def _differ(a, b) -> float:
    """Fraction of stored elements further apart than float32 noise (relative to the row)."""
    da, db = F.dequantize(a).double(), F.dequantize(b).double()
    rowmax = db.abs().amax(-1, keepdim=True).nan_to_num(0).clamp_min(1e-30)
    return ((da - db).abs() > 1e-5 * rowmax).double().mean().item()


def check_preset(shape, cfg, steps: int | None = None, batch: int = 4, seed: int = 0,
                 act: torch.dtype = torch.bfloat16, nan_state: bool = False, **step_kw) -> dict:
    """Kernel vs reference step by step from the same state (cursors staggered so rows flush
    on different steps): worst output relative error and worst fraction of checkpoint / read
    copy elements that differ. Activations (and the ring) in ``act``, bf16 as the paper
    models run (the flush's default products then take the exact bf16 split); ``step_kw`` go
    to the decode step (e.g. ``flush_fold``). With ``nan_state`` one element of the first
    row's state is NaN: ``nan_ok`` then says the outputs are NaN exactly where the
    reference's are (else that every output is finite), ``y_rel`` is over the rest."""
    from replayssm_quant.kernels.gdn import gdn_decode_step
    from replayssm_quant.kernels.mamba2 import mamba2_decode_step

    g = torch.Generator(device=DEV).manual_seed(seed)
    steps = steps or cfg.L + 2
    H, P, N, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
    nslots = batch + 1
    slots = torch.arange(1, batch + 1, dtype=torch.int32, device=DEV)
    if shape.kind == "mamba2":
        ref = mamba2.init_mamba2_state(cfg, nslots, H, P, N, G, seed=3, layer=1, device=DEV,
                                       act_dtype=act)
        inp = mamba2_inputs(batch, steps + 2, H, P, N, G, generator=g, device=DEV)
        S0 = 0.3 * torch.randn(nslots, H, P, N, generator=g, device=DEV)
        if nan_state:
            S0[1, H // 2, P // 3, N // 3 + 1] = float("nan")
        mamba2.load_state(ref, torch.arange(nslots, device=DEV), S0)
    else:
        ref = gdn.init_gdn_state(cfg, nslots, H, P, N, G, seed=3, layer=1, device=DEV,
                                 act_dtype=act)
        inp = gdn_inputs(batch, steps + 2, H, P, N, G, generator=g, device=DEV)
        S0 = 0.3 * torch.randn(nslots, H, P, N, generator=g, device=DEV)
        if nan_state:
            S0[1, H // 2, P // 3, N // 3 + 1] = float("nan")
        gdn.load_state(ref, torch.arange(nslots, device=DEV), S0)
    inp.update({k: inp[k].to(act).float() for k in ("x", "Bm", "C", "q", "k", "v") if k in inp})

    def args(t):
        return {k: (v[:, t].contiguous() if isinstance(v, torch.Tensor) and v.dim() > 1 else v)
                for k, v in inp.items()}

    def ref_step(t, sl):
        a = args(t)
        if shape.kind == "mamba2":
            return mamba2.decode_step(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], sl)
        return gdn.decode_step(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], sl)

    if cfg.L > 1:  # stagger: the first row one record ahead, the second two
        for t, live in enumerate(([0, 1], [1])):
            live = [i for i in live if i < batch]
            sl = torch.full_like(slots, -1)
            sl[live] = slots[live]
            ref_step(t, sl)
    worst = {"y_rel": 0.0, "ckpt_differ": 0.0, "read_differ": 0.0, "nan_ok": True}
    for t in range(2, steps + 2):
        ker = copy.deepcopy(ref)
        cache = cache_from_reference(ker)
        a = args(t)
        out = torch.full((batch, H, P), float("nan"), device=DEV)
        if shape.kind == "mamba2":
            y = mamba2_decode_step(cache, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"],
                                   slots, out=out, **step_kw)
        else:
            y = gdn_decode_step(cache, a["q"], a["k"], a["v"], a["g"], a["beta"], slots, out=out,
                                **step_kw)
        y_ref = ref_step(t, slots)
        fin = torch.isfinite(y_ref)
        worst["nan_ok"] &= (bool(torch.equal(torch.isnan(y), ~fin)) if nan_state else
                            bool(torch.isfinite(y).all()))
        worst["y_rel"] = max(worst["y_rel"],
                             ((y - y_ref)[fin].norm() / y_ref[fin].norm()).item())
        worst["ckpt_differ"] = max(worst["ckpt_differ"], _differ(ker.ckpt, ref.ckpt))
        if cfg.read is not None:
            worst["read_differ"] = max(worst["read_differ"], _differ(ker.read, ref.read))
        assert torch.equal(ker.cursor, ref.cursor)
    return worst


def check_spec(shape, cfg, T: int = 8, rounds: int = 4, batch: int = 4, seed: int = 0,
               act: torch.dtype = torch.bfloat16, **verify_kw) -> dict:
    """Speculative verify of T drafts + commit against the reference, round by round from the
    same state (accepted counts vary per row, some rounds fold a window): worst output error
    of the verify and worst fraction of checkpoint elements that differ after the commit.
    Activations in ``act`` (bf16, as the paper models run: the verify's default products are
    then the exact bf16 split); ``verify_kw`` go to the verify (e.g. ``chunk``)."""
    from dataclasses import replace

    from replayssm_quant.kernels.gdn import gdn_commit, gdn_verify
    from replayssm_quant.kernels.mamba2 import mamba2_commit, mamba2_verify

    g = torch.Generator(device=DEV).manual_seed(seed)
    cfg = replace(cfg, L=max(cfg.L, T))
    H, P, N, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
    nslots = batch + 1
    slots = torch.arange(1, batch + 1, dtype=torch.int32, device=DEV)
    S0 = 0.3 * torch.randn(nslots, H, P, N, generator=g, device=DEV)
    mod = mamba2 if shape.kind == "mamba2" else gdn
    init = mamba2.init_mamba2_state if shape.kind == "mamba2" else gdn.init_gdn_state
    ref = init(cfg, nslots, H, P, N, G, spec_tokens=T - 1, seed=3, layer=1, device=DEV,
               act_dtype=act)
    mod.load_state(ref, torch.arange(nslots, device=DEV), S0)
    worst = {"y_rel": 0.0, "ckpt_differ": 0.0}
    for r in range(rounds):
        ker = copy.deepcopy(ref)
        cache = cache_from_reference(ker)
        acc = torch.tensor([T - (r + i) % (T + 1) for i in range(batch)], dtype=torch.int32,
                           device=DEV)  # mostly long acceptances: every row folds a window
        if shape.kind == "mamba2":
            a = mamba2_inputs(batch, T, H, P, N, G, generator=g, device=DEV)
            a.update({k: a[k].to(act).float() for k in ("Bm", "C")})
            y_ref = mamba2.verify(ref, a["x"], a["dt"], a["A"], a["Bm"], a["C"], a["D"], slots)
            y = mamba2_verify(cache, a["x"].to(act), a["dt"], a["A"], a["Bm"].to(act),
                              a["C"].to(act), a["D"], slots,
                              **verify_kw)
            mamba2.commit(ref, acc, slots, a["A"])
            mamba2_commit(cache, acc, a["A"], slots)
        else:
            a = gdn_inputs(batch, T, H, P, N, G, generator=g, device=DEV)
            a.update({k: a[k].to(act).float() for k in ("q", "k", "v")})
            y_ref = gdn.verify(ref, a["q"], a["k"], a["v"], a["g"], a["beta"], slots)
            y = gdn_verify(cache, a["q"].to(act), a["k"].to(act), a["v"].to(act), a["g"],
                           a["beta"], slots, **verify_kw)
            gdn.commit(ref, acc, slots)
            gdn_commit(cache, acc, slots)
        worst["y_rel"] = max(worst["y_rel"], ((y - y_ref).norm() / y_ref.norm()).item())
        worst["ckpt_differ"] = max(worst["ckpt_differ"], _differ(ker.ckpt, ref.ckpt))
        assert torch.equal(ker.cursor, ref.cursor)
    return worst


# ------------------------------------------------------------------------------ compilation
def _variants(kind: str, cfg, args) -> list[dict]:
    """Launch knobs to try: non-flush tiles x warps (flush knobs at their defaults), then
    flush tiles x warps x persistent programs per SM (non-flush knobs at their defaults)."""
    mk = "block_p" if kind == "mamba2" else "block_v"
    fk = "flush_block_p" if kind == "mamba2" else "flush_block_v"
    out = [{mk: b, "num_warps": w, **({"tile_first": True} if o == "tile" else {})}
           for b, w, o in itertools.product(args.blocks, args.warps, args.orders)]
    if cfg.L > 1:
        if cfg.read is not None and cfg.read.name == "nvfp4" and args.blocks:
            out.append({mk: args.blocks[0], "num_warps": args.warps[0], "lut": True})
        out += [{fk: b, "flush_warps": w, "flush_per_sm": s or None, "flush_fold": f,
                 **({"flush_stages": st} if st else {}),
                 **({"flush_precision": fp} if fp != "default" else {})}
                for f, b, w, s, st, fp in itertools.product(args.folds, args.fblocks, args.fwarps,
                                                            args.per_sm, args.fstages, args.fprecs)]
    return out


def _json_knobs(text: str) -> dict:
    """``--check-knobs``: a JSON object of step keyword arguments."""
    try:
        knobs = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(knobs, dict):
        raise argparse.ArgumentTypeError("expected a JSON object of step knobs")
    return knobs


def _check_kw(args) -> dict:
    """Step knobs the preset checks run with (the library's defaults unless asked)."""
    kw = {"flush_fold": args.check_fold} if args.check_fold else {}
    if args.check_flush_precision:
        kw["flush_precision"] = args.check_flush_precision
    return {**kw, **args.check_knobs}



def register_report() -> None:
    """Registers and spills of every compiled decode kernel variant in this process."""
    fns = {n: getattr(m, n) for m in (km, kg) for n in dir(m)
           if n.startswith("_") and n.endswith("_kernel")}
    for name, fn in sorted(fns.items()):
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for k in getattr(kernels, "values", lambda: [])():
                regs, spills = getattr(k, "n_regs", "?"), getattr(k, "n_spills", "?")
                warps = getattr(getattr(k, "metadata", None), "num_warps", "?")
                print(f"  regs {name:28s} warps {warps} regs {regs} spills {spills}", flush=True)


def verify_sweep(args) -> int:
    """Speculative verify of 8 drafts per launch-knob variant, as a multiple of the
    conventional FP32 step of the same shape and batch (the acceptance bar is 1.0)."""
    T = 3 if SMOKE else 8
    kinds = sorted({SHAPES[s].kind for s in args.shapes})
    variants = [{"verify": {("block_p" if kind == "mamba2" else "block_v"): b,
                            "num_warps": w, "chunk": kc, "dot_precision": pr,
                            **({"tile_first": True} if o == "tile" else {})}}
                for kind in kinds
                for b, w, kc, pr, o in itertools.product(args.vblocks, args.vwarps, args.vchunks,
                                                         args.vprecs, args.orders)]
    jobs = [(s, PRESETS[c], kw, T, DEV) for s in args.shapes for c in VERIFY_CONFIGS
            for kw in variants if next(iter(kw["verify"])) == (
                "block_p" if SHAPES[s].kind == "mamba2" else "block_v")]
    jobs += [(s, PRESETS["fp32"], {}, 0, DEV) for s in args.shapes]
    precompile(jobs, args.workers)
    for sname in args.shapes:
        shape = SHAPES[sname]
        base = measure(shape, args.batch, PRESETS["fp32"], args.reps, device=DEV)["window_us"]
        print(f"{sname:22s} B={args.batch} conventional fp32 step {base:8.1f}us", flush=True)
        for (s, cfg, kw, _, _) in jobs:
            if s != sname or "verify" not in kw:
                continue
            t = measure_verify(shape, args.batch, cfg, T, args.reps, device=DEV, **kw["verify"])
            print(f"{sname:22s} {cfg.label:20s} verify T={T} {kw['verify']} {t:9.1f}us = "
                  f"{t / base:5.2f} conventional steps", flush=True)
        if args.profile and not SMOKE:
            for cname in VERIFY_CONFIGS:
                print(f"{sname:22s} {cname:20s} verify T={T} defaults, device us per kernel: "
                      f"{verify_kernel_times(shape, args.batch, PRESETS[cname], T)}", flush=True)
    register_report()
    return 0


def verify_kernel_times(shape, batch: int, cfg, T: int, reps: int = 5) -> dict:
    """Device microseconds per launch of each kernel of one verify (torch profiler, no graph)."""
    from torch.profiler import ProfilerActivity, profile

    from replayssm_quant.kernels.gdn import gdn_verify
    from replayssm_quant.kernels.mamba2 import mamba2_verify

    w = verify_workload(shape, batch, cfg, T, DEV)
    st = lambda key: torch.stack([a[key] for a in w.inputs], 1).contiguous()  # noqa: E731
    if shape.kind == "mamba2":
        x, dt, Bm, C = st("x"), st("dt"), st("Bm"), st("C")
        fn = lambda: mamba2_verify(w.cache, x, dt, w.A, Bm, C, w.D, w.slots)  # noqa: E731
    else:
        q, k, v, g, beta = st("q"), st("k"), st("v"), st("g"), st("beta")
        fn = lambda: gdn_verify(w.cache, q, k, v, g, beta, w.slots)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / e.count, 1) for e in prof.key_averages()
            if e.device_time_total > 0 and e.key.startswith("_")}


# ------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["variants"]:  # time a jobs file of variants (``benchmarks.variants``)
        from benchmarks.variants import main as variants_main

        return variants_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--shapes", nargs="*", default=["nemotron-3-super-120b", "qwen3.5-4b"])
    ap.add_argument("--configs", nargs="*",
                    default=["fp32", "replay-fp32", "nvfp4-read/fp16-sr", "nvfp4-read/fp32"])
    ap.add_argument("--blocks", type=int, nargs="*", default=[64, 32])
    ap.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--fblocks", type=int, nargs="*", default=[16, 32])
    ap.add_argument("--fwarps", type=int, nargs="*", default=[4])
    ap.add_argument("--per-sm", type=int, nargs="*", default=[0],
                    help="persistent flush programs per SM to sweep (0: the library's default, "
                         "one wave of the programs the compiled kernel leaves resident)")
    ap.add_argument("--fstages", type=int, nargs="*", default=[0],
                    help="software-pipelining stages of the persistent flush loop (0: the "
                         "library's default for the config)")
    ap.add_argument("--folds", nargs="*", default=["dot"], choices=list(knobs.FLUSH_FOLDS),
                    help="flush_fold values to sweep")
    ap.add_argument("--orders", nargs="*", default=["row"], choices=["row", "tile"],
                    help="grid orders of the conventional / non-flush launches to sweep "
                         "(row: (rows, heads, tiles); tile: (tiles, heads, rows))")
    ap.add_argument("--fprecs", nargs="*", default=["default"],
                    choices=["default", *knobs.FOLD_PRECISIONS],
                    help="flush_precision values to sweep (default: the library's choice, "
                         "default_fold_precision)")
    ap.add_argument("--check-flush-precision", choices=list(knobs.FOLD_PRECISIONS), default=None,
                    help="run the preset checks with this flush_precision")
    ap.add_argument("--check-fold", choices=list(knobs.FLUSH_FOLDS), default=None,
                    help="run the preset checks with this flush_fold (default: the library's)")
    ap.add_argument("--check-nan-state", action="store_true",
                    help="preset checks with one NaN element in the first row's state: the "
                         "outputs must be NaN exactly where the reference's are")
    ap.add_argument("--check-knobs", type=_json_knobs, default={}, metavar="JSON",
                    help='more step knobs for the preset checks, e.g. \'{"early_loads": true}\'')
    ap.add_argument("--verify", action="store_true",
                    help="sweep the speculative verify's tiles x warps (8 drafts) instead")
    ap.add_argument("--vblocks", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--vwarps", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--vchunks", type=int, nargs="*", default=[16, 32],
                    help="state columns per product of the verify (its ``chunk``)")
    ap.add_argument("--vprecs", nargs="*", default=["auto"], choices=list(knobs.DOT_PRECISIONS),
                    help="the verify's dot_precision values to sweep (and to check)")
    ap.add_argument("--profile", action="store_true",
                    help="with --verify: device time per kernel of the default verify (profiler)")
    ap.add_argument("--check", action="store_true", help="correctness checks first")
    ap.add_argument("--check-only", action="store_true", help="correctness checks, no sweep")
    ap.add_argument("--check-shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--check-batch", type=int, default=4,
                    help="rows per correctness check (1 exercises the small-batch tiles)")
    ap.add_argument("--check-configs", nargs="*", default=list(PRESETS), choices=list(PRESETS),
                    help="presets the step-by-step checks run")
    ap.add_argument("--spec-only", action="store_true",
                    help="with --check-only: only the speculative verify + commit checks")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run, tiny shapes")
    args = ap.parse_args(argv)
    if SMOKE:
        from replayssm_quant.precision import ModelShape

        SHAPES.clear()
        SHAPES["tiny-m2"] = ModelShape("tiny-m2", "mamba2", 2, 32, 32, 1)
        SHAPES["tiny-gdn"] = ModelShape("tiny-gdn", "gdn", 2, 32, 32, 1)
        args.shapes = args.check_shapes = list(SHAPES)
        args.configs, args.batch, args.workers, args.reps = ["replay-fp32"], 2, 1, 1
        args.blocks, args.warps, args.fblocks, args.per_sm = [32], [4], [16], [1]
        args.fstages = [0, 1, 2]
    if args.check_only:
        args.check, args.shapes = True, []
    if args.verify:
        return verify_sweep(args)
    jobs = []
    for sname in args.shapes:
        for cname in args.configs:
            jobs += [(sname, PRESETS[cname], kw, 0, DEV)
                     for kw in _variants(SHAPES[sname].kind, PRESETS[cname], args)]
    if args.check and not args.spec_only:
        ckw = _check_kw(args)
        jobs += [(s, PRESETS[c], ckw, 0, DEV) for s in args.check_shapes for c in args.check_configs]
    precompile(jobs, args.workers)
    if args.check:
        for sname in args.check_shapes:
            for cname in () if args.spec_only else ("fp32", "replay-fp32"):
                err = check_fp32(SHAPES[sname], PRESETS[cname], steps=40 if not SMOKE else 18,
                                 batch=args.check_batch, **_check_kw(args))
                print(f"check64 {sname:22s} {cname:12s} rel err vs float64 {err:.2e}", flush=True)
            for cname in () if args.spec_only else args.check_configs:
                t0 = time.time()
                r = check_preset(SHAPES[sname], PRESETS[cname], batch=args.check_batch,
                                 nan_state=args.check_nan_state, **_check_kw(args))
                print(f"check   {sname:22s} {cname:20s} y_rel {r['y_rel']:.2e} ckpt differ "
                      f"{r['ckpt_differ']:.2e} read differ {r['read_differ']:.2e} "
                      f"{'nan where the reference' if args.check_nan_state else 'finite'} "
                      f"{r['nan_ok']} ({time.time() - t0:.1f}s)", flush=True)
            for cname, pr in itertools.product(("replay-fp32", "nvfp4-read/fp16-sr"), args.vprecs):
                t0 = time.time()
                r = check_spec(SHAPES[sname], PRESETS[cname], T=3 if SMOKE else 8,
                               dot_precision=pr)
                print(f"checksp {sname:22s} {cname:20s} {pr:6s} verify y_rel "
                      f"{r['y_rel']:.2e} ckpt differ after commit {r['ckpt_differ']:.2e} "
                      f"({time.time() - t0:.1f}s)", flush=True)
    if SMOKE:
        bw = 1.0
    else:
        bw = copy_bandwidth()
        print(f"{torch.cuda.get_device_name()} copy {bw / 1e12:.3f} TB/s", flush=True)
    for sname in args.shapes:
        shape = SHAPES[sname]
        for cname in args.configs:
            cfg = PRESETS[cname]
            sb = step_bytes(cfg, shape)
            for kw in _variants(shape.kind, cfg, args):
                t0 = time.time()
                try:
                    _measure_variant(sname, cname, kw, args, sb, bw, t0)
                except (RuntimeError, ValueError, TritonError) as e:  # e.g. OutOfResources
                    print(f"{sname:22s} {cname:20s} {kw} failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]}", flush=True)
    register_report()
    return 0


def _measure_variant(sname: str, cname: str, kw: dict, args, sb, bw: float, t0: float) -> None:
    """Time one launch-knob variant and print its line (the flush alone, or the window)."""
    shape, cfg = SHAPES[sname], PRESETS[cname]
    if any(k.startswith("flush") for k in kw):
        t = measure_flush(shape, args.batch, cfg, args.reps, device=DEV, **kw)
        frf = sb.flush * args.batch / (t * 1e-6) / bw
        print(f"{sname:22s} {cname:20s} {kw} flush {t:8.1f}us ({frf:.2f}) "
              f"[{time.time() - t0:.1f}s]", flush=True)
        return
    m = measure(shape, args.batch, cfg, args.reps, device=DEV, **kw)
    fr = sb.window_average * args.batch / (m["window_us"] * 1e-6) / bw
    frn = sb.nonflush * args.batch / (m["nonflush_us"] * 1e-6) / bw
    frf = sb.flush * args.batch / (m["flush_us"] * 1e-6) / bw
    print(f"{sname:22s} {cname:20s} {kw} win {m['window_us']:8.1f}us ({fr:.2f}) "
          f"nf {m['nonflush_us']:8.1f} ({frn:.2f}) fl {m['flush_us']:8.1f} "
          f"({frf:.2f}) [{time.time() - t0:.1f}s]", flush=True)

if __name__ == "__main__":
    raise SystemExit(main())
