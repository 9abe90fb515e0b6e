"""Where a ReplaySSM non-flush step's time goes (CUDA): 16 non-flush steps to a CUDA graph with
every cursor held at 0 (no ring record read, no advance), timed whole, without the flush
launch, and without both the flush and the ring-products launches (their kernels replaced by
no-ops, so the outputs are wrong and only the times mean something). The differences are
what each launch costs the step, gaps between launches included. The ring-products launch is
never left out alone: it also builds the flush list the flush launch reads.

    python benchmarks/launch_probe.py                       # batch 256, two presets, four shapes
    python benchmarks/launch_probe.py --batch 512 --configs replay-fp32

Each line: us per step for ``whole``, ``no_flush`` and ``kernel`` (the non-flush kernel alone).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import Workload, copy_bandwidth, time_graph  # noqa: E402

from replayssm_quant.kernels import gdn, mamba2  # noqa: E402
from replayssm_quant.precision import PRESETS, SHAPES  # noqa: E402

CONFIGS = ("replay-fp32", "nvfp4-read/fp16-sr")
VARIANTS = {"whole": (False, False), "no_flush": (False, True), "kernel": (True, True)}
STEPS = 16


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextmanager
def leave_out(kind: str, prep: bool, flush: bool):
    """Replace the ring-products kernel and / or the persistent flush launch of a decode step
    by no-ops while the context is open. Leaving out the products but not the flush is
    refused: the flush would walk a flush list nobody wrote."""
    if prep and not flush:
        raise ValueError("the ring-products launch builds the flush list: leave out the flush too")
    mod = mamba2 if kind == "mamba2" else gdn
    name = "_mamba2_prep_kernel" if kind == "mamba2" else "_gdn_prep_kernel"
    saved = getattr(mod, name), mod.launch_persistent
    try:
        if prep:
            setattr(mod, name, _NoLaunch())
        if flush:
            mod.launch_persistent = lambda *args, **kwargs: None
        yield
    finally:
        setattr(mod, name, saved[0])
        mod.launch_persistent = saved[1]


def probe(shape_name: str, preset: str, batch: int, reps: int = 15,
          device: str = "cuda") -> dict[str, float]:
    """Microseconds per non-flush step of each variant (``VARIANTS``)."""
    shape, cfg = SHAPES[shape_name], PRESETS[preset]
    if cfg.L == 1:
        raise SystemExit(f"{preset} has no non-flush step (a conventional preset)")
    if mamba2.fused_prep_default(batch):
        raise SystemExit(f"at batch {batch} a step forms its ring products in its own launch "
                         f"(mamba2.fused_prep_default): there is no launch to leave out")
    w = Workload(shape, batch, cfg, steps=STEPS, device=device)
    out = {}
    for tag, (prep, flush) in VARIANTS.items():
        w.cache.cursor.zero_()

        def steps():
            for i in range(STEPS):
                w.step(i, advance=False)

        with leave_out(shape.kind, prep, flush):
            out[tag] = time_graph(steps, reps) / STEPS * 1e6
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(PRESETS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {sorted(SHAPES)}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda needs a GPU (use --device cpu for a dry run)")
        print(f"copy {copy_bandwidth() / 1e12:.3f} TB/s", flush=True)
    for s in args.shapes:
        for c in args.configs:
            t = probe(s, c, args.batch, args.reps, args.device)
            print(f"B={args.batch} {s:22s} {c:20s} "
                  + " ".join(f"{k}={v:.1f}" for k, v in t.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
