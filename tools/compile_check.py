"""Compile the decode and emulator kernels for an NVIDIA GPU on any machine, under whatever
Triton runs this script: the variants the library launches by default on the paper shapes
(each kernel family in every storage format it handles), as ``tools/sass_stats.py`` builds
them. No GPU is needed: Triton ships ptxas.

Why: CI runs the kernels under Triton's interpreter and its own newer Triton, which accept
code that the GPU machine's Triton (3.6) refuses to compile (a jit helper's string default
broke the GDN emulator that way). CI runs this script in an environment with that version:

    python -m venv .venv-t36 && .venv-t36/bin/pip install triton==3.6.0 torch==2.13.0 numpy
    .venv-t36/bin/python tools/compile_check.py --jobs 2

Exits 1 if any variant fails to compile, naming it and the error's first lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (target, preset, rows, warps, options): the library's default launches (mamba2_flush_knobs,
# gdn_flush_knobs, *_step_knobs, default_fold_precision) plus the one-launch and programmatic
# launch forms of the steps
VARIANTS: list[tuple[str, str, int, int, dict]] = [
    ("mamba2-conv", "fp32", 16, 1, {}),
    ("mamba2-conv", "fp16-sr", 8, 2, {}),
    ("mamba2-conv", "bf16-sr", 8, 2, {"one_launch": True}),
    ("gdn-conv", "fp32", 16, 1, {}),
    ("gdn-conv", "fp16-sr", 8, 2, {}),
    ("gdn-conv", "bf16-sr", 32, 8, {"one_launch": True}),
    ("mamba2-nonflush", "replay-fp32", 64, 1, {"pdl": True}),
    ("mamba2-nonflush", "replay-fp32", 16, 1, {"one_launch": True}),
    ("mamba2-nonflush", "nvfp4-read/fp16-sr", 64, 1, {}),
    ("mamba2-nonflush", "nvfp4-read/fp16-sr", 64, 1, {"nvfp4_decode": "mma", "pdl": True}),
    ("mamba2-prep", "nvfp4-read/fp16-sr", 2, 4, {"nvfp4_decode": "mma", "pdl": True}),
    ("mamba2-nonflush", "nvfp4-read/fp16-sr", 16, 1, {"one_launch": True}),
    ("mamba2-nonflush", "fp8-read/fp32", 64, 1, {}),
    ("mamba2-nonflush", "shared-nvfp4", 64, 1, {"nvfp4_decode": "words"}),
    ("gdn-nonflush", "replay-fp32", 32, 1, {"pdl": True}),
    ("gdn-nonflush", "replay-fp32", 8, 1, {"one_launch": True}),
    ("gdn-nonflush", "nvfp4-read/fp16-sr", 64, 1, {}),
    ("gdn-nonflush", "nvfp4-read/fp16-sr", 64, 1, {"nvfp4_decode": "mma", "pdl": True}),
    ("gdn-prep", "nvfp4-read/fp16-sr", 1, 4, {"nvfp4_decode": "mma", "pdl": True}),
    ("gdn-prep", "nvfp4-read/fp16-sr", 2, 4, {"nvfp4_decode": "mma"}),
    ("gdn-nonflush", "nvfp4-read/fp8-sr", 16, 1, {"one_launch": True}),
    ("gdn-nonflush", "fp8-read/fp32", 32, 1, {}),
    ("gdn-nonflush", "shared-fp8", 32, 1, {}),
    ("gdn-nonflush", "fp8-read/fp32", 16, 1, {"one_launch": True, "fp8_decode": "words"}),
    ("mamba2-nonflush", "shared-fp8", 64, 1, {"fp8_decode": "words"}),
    ("mamba2-flush", "replay-fp32", 16, 1, {"fold": "dot", "precision": "bf16x3", "tma": True}),
    ("mamba2-flush", "replay-fp32", 16, 1, {"fold": "dot", "precision": "bf16x3"}),
    ("mamba2-flush", "nvfp4-read/fp16-sr", 16, 2, {"fold": "records"}),
    ("mamba2-flush", "nvfp4-read/fp8-sr", 8, 1, {"fold": "records"}),
    ("mamba2-flush", "nvfp4-read/fp32", 8, 1, {"fold": "records"}),
    ("mamba2-flush", "fp8-read/fp32", 8, 1, {"fold": "records"}),
    ("mamba2-flush", "shared-fp8", 16, 1, {"fold": "dot", "precision": "bf16x3"}),
    ("mamba2-flush", "shared-nvfp4", 8, 1, {"fold": "records"}),
    ("gdn-flush", "replay-fp32", 16, 1, {"fold": "dot", "precision": "bf16x3", "tma": True}),
    ("gdn-flush", "nvfp4-read/fp16-sr", 16, 4, {"fold": "records"}),
    ("gdn-flush", "nvfp4-read/fp16-sr", 32, 8, {"fold": "records"}),  # below batch 64
    ("gdn-flush", "nvfp4-read/fp32", 16, 2, {"fold": "records"}),
    ("gdn-flush", "nvfp4-read/fp8-sr", 16, 4, {"fold": "records"}),
    ("gdn-flush", "nvfp4-read/fp8-sr", 32, 8, {"fold": "records"}),  # below batch 64
    ("gdn-flush", "fp8-read/fp32", 16, 1, {"fold": "records"}),
    ("gdn-flush", "shared-fp8", 16, 1, {"fold": "dot", "precision": "bf16x3"}),
    ("gdn-flush", "shared-nvfp4", 8, 1, {"fold": "records"}),
    ("mamba2-verify-prep", "replay-fp32", 16, 4, {}),
    ("mamba2-verify", "replay-fp32", 32, 4, {}),
    ("mamba2-verify", "nvfp4-read/fp16-sr", 32, 4, {"pdl": True}),
    ("gdn-verify-prep", "nvfp4-read/fp16-sr", 16, 4, {}),
    ("gdn-verify", "replay-fp32", 32, 4, {}),
    ("gdn-verify", "nvfp4-read/fp16-sr", 32, 4, {"pdl": True}),
    ("emulate-gdn-conv", "fp32", 4, 1, {}),
    ("emulate-gdn-conv", "fp16-sr", 4, 1, {}),
    ("emulate-gdn-window", "replay-fp32", 32, 4, {}),
    ("emulate-gdn-window", "nvfp4-read/fp16-sr", 32, 8, {}),
    ("emulate-gdn-window", "shared-fp8", 32, 4, {}),
    ("emulate-gdn-prep", "nvfp4-read/fp8-sr", 16, 4, {}),
]


def label(v: tuple) -> str:
    target, preset, rows, warps, opts = v
    extra = " ".join(f"{k}={val}" for k, val in opts.items())
    return f"{target} {preset} rows {rows} warps {warps}{' ' + extra if extra else ''}"


def compile_one(v: tuple) -> tuple[str, float, str | None]:
    """Compile one variant for sm_90: (label, seconds, None or the error's first lines)."""
    import sass_stats as ss
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target, preset, rows, warps, opts = v
    t0 = time.time()
    try:
        fn, sig, consts = ss.target(target, preset, rows, **opts)
        full = dict(sig, **{k: "constexpr" for k in consts})
        src = ASTSource(fn=fn, signature=full, constexprs=consts,
                        attrs=ss.launch_attrs(fn, sig))
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        err = None
    except Exception as e:  # noqa: BLE001 - any compiler failure is the finding
        err = "\n".join(f"{type(e).__name__}: {e}".splitlines()[-6:])
    return label(v), time.time() - t0, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)),
                    help="compiler processes")
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("-k", metavar="TEXT", default="",
                    help="only the variants whose label contains TEXT")
    a = ap.parse_args()
    variants = [v for v in VARIANTS if a.k in label(v)]
    if a.list:
        print("\n".join(label(v) for v in variants))
        return
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("compile_check compiles kernels: unset TRITON_INTERPRET")
    import triton

    print(f"Triton {triton.__version__}: compiling {len(variants)} kernel variants for sm_90 "
          f"({a.jobs} processes)", flush=True)
    failed = []
    t0 = time.time()
    with ProcessPoolExecutor(a.jobs) as pool:
        for name, secs, err in pool.map(compile_one, variants):
            print(f"  {'FAIL' if err else 'ok  '} {name} ({secs:.1f} s)", flush=True)
            if err:
                failed.append((name, err))
    for name, err in failed:
        print(f"\n{name}:\n{err}")
    print(f"\n{len(variants) - len(failed)} of {len(variants)} compiled in {time.time() - t0:.0f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
