"""Does a step's time depend on what the process ran and allocated before it?

Times the conventional FP32 step and the ReplaySSM FP32 window of some shapes at one batch
(``decode.measure``, CUDA graphs) four times in one process: first, after other shapes'
workloads, after ``torch.cuda.empty_cache()``, and once more (``--again N``: N more times, each
after ``empty_cache``, so the states land on memory the driver hands out anew). A number
that moves between these points depends on the process's state rather than on the kernel.
For the GDN shapes FLA's fused recurrent decode of the same FP32 state is timed beside them
where it is installed: a peer kernel that holds its time while ours moves points at our
kernel, not at the machine. (``probe_r72`` ran
with the harness's old 3-replay warm-up; ``probe_timing.py ramp`` found the cause: the first
~10 replays of a conventional step's graph on a fresh state are ~10% slower.)

    python3 benchmarks/probe_process_state.py                  # reports/kernels/probe_r72_conv_alloc.log
    python3 benchmarks/probe_process_state.py --shapes qwen3.5-4b --churn nemotron-3-super-120b
    python3 benchmarks/probe_process_state.py --shapes qwen3.5-122b-a10b --churn qwen3.5-4b \
        --batch 512 --again 6                 # reports/kernels/probe_r260_conv_alloc.log
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import measure, measure_fla  # noqa: E402

from replayssm_quant.precision import PRESETS, SHAPES  # noqa: E402

CHURN_CONFIGS = ("fp32", "replay-fp32", "nvfp4-read/fp16-sr", "shared-fp8")


def probe(shapes: list[str], churn: list[str], batch: int, reps: int,
          device: str = "cuda", again: int = 1) -> list[tuple[str, dict]]:
    """(point, {shape: (conventional us, ReplaySSM FP32 window us[, FLA us])}) at the four
    points and ``again`` - 1 more, each after ``empty_cache``."""
    def times() -> dict:
        out = {}
        for s in shapes:
            t = tuple(round(measure(SHAPES[s], batch, PRESETS[c], reps, device=device)
                            ["window_us"], 1) for c in ("fp32", "replay-fp32"))
            fla = measure_fla(SHAPES[s], batch, reps) \
                if device == "cuda" and SHAPES[s].kind == "gdn" else None
            out[s] = t if fla is None else (*t, round(fla, 1))
        return out

    out = [("fresh", times())]
    for s in churn:
        for c in CHURN_CONFIGS:
            measure(SHAPES[s], batch, PRESETS[c], reps, device=device)
    out.append(("after " + " ".join(churn), times()))
    if device == "cuda":
        torch.cuda.empty_cache()
    out.append(("after empty_cache", times()))
    out.append(("again", times()))
    for k in range(2, again + 1):
        if device == "cuda":
            torch.cuda.empty_cache()
        out.append((f"again {k}, after empty_cache", times()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["qwen3.5-4b", "qwen3.5-122b-a10b"],
                    choices=list(SHAPES))
    ap.add_argument("--churn", nargs="*", default=["nemotron-3-nano-4b", "nemotron-3-super-120b"],
                    choices=list(SHAPES), help="shapes whose workloads run in between")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--again", type=int, default=1,
                    help="times the last point is taken, each after empty_cache (default 1)")
    a = ap.parse_args()
    if a.again < 1:
        ap.error("--again takes a count of 1 or more")
    if not torch.cuda.is_available():
        sys.exit("probe_process_state times CUDA graphs: it needs a GPU")
    print("point {shape: (conventional FP32 us, ReplaySSM FP32 window us[, FLA us])}", flush=True)
    for point, t in probe(a.shapes, a.churn, a.batch, a.reps, again=a.again):
        print(point, t, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
