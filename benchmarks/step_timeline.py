"""Where a window's time goes (CUDA): one window of L steps captured in a CUDA graph, as
``decode.py`` times it, replayed under torch.profiler; every kernel's start and end give,
per step of the window, each launch's device time, the gaps between them and the step's
span (start of its first launch to the start of the next step's). Steps with PDL overlap
their launches, so a launch's time and the step's span are reported apart.

    python benchmarks/step_timeline.py --batch 256 \
        --cases nemotron-3-super-120b:replay-fp32 nemotron-3-nano-4b:replay-fp32
    python benchmarks/step_timeline.py --cases qwen3.5-4b:replay-fp32 --knobs '{"pdl": false}'

The graph is warmed before profiling; CUPTI's tracing adds no launches but may stretch the
gaps slightly, so compare spans with ``decode.py``'s graph-timed window of the same run
(``--timed``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def kernel_spans(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every device kernel in a profile, in start order."""
    from torch.autograd import DeviceType

    out = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
           if e.device_type == DeviceType.CUDA and "memcpy" not in e.name.lower()
           and "memset" not in e.name.lower() and "sleep" not in e.name.lower()]
    return sorted(out, key=lambda t: t[1])


def short(name: str) -> str:
    """A kernel's name without the Triton decorations: ``_mamba2_prep_kernel`` -> ``prep``."""
    n = name.split("(")[0].strip("_")
    for pre in ("mamba2_", "gdn_"):
        n = n.replace(pre, "")
    return n.replace("_kernel", "")


def split_steps(spans, launches_per_step: int, steps: int):
    """Group the kernels of consecutive replays into steps of ``launches_per_step`` kernels;
    a replay of ``steps`` steps must hold exactly ``steps * launches_per_step`` kernels."""
    per = launches_per_step * steps
    if len(spans) % per:
        raise ValueError(f"{len(spans)} kernels are not whole replays of {steps} steps x "
                         f"{launches_per_step} launches")
    reps = [spans[i:i + per] for i in range(0, len(spans), per)]
    return [[rep[s * launches_per_step:(s + 1) * launches_per_step] for s in range(steps)]
            for rep in reps]


def summarize(replays, L: int) -> dict:
    """Median over replays of, per step position: each launch's device time, its start after
    the step's first launch, and the step's span (to the next step's first start; the last
    step of a replay to its last end)."""
    out = []
    for s in range(L):
        rows = []
        for rep in replays:
            step = rep[s]
            t0 = step[0][1]
            nxt = rep[s + 1][0][1] if s + 1 < L else max(k[2] for k in step)
            rows.append(dict(span=nxt - t0, **{f"{short(k[0])}#{i}": (k[1] - t0, k[2] - k[1])
                                               for i, k in enumerate(step)}))
        med = dict(span=statistics.median(r["span"] for r in rows))
        for key in rows[0]:
            if key != "span":
                med[key] = tuple(statistics.median(r[key][j] for r in rows) for j in (0, 1))
        out.append(med)
    return dict(steps=out)


def profile_case(case: str, batch: int, replays: int, knobs: dict, timed: bool) -> dict:
    """``summarize`` of ``replays`` profiled replays of one window of ``case``
    (``shape:preset``), with the graph-timed window (us per step) when ``timed``."""
    import torch
    from decode import Workload, time_graph
    from torch.profiler import ProfilerActivity, profile

    from replayssm_quant.precision import PRESETS, SHAPES

    s, name = case.split(":", 1)
    cfg = PRESETS[name]
    if cfg.L == 1:
        raise SystemExit(f"{name} is conventional: a window needs a ReplaySSM preset")
    w = Workload(SHAPES[s], batch, cfg, steps=cfg.L)

    def window():
        for i in range(cfg.L):
            w.step(i, **knobs)

    w.cache.cursor.zero_()
    t = time_graph(window, reps=10) / cfg.L * 1e6 if timed else None
    w.cache.cursor.zero_()
    g = torch.cuda.CUDAGraph()
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        window()  # compiled and warm; the cursor is back at 0 after a whole window
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        window()
    for _ in range(30):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
            torch.cuda.synchronize()
    spans = kernel_spans(prof)
    summ = summarize(split_steps(spans, len(spans) // (replays * cfg.L), cfg.L), cfg.L)
    summ["timed_window_us"] = t
    summ["window_span_us"] = sum(x["span"] for x in summ["steps"]) / cfg.L
    return summ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["nemotron-3-super-120b:replay-fp32"],
                    help="shape:preset pairs (ReplaySSM presets)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--replays", type=int, default=5, help="profiled replays of the window")
    ap.add_argument("--knobs", type=json.loads, default={}, help="step knobs as JSON")
    ap.add_argument("--timed", action="store_true",
                    help="also time the window graph without the profiler (decode.time_graph)")
    ap.add_argument("--json", default=None, help="write every summary to this file")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("step_timeline.py profiles CUDA graph replays: it needs a CUDA GPU")
    results = {}
    for case in args.cases:
        summ = profile_case(case, args.batch, args.replays, args.knobs, args.timed)
        results[case] = summ
        knobs = f" {json.dumps(args.knobs)}" if args.knobs else ""
        timed = summ["timed_window_us"]
        print(f"== B={args.batch} {case}{knobs}: window {summ['window_span_us']:.1f} us/step "
              f"profiled" + (f", {timed:.1f} graph-timed" if timed else ""), flush=True)
        for i, step in enumerate(summ["steps"]):
            parts = " ".join(f"{k.split('#')[0]}@{v[0]:.1f}+{v[1]:.1f}"
                             for k, v in step.items() if k != "span")
            print(f"  step {i:2d} span {step['span']:7.1f}  {parts}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
