"""Every preset's decode step against the conventional FP32 step of the same process, at
batch 1 and 256, with a step knob off and on (``--knob``: the cursor advance inside the flush
launch, the ring products inside the non-flush launch, or the whole step as one launch), and
an optional batch-1 sweep of the non-flush tile (rows x warps). CUDA only.

    python benchmarks/compare_steps.py --sweep                        # this checkout
    git worktree add /tmp/old <commit>
    python benchmarks/compare_steps.py --root /tmp/old --tag old      # an older checkout
    python benchmarks/compare_steps.py --knob fuse_prep --batches 1 2 4 8 16 \
        --b256 fp32 replay-fp32 nvfp4-read/fp16-sr nvfp4-read/fp32

The conventional step is timed again after each shape's presets ("conv again"): small-batch
steps move by several microseconds within a process, and the pair shows by how much.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

SHAPES_ORDER = ["nemotron-3-nano-4b", "nemotron-3-super-120b", "qwen3.5-4b", "qwen3.5-122b-a10b"]
SWEEP_CONFIGS = ("replay-fp32", "nvfp4-read/fp16-sr", "nvfp4-read/fp32")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                    help="checkout whose replayssm_quant and benchmarks/decode.py are timed")
    ap.add_argument("--tag", default="new", help="label printed on every line")
    ap.add_argument("--sweep", action="store_true", help="also sweep batch-1 non-flush tiles")
    ap.add_argument("--b256", nargs="*", default=["fp32", "replay-fp32", "nvfp4-read/fp16-sr",
                                                  "nvfp4-read/fp32"],
                    help="presets timed at batches above 1 (every preset runs at batch 1)")
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 256])
    ap.add_argument("--knob", default="fuse_advance",
                    choices=["fuse_advance", "fuse_prep", "one_launch"],
                    help="the boolean step knob timed off and on")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=14)
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "benchmarks"))
    from decode import copy_bandwidth, measure, precompile

    from replayssm_quant.kernels import mamba2 as km
    from replayssm_quant.precision import PRESETS, SHAPES

    # older checkouts without the knob run their only variant
    has_fuse = args.knob in inspect.signature(km.mamba2_decode_step).parameters
    fuses = [False, True] if has_fuse else [None]

    def kw_of(f):
        return {} if f is None else {args.knob: f}

    jobs = [(s, cfg, kw_of(f), 0, "cuda") for s in SHAPES_ORDER for cfg in PRESETS.values()
            for f in (fuses if cfg.L > 1 else [None])]
    sweep = []
    if args.sweep:
        for s in SHAPES_ORDER:
            mk = "block_p" if SHAPES[s].kind == "mamba2" else "block_v"
            sweep += [(s, PRESETS[name], {mk: b, "num_warps": w, **kw_of(fuses[-1])}, 0, "cuda")
                      for name in SWEEP_CONFIGS for b in (8, 16, 32, 64) for w in (1, 2, 4)]
    precompile(jobs + sweep, args.workers)
    print(f"[{args.tag}] copy {copy_bandwidth() / 1e12:.3f} TB/s", flush=True)
    for batch in args.batches:
        for s in SHAPES_ORDER:
            conv = measure(SHAPES[s], batch, PRESETS["fp32"], args.reps)["window_us"]
            for name, cfg in PRESETS.items():
                if batch > 1 and name not in args.b256:
                    continue
                for f in (fuses if cfg.L > 1 else [None]):
                    r = (dict(window_us=conv, nonflush_us=conv, flush_us=conv) if name == "fp32"
                         else measure(SHAPES[s], batch, cfg, args.reps, **kw_of(f)))
                    print(f"[{args.tag}] B={batch:3d} {s:22s} {name:20s} fuse={f!s:5s} "
                          f"win {r['window_us']:7.1f} nf {r['nonflush_us']:7.1f} "
                          f"fl {r['flush_us']:7.1f} vs conv {conv / r['window_us']:.2f}x", flush=True)
            again = measure(SHAPES[s], batch, PRESETS["fp32"], args.reps)["window_us"]
            print(f"[{args.tag}] B={batch:3d} {s:22s} conv again {again:7.1f}", flush=True)
    for s, cfg, kw, _, _ in sweep:
        r = measure(SHAPES[s], 1, cfg, args.reps, **kw)
        print(f"[{args.tag}] sweep B=1 {s:22s} {cfg.name:20s} {kw} win {r['window_us']:6.1f} "
              f"nf {r['nonflush_us']:6.1f} fl {r['flush_us']:6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
