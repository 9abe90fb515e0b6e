"""Resolve the launch plan of every shape, preset and batch size for this machine's GPU and
for a named target (``kernels.plan.TARGETS``), and report where they differ beyond the
target itself: a named target is only useful if it plans what that GPU runs.

    python3 benchmarks/plan_check.py --target h200     # on an H200
"""

from __future__ import annotations

import argparse
import itertools

import torch

from replayssm_quant.kernels.plan import step_plan
from replayssm_quant.precision import PRESETS, SHAPES


def _comparable(plan) -> dict:
    d = plan.to_dict()
    d.pop("target")
    for ln in d["launches"]:  # the persistent grid names the SM count
        ln.pop("grid")
        ln.pop("programs")
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h200")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4, 16, 64, 256, 512])
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    n = bad = 0
    for sh, c, b in itertools.product(SHAPES, PRESETS, args.batches):
        n += 1
        if _comparable(step_plan(sh, c, b, "cuda")) != _comparable(step_plan(sh, c, b, args.target)):
            bad += 1
            print("differs", sh, c, b)
    print(f"plans on cuda == {args.target}: {n - bad}/{n}")


if __name__ == "__main__":
    main()
