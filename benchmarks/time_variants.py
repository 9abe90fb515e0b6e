"""Time a list of (shape, preset, step knobs) variants of one checkout at one batch size
(CUDA): the window average with its non-flush and flush steps, or the flush step alone.
Run it once per checkout to compare two of them on the same GPU, e.g.

    git worktree add /tmp/old <commit>
    python benchmarks/time_variants.py --jobs reports/kernels/tune_r40_jobs_window.json \
        --root /tmp/old --tag old
    python benchmarks/time_variants.py --jobs reports/kernels/tune_r40_jobs_new.json

A jobs file is a JSON list of ``[shape, preset, knobs, mode]``: ``preset`` is a preset name,
optionally with another window length as in ``decode.py``'s rows (``replay-fp32@L8``);
``knobs`` are keyword arguments of the decode step (``{"flush_warps": 1}``), ``mode`` is
``"window"`` or ``"flush"``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODES = ("window", "flush")


def load_jobs(path: str) -> list[tuple[str, str, dict, str]]:
    """The jobs of a jobs file, checked: known mode, knobs as a mapping."""
    jobs = []
    for i, job in enumerate(json.loads(Path(path).read_text())):
        if len(job) != 4 or job[3] not in MODES or not isinstance(job[2], dict):
            raise SystemExit(f"{path}: job {i} must be [shape, preset, knobs, mode in {MODES}]")
        jobs.append(tuple(job))
    return jobs


def preset_config(name: str):
    """The precision config of a preset name, ``name@L<n>`` for another window length."""
    from dataclasses import replace

    from replayssm_quant.precision import PRESETS

    base, _, tail = name.partition("@L")
    if base not in PRESETS or (tail and not tail.isdigit()):
        raise KeyError(name)
    return replace(PRESETS[base], L=int(tail), name=name) if tail else PRESETS[base]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", required=True, help="JSON list of [shape, preset, knobs, mode]")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                    help="checkout whose replayssm_quant and benchmarks/decode.py are timed")
    ap.add_argument("--tag", default="new", help="label printed on every line")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--resident", action="store_true",
                    help="afterwards, print the resident programs per SM each persistent flush "
                         "kernel was launched with (one line per specialization)")
    args = ap.parse_args(argv)
    jobs = load_jobs(args.jobs)
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "benchmarks"))
    from decode import copy_bandwidth, measure, measure_flush, precompile

    from replayssm_quant.precision import SHAPES

    def known(name: str) -> bool:
        try:
            preset_config(name)
        except KeyError:
            return False
        return True

    unknown = [j for j in jobs if j[0] not in SHAPES or not known(j[1])]
    if unknown:
        raise SystemExit(f"unknown shape or preset in {unknown}")
    precompile([(s, preset_config(c), kw, 0, "cuda") for s, c, kw, _ in jobs], args.workers)
    print(f"{args.tag} copy {copy_bandwidth() / 1e12:.3f} TB/s", flush=True)
    for s, c, kw, mode in jobs:
        head = f"{args.tag} B={args.batch} {s:22s} {c:20s} {json.dumps(kw):50s}"
        if mode == "flush":
            t = measure_flush(SHAPES[s], args.batch, preset_config(c), args.reps, device="cuda", **kw)
            print(f"{head} flush {t:8.1f}", flush=True)
        else:
            m = measure(SHAPES[s], args.batch, preset_config(c), args.reps, device="cuda", **kw)
            print(f"{head} win {m['window_us']:8.1f} nf {m['nonflush_us']:8.1f} "
                  f"fl {m['flush_us']:8.1f}", flush=True)
    if args.resident:
        from replayssm_quant.kernels.persistent import resident_table

        for name, knobs, n in resident_table():
            print(f"{args.tag} resident {name} {json.dumps(knobs)} {n}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
