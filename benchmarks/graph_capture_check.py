"""Decode steps whose kernels first run inside a CUDA-graph capture (CUDA).

The persistent flush sizes its grid from the compiled kernel (compiled, loaded and asked for
its occupancy during the capture when the capture is the first call), and nothing in the
default step may copy from host memory. Every case captures a non-flush step and a flush
step, replays them once, and compares outputs and checkpoint with the same two steps run
eagerly on a copy of the cache:

    python benchmarks/graph_capture_check.py

Cases: the first call of the process inside the capture, then for each listed (shape,
preset) the first call of that specialization inside the capture and a capture at a batch
size the eager warm-up did not use (a new persistent-grid key).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode import Workload  # noqa: E402

from replayssm_quant.kernels import persistent  # noqa: E402
from replayssm_quant.precision import PRESETS, SHAPES  # noqa: E402

CASES = [("nemotron-3-super-120b", "nvfp4-read/fp16-sr"), ("qwen3.5-4b", "replay-fp32"),
         ("nemotron-3-nano-4b", "shared-nvfp4"), ("qwen3.5-122b-a10b", "nvfp4-read/fp32")]


def check(sname: str, cname: str, batch: int, warm_batch: int | None) -> str:
    """Capture two steps (non-flush, flush) at ``batch`` after eager steps at ``warm_batch``
    (None: none), replay, compare with eager steps on a copy of the cache."""
    cfg = PRESETS[cname]
    if warm_batch:
        warm = Workload(SHAPES[sname], warm_batch, cfg, steps=cfg.L, device="cuda")
        for i in range(cfg.L):
            warm.step(i)
        torch.cuda.synchronize()
    w = Workload(SHAPES[sname], batch, cfg, steps=cfg.L, device="cuda")
    w.cache.cursor.fill_(cfg.L - 2)
    eager_cache = copy.deepcopy(w.cache)
    n0 = len(persistent._RESIDENT)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, stream=torch.cuda.Stream()):
            outs = [w.step(cfg.L - 2), w.step(cfg.L - 1)]
        g.replay()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - the report is the point
        torch.cuda.synchronize()
        return f"capture FAILED: {type(err).__name__}: {err}"
    queried = len(persistent._RESIDENT) - n0
    w.cache, captured_cache = eager_cache, w.cache
    eager = [w.step(cfg.L - 2), w.step(cfg.L - 1)]
    torch.cuda.synchronize()
    same_y = all(torch.equal(a, b) for a, b in zip(outs, eager, strict=True))
    same_ck = torch.equal(captured_cache.ckpt.data, eager_cache.ckpt.data)
    return (f"captured; {queried} persistent grid(s) sized in the capture; replay == eager: "
            f"outputs {same_y}, checkpoint {same_ck}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--other-batch", type=int, default=40,
                    help="capture batch after eager steps at --batch (not a multiple of 16: "
                         "a new persistent-grid key)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    bad = 0
    for sname, cname in CASES:
        for label, batch, warm in (("first call in capture", args.batch, None),
                                   (f"eager at {args.batch}, capture at {args.other_batch}",
                                    args.other_batch, args.batch)):
            res = check(sname, cname, batch, warm)
            bad += "FAILED" in res or "False" in res
            print(f"{sname:22s} {cname:20s} {label:32s} {res}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
