"""NaN inputs at the paper shapes: a decode step whose inputs hold NaNs must report exactly the
NaNs it writes to the checkpoint (``cache.nan_count``), and a finite step none. Every
ReplaySSM preset is checked on its flush step (every row's cursor at L-1), where the new
checkpoint is written; conventional presets on their one step.

    python benchmarks/nan_counts.py                                # four shapes, batch 256
    python benchmarks/nan_counts.py --configs replay-fp32 fp16-sr --batch 1

Prints one line per (shape, preset): the (written, reported) counts of the finite step and of
the step with planted NaNs; exits with 1 when any differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import Workload  # noqa: E402

from replayssm_quant.precision import PRESETS, SHAPES  # noqa: E402

CONFIGS = ("replay-fp32", "nvfp4-read/fp16-sr", "fp32", "fp16-sr")


def count_pair(w: Workload, planted: bool) -> tuple[int, int]:
    """(NaNs in the checkpoint after one step, NaNs the step reported), with NaNs planted in
    two rows' inputs (a whole head of one row, part of a head of another) when ``planted``."""
    cfg, cache = w.cfg, w.cache
    if cfg.L > 1:
        cache.cursor.fill_(cfg.L - 1)
    cache.nan_count.zero_()
    key = "x" if w.shape.kind == "mamba2" else "v"
    a = w.inputs[0]
    saved = a[key].clone()
    if planted:
        a[key][min(3, w.batch - 1), w.shape.heads - 1] = float("nan")
        a[key][w.batch // 2, 0, :7] = float("nan")
    w.step(0, advance=False)
    a[key].copy_(saved)
    if cache.ckpt.data.is_cuda:
        torch.cuda.synchronize()
    written = int(torch.isnan(cache.ckpt.data.float()).sum())
    return written, int(cache.nan_count.sum())


def check(shape_name: str, preset: str, batch: int, device: str = "cuda") -> bool:
    """Print and return whether a finite step reports 0 and a NaN step its exact count."""
    w = Workload(SHAPES[shape_name], batch, PRESETS[preset], steps=1, device=device)
    finite, nans = count_pair(w, False), count_pair(w, True)
    ok = finite == (0, 0) and nans[0] == nans[1] > 0
    print(f"nan {'ok ' if ok else 'BAD'} {shape_name:22s} {preset:20s} "
          f"finite {finite} planted {nans}", flush=True)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(PRESETS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cuda", help="cuda (the kernels) or cpu (a dry run)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {sorted(SHAPES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU (use --device cpu for a dry run)")
    ok = [check(s, c, args.batch, args.device) for s in args.shapes for c in args.configs]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
