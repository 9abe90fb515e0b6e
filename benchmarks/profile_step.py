"""Device time of each launch of one decode step (a flush step: every row's cursor at L-1,
and a non-flush step), from torch.profiler over 10 eager steps. CUDA only.

    python benchmarks/profile_step.py
    python benchmarks/profile_step.py --cases qwen3.5-122b-a10b:nvfp4-read/fp32 --batch 1
    python benchmarks/profile_step.py --batch 256 --cases nemotron-3-super-120b:replay-fp32 \
        --knobs '{"flush_first": false}'

With ``--plain MODE`` it only runs five eager steps of each case (MODE ``flush``: every row
flushing, ``nonflush``: none, ``step``: a conventional preset's step), for a profiler that
picks kernels itself, e.g. Nsight Compute (reports/kernels/ncu_profiles.txt):

    ncu --clock-control none -k regex:_mamba2_nonflush --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section LaunchStats --section ComputeWorkloadAnalysis \
        python3 benchmarks/profile_step.py --plain nonflush --batch 256 \
        --cases nemotron-3-super-120b:nvfp4-read/fp16-sr
    python3 tools/ncu_summary.py ncu.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = ["qwen3.5-122b-a10b:nvfp4-read/fp32", "qwen3.5-122b-a10b:replay-fp32",
         "qwen3.5-122b-a10b:shared-nvfp4", "qwen3.5-4b:nvfp4-read/fp16-sr",
         "nemotron-3-super-120b:nvfp4-read/fp16-sr", "nemotron-3-super-120b:replay-fp32"]


def plain_steps(shape, batch: int, cfg, mode: str, knobs: dict | None = None) -> None:
    """Five eager decode steps of one kind, nothing timed."""
    import torch
    from decode import Workload

    if (mode == "step") != (cfg.L == 1):
        raise SystemExit(f"--plain {mode} needs a {'conventional' if mode == 'step' else 'ReplaySSM'} "
                         f"preset")
    w = Workload(shape, batch, cfg, steps=max(cfg.L, 2))
    if mode != "step":
        w.cache.cursor.fill_(cfg.L - 1 if mode == "flush" else 0)
    for _ in range(5):
        w.step(0, advance=mode == "step", **(knobs or {}))
    torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=CASES, help="shape:preset pairs")
    ap.add_argument("--batch", nargs="*", type=int, default=[1, 256])
    ap.add_argument("--plain", choices=["flush", "nonflush", "step"], default=None,
                    help="only run five eager steps of this kind per case (for ncu)")
    ap.add_argument("--knobs", type=json.loads, default={},
                    help='step knobs as JSON, e.g. \'{"flush_first": false}\' (printed on each line)')
    args = ap.parse_args(argv)
    import torch
    from decode import Workload
    from torch.profiler import ProfilerActivity, profile

    from replayssm_quant.precision import PRESETS, SHAPES

    for batch in args.batch:
        for case in args.cases:
            s, name = case.split(":", 1)
            cfg = PRESETS[name]
            if args.plain:
                plain_steps(SHAPES[s], batch, cfg, args.plain, args.knobs)
                continue
            if cfg.L == 1:
                raise SystemExit(f"{name} is conventional: it has no flush step to profile")
            w = Workload(SHAPES[s], batch, cfg, steps=cfg.L)
            for cur, tag in ((cfg.L - 1, "flush"), (3, "nonflush")):
                w.cache.cursor.fill_(cur)
                for _ in range(3):
                    w.step(0, advance=False, **args.knobs)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        w.step(0, advance=False, **args.knobs)
                    torch.cuda.synchronize()
                parts = [f"{e.key.replace('_kernel', '')}={e.device_time:.1f}"
                         for e in prof.key_averages() if e.count >= 10 and "kernel" in e.key]
                knobs = f" {json.dumps(args.knobs)}" if args.knobs else ""
                print(f"B={batch:3d} {s:22s} {name:20s}{knobs} {tag:8s} " + " ".join(sorted(parts)),
                      flush=True)
            del w
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
