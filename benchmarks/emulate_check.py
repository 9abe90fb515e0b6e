"""Emulator kernels on the GPU: time per precision config over a long teacher-forced sequence,
and agreement with the reference ``emulate`` (pure torch, also on the GPU) on a prefix.

Layers (batch 1): a Qwen3.5-4B-shaped GDN layer (32 value heads, 16 key heads, d_k = d_v = 128)
and a Nemotron-3-Super-shaped Mamba-2 layer (128 heads, head_dim 64, d_state 128, 8 groups),
bf16 activations, fp32 decays.

    python -m benchmarks.emulate_check                     # every preset, both layers
    python -m benchmarks.emulate_check --tokens 16384 --check-tokens 512 --no-sweep
    python -m benchmarks.emulate_check --smoke --tokens 64 --check-tokens 32   # CPU dry run

Phases: (1) every kernel variant is compiled in parallel worker processes (Triton's on-disk
cache then serves the main process); (2) each preset is timed over ``--tokens`` tokens with
CUDA events after a warm-up run; (3) a few launch variants (rows per program, warps, prefetch)
are timed on representative presets, each of which then runs its fastest, while every other
preset runs the library's default knobs for its config; (4) kernel and reference run the first
``--check-tokens`` tokens (a multiple of L, so the final state is the checkpoint's value):
output relative error, and the fraction of checkpoint elements that differ beyond float32
noise. Reference runs are
launch-bound (hundreds of small ops per token); they are shortened when the time budget runs
low, and the JSON says so. Results go to ``$OUT`` (default ``reports/emulate``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SMOKE = "--smoke" in sys.argv  # the interpreter must be chosen before any kernel is defined
if SMOKE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from replayssm_quant.kernels.gdn import gdn_emulate  # noqa: E402
from replayssm_quant.kernels.mamba2 import mamba2_emulate  # noqa: E402
from replayssm_quant.precision import PRESETS, parse_config  # noqa: E402
from replayssm_quant.ssm import gdn, mamba2  # noqa: E402
from replayssm_quant.ssm.synthetic import gdn_inputs, mamba2_inputs  # noqa: E402

GDN_SHAPE = dict(num_v_heads=32, head_v_dim=128, head_k_dim=128, num_k_heads=16)
M2_SHAPE = dict(num_heads=128, head_dim=64, d_state=128, n_groups=8)
DEV = "cuda"
if SMOKE:  # tiny shapes on the CPU: exercises the script, measures nothing
    GDN_SHAPE = dict(num_v_heads=2, head_v_dim=32, head_k_dim=32, num_k_heads=1)
    M2_SHAPE = dict(num_heads=2, head_dim=32, d_state=32, n_groups=1)
    DEV = "cpu"
ACT = torch.bfloat16
LAYERS = ("gdn", "mamba2")
GDN_BUDGET_MS = 100.0  # acceptance: a GDN layer over 131,072 tokens per config

# Launch variants (rows per program, warps, prefetch); the first of
# each list is the library's default for the config (None: ``gdn_emulate`` / ``mamba2_emulate``
# choose).
DEFAULT = (None, None, None)
VARIANTS = {
    ("gdn", "conv"): [DEFAULT, (2, 1, None), (8, 1, None), (4, 2, None), (8, 2, None)],
    ("gdn", "window"): [DEFAULT, (32, 4, False), (32, 8, False), (16, 4, False),
                        (64, 8, False)],
    ("mamba2", "conv"): [DEFAULT, (2, 1, None), (4, 1, None), (8, 1, None), (8, 2, None)],
    ("mamba2", "window"): [DEFAULT, (32, 8, False), (16, 8, True), (16, 4, False)],
}
SWEEP_PRESETS = {"conv": ("fp16-sr", "bf16-sr"), "window": ("nvfp4-read/fp16-sr", "replay-fp32")}


def knob_text(knobs) -> str:
    if knobs == DEFAULT:
        return "default"
    return f"block={knobs[0]} warps={knobs[1]} prefetch={knobs[2]}"


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def family(preset: str) -> str:
    return "conv" if PRESETS[preset].L == 1 else "window"


# ---------------------------------------------------------------------------------- inputs
def make_inputs(layer: str, T: int, device: str, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """S0 (fp32) and the emulate keyword inputs, activations in bf16."""
    g = torch.Generator(device=device).manual_seed(seed)
    if layer == "gdn":
        s = GDN_SHAPE
        S0 = 0.3 * torch.randn(1, s["num_v_heads"], s["head_v_dim"], s["head_k_dim"],
                               generator=g, device=device)
        inp = gdn_inputs(1, T, *s.values(), generator=g, device=device)
        for n in ("q", "k", "v"):
            inp[n] = inp[n].to(ACT)
    else:
        s = M2_SHAPE
        S0 = 0.3 * torch.randn(1, s["num_heads"], s["head_dim"], s["d_state"], generator=g,
                               device=device)
        inp = mamba2_inputs(1, T, *s.values(), generator=g, device=device)
        for n in ("x", "Bm", "C"):
            inp[n] = inp[n].to(ACT)
    return S0, inp


def run_kernel(layer: str, preset: str, knobs, S0, inp: dict, **kw):
    block, warps, prefetch = knobs
    if layer == "gdn":
        return gdn_emulate(PRESETS[preset], S0, **inp, act_dtype=ACT, block_v=block,
                           num_warps=warps, prefetch=prefetch, **kw)
    return mamba2_emulate(PRESETS[preset], S0, **inp, act_dtype=ACT, block_p=block,
                          num_warps=warps, prefetch=prefetch, **kw)


def run_reference(layer: str, preset: str, S0, inp: dict):
    mod = gdn if layer == "gdn" else mamba2
    return mod.emulate(PRESETS[preset], S0, **inp, act_dtype=ACT)


def compile_job(job: tuple) -> tuple[tuple, float, str | None]:
    """Worker: compile one (layer, preset, knobs) kernel by running it on a few tokens (the
    JIT path, so the on-disk cache key matches the main process's launches)."""
    layer, preset, knobs = job
    t = time.time()
    try:
        L = PRESETS[preset].L
        S0, inp = make_inputs(layer, 2 * L + 3, DEV)
        run_kernel(layer, preset, knobs, S0, inp)
        sync()
        return job, time.time() - t, None
    except Exception as e:  # reported, never fatal: the main process compiles it again
        return job, time.time() - t, f"{type(e).__name__}: {e}"[:300]


def precompile(jobs: list[tuple], workers: int) -> dict:
    t = time.time()
    errors = {}
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            for job, _, err in ex.map(compile_job, jobs):
                if err:
                    errors[str(job)] = err
    else:
        for job in jobs:
            _, _, err = compile_job(job)
            if err:
                errors[str(job)] = err
    return {"jobs": len(jobs), "workers": workers, "seconds": round(time.time() - t, 1),
            "errors": errors}


# ---------------------------------------------------------------------------------- timing
def time_call(fn, reps: int) -> list[float]:
    """Milliseconds per call (CUDA events), after one untimed warm-up call."""
    fn()
    sync()
    out = []
    for _ in range(reps):
        if DEV != "cuda":
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


# ---------------------------------------------------------------------------------- accuracy
def compare(cfg, y, s, y_ref, s_ref) -> dict:
    """Output errors, and how many state elements differ beyond float32 noise."""
    y, s, y_ref, s_ref = (t.double() for t in (y, s, y_ref, s_ref))
    rel = ((y - y_ref).norm() / y_ref.norm()).item()
    ymax = ((y - y_ref).abs().max() / y_ref.abs().max()).item()
    w = max(cfg.L - 1, 1)
    first = ((y[:, :w] - y_ref[:, :w]).norm() / y_ref[:, :w].norm()).item()
    rowmax = s_ref.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    differ = ((s - s_ref).abs() > 1e-5 * rowmax).double().mean().item()
    return {"y_rel": rel, "y_max_rel": ymax, "y_rel_first_window": first,
            "y_bit_equal_frac": (y == y_ref).double().mean().item(),
            "state_rel": ((s - s_ref).norm() / s_ref.norm()).item(),
            "ckpt_differ_frac": differ, "ckpt_bit_equal_frac": (s == s_ref).double().mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--check-tokens", type=int, default=1024,
                    help="reference prefix (rounded down to a multiple of 16)")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-sweep", action="store_true", help="time the default launch knobs only")
    ap.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--budget", type=float, default=165.0,
                    help="seconds for the whole run; reference checks shrink to fit")
    ap.add_argument("--out", default=os.environ.get("OUT") or "reports/emulate")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU dry run of this script with the Triton interpreter, tiny shapes")
    args = ap.parse_args()
    t0 = time.time()
    if not SMOKE and not torch.cuda.is_available():
        sys.exit("emulate_check needs a CUDA device (or --smoke for a CPU dry run)")
    torch.backends.cuda.matmul.allow_tf32 = False
    presets = [p for p in args.presets.split(",") if p]
    layers = [lay for lay in args.layers.split(",") if lay]
    for p in presets:
        parse_config(p)
    import triton

    report: dict = {
        "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke run)",
        "torch": torch.__version__,
        "triton": triton.__version__, "tokens": args.tokens, "batch": 1, "act_dtype": "bf16",
        "shapes": {"gdn": GDN_SHAPE, "mamba2": M2_SHAPE}, "results": {}, "sweeps": {},
    }

    # (1) compile every variant in parallel
    jobs = []
    for layer in layers:
        for p in presets:
            fam = family(p)
            jobs.append((layer, p, VARIANTS[layer, fam][0]))
            if not args.no_sweep and p in SWEEP_PRESETS[fam]:
                jobs += [(layer, p, k) for k in VARIANTS[layer, fam][1:]]
    report["compile"] = precompile(jobs, 1 if SMOKE else args.workers)
    print(f"compiled {len(jobs)} kernels in {report['compile']['seconds']} s "
          f"({args.workers} workers)", flush=True)
    for k, e in report["compile"]["errors"].items():
        print(f"  compile error {k}: {e}")

    C = max(16, args.check_tokens // 16 * 16)
    kept: dict = {}  # per layer: S0, the inputs' first C tokens, per preset (knobs, y[:C])
    for layer in layers:
        S0, inp = make_inputs(layer, args.tokens, DEV)

        def timed(p: str, knobs, S0=S0, inp=inp, layer=layer):
            box = {}

            def fn() -> None:
                box["out"] = run_kernel(layer, p, knobs, S0, inp)

            ms = time_call(fn, args.reps)
            y = box["out"][0][:, :C].clone()
            return min(ms), y, ms

        # (3) launch variants on representative presets; each swept preset then runs its
        # fastest, the others the library's defaults
        own: dict = {}
        if not args.no_sweep:
            for fam in ("conv", "window"):
                for p in [p for p in SWEEP_PRESETS[fam] if p in presets]:
                    row = {}
                    for knobs in VARIANTS[layer, fam]:
                        row[knobs] = round(timed(p, knobs)[0], 2)
                        report["sweeps"].setdefault(layer, []).append(
                            {"family": fam, "preset": p, "knobs": knob_text(knobs),
                             "ms": row[knobs]})
                        print(f"  sweep {layer:6s} {p:20s} {knob_text(knobs):36s} "
                              f"{row[knobs]:8.2f} ms", flush=True)
                    own[p] = min(row, key=row.get)
        # (2) every preset over the whole sequence
        outs = {}
        for p in presets:
            knobs = own.get(p, DEFAULT)
            ms, y_prefix, all_ms = timed(p, knobs)
            outs[p] = (knobs, y_prefix)
            res = {"config": str(PRESETS[p]), "ms": round(ms, 3),
                   "ms_all": [round(m, 3) for m in all_ms],
                   "ns_per_token": round(ms * 1e6 / args.tokens, 1),
                   "knobs": knob_text(knobs)}
            if layer == "gdn":
                res["within_budget"] = ms * 131072 / args.tokens <= GDN_BUDGET_MS
            report["results"].setdefault(layer, {})[p] = res
            print(f"{layer:6s} {p:20s} {ms:9.2f} ms  ({res['ns_per_token']} ns/token, "
                  f"{knob_text(knobs)})", flush=True)
        prefix = {k: v[:, :C].contiguous() if isinstance(v, torch.Tensor) and v.dim() > 1 else v
                  for k, v in inp.items()}
        kept[layer] = (S0, prefix, outs)
        del inp, timed
        if DEV == "cuda":
            torch.cuda.empty_cache()

    # (4) agreement with the reference on a prefix, shortened to fit the time budget
    todo = [(layer, p) for layer in layers for p in presets]
    ref_s_per_token = 0.0  # the slowest seen so far: a conservative estimate
    for i, (layer, p) in enumerate(todo):
        S0, prefix, outs = kept[layer]
        res = report["results"][layer][p]
        n = C
        if ref_s_per_token:
            left = args.budget - (time.time() - t0)
            n = min(C, int(left / (len(todo) - i) / ref_s_per_token) // 16 * 16)
        if n < 16:
            res["check"] = "skipped: time budget"
            print(f"  check {layer:6s} {p:20s} skipped (time budget)", flush=True)
            continue
        part = {k: v[:, :n] if isinstance(v, torch.Tensor) and v.dim() > 1 else v
                for k, v in prefix.items()}
        knobs, y_prefix = outs[p]
        y_k, s_k = run_kernel(layer, p, knobs, S0, part)
        sync()
        t = time.time()
        y_r, s_r = run_reference(layer, p, S0, part)
        sync()
        dt = time.time() - t
        ref_s_per_token = max(ref_s_per_token, dt / n)
        m = compare(PRESETS[p], y_k, s_k, y_r, s_r)
        m["tokens"] = n
        m["prefix_of_full_run_equal"] = bool(torch.equal(y_k, y_prefix[:, :n]))
        m["reference_seconds"] = round(dt, 2)
        res["check"] = m
        print(f"  check {layer:6s} {p:20s} {n:5d} tok: y rel {m['y_rel']:.1e} "
              f"(first window {m['y_rel_first_window']:.1e}), ckpt differ "
              f"{m['ckpt_differ_frac']:.2e}, bit-equal {m['ckpt_bit_equal_frac']:.4f}, "
              f"full-run prefix equal {m['prefix_of_full_run_equal']}  [ref {dt:.1f} s]",
              flush=True)

    report["seconds"] = round(time.time() - t0, 1)
    _print_table(report, layers, presets)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "emulate_check.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path} ({report['seconds']} s total)")


def _print_table(report: dict, layers: list[str], presets: list[str]) -> None:
    print(f"\n{report['device']}, {report['tokens']} tokens, batch 1, bf16 activations")
    head = f"{'preset':20s}" + "".join(f" | {lay + ' ms':>10s} | {'y rel':>8s} | "
                                       f"{'ckpt diff':>9s}" for lay in layers)
    print(head)
    print("-" * len(head))
    for p in presets:
        row = f"{p:20s}"
        for lay in layers:
            r = report["results"].get(lay, {}).get(p, {})
            c = r.get("check") if isinstance(r.get("check"), dict) else {}
            flag = "*" if lay == "gdn" and r and not r.get("within_budget", True) else " "
            row += (f" | {r.get('ms', float('nan')):9.2f}{flag} | {c.get('y_rel', float('nan')):8.1e}"
                    f" | {c.get('ckpt_differ_frac', float('nan')):9.2e}")
        print(row)
    print(f"(* GDN over the {GDN_BUDGET_MS:.0f} ms budget for 131,072 tokens; y rel: output "
          "relative error vs the reference on the checked prefix; ckpt diff: fraction of "
          "checkpoint elements beyond float32 noise)")


if __name__ == "__main__":
    main()
