"""Time a list of (shape, preset, step knobs) variants of one checkout at one batch size
(CUDA): the window average with its non-flush and flush steps, or the flush step alone.
Run it once per checkout to compare two of them on the same GPU, e.g.

    git worktree add /tmp/old <commit>
    python -m benchmarks.tune_decode variants --jobs jobs.json --root /tmp/old --tag old > old.log
    python -m benchmarks.tune_decode variants --jobs jobs.json > new.log

Then ``--compare OLD.log NEW.log`` pairs the two runs' lines and prints a Markdown table: each
variant's window (or flush) time in both, the change, and its ratio to the conventional FP32
step of the same shape, batch and run when the jobs hold one.

A jobs file is a JSON list of ``[shape, preset, knobs, mode]``: ``preset`` is a preset name,
optionally with another window length as in ``benchmarks.decode``'s rows (``replay-fp32@L8``);
``knobs`` are keyword arguments of the decode step (``{"flush_warps": 1}``), ``mode`` is
``"window"``, ``"flush"`` (the window's flush step, ``decode.time_flush``; ``{"advance":
false}`` times the step that holds the cursors instead, as older logs did), ``"verify"`` (a
speculative verify of 8 drafts; ``knobs`` then go to the verify, e.g. ``{"pdl": true}``),
``"stagger"`` (the window average with the rows' cursors spread, so every step flushes a 1/L
share of the rows: ``decode --stagger``) or ``"fla"`` (FLA's fused recurrent decode of the
shape's FP32 state, the peer of a GDN ``fp32``
job: preset ``fp32``, no knobs).
``--layers`` runs each step over several layers' caches, as ``decode --layers`` does.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from inspect import signature
from pathlib import Path

MODES = ("window", "flush", "verify", "stagger", "fla")
VERIFY_T = 8


def load_jobs(path: str) -> list[tuple[str, str, dict, str]]:
    """The jobs of a jobs file, checked: known mode, knobs as a mapping."""
    jobs = []
    for i, job in enumerate(json.loads(Path(path).read_text())):
        if len(job) != 4 or job[3] not in MODES or not isinstance(job[2], dict):
            raise SystemExit(f"{path}: job {i} must be [shape, preset, knobs, mode in {MODES}]")
        if job[3] == "fla" and (job[1] != "fp32" or job[2]):
            raise SystemExit(f"{path}: job {i}: an fla job takes preset 'fp32' and no knobs")
        jobs.append(tuple(job))
    return jobs


_LINE = re.compile(r"^(?P<tag>\S+) B=(?P<batch>\d+) (?P<shape>\S+)\s+(?P<preset>\S+)\s+"
                   r"(?P<knobs>\{.*\})\s+(?:win\s+(?P<win>[\d.]+) nf\s+(?P<nf>[\d.]+) "
                   r"fl\s+(?P<fl>[\d.]+)|(?P<mode>flush|verify|stagger|fla)\s+(?P<flush>[\d.]+))\s*$")


def parse_log(path: str) -> dict[tuple, dict]:
    """The timed lines of a log this script wrote, keyed by (batch, shape, preset, knobs,
    mode): ``win``, ``nf``, ``fl`` in us for a window, ``flush`` for any other mode,
    each the mean over the log's repeats of that variant, and ``n`` the repeats; other lines
    (compile and copy-bandwidth lines, comments) are skipped."""
    runs: dict[tuple, list[dict]] = {}
    for line in Path(path).read_text().splitlines():
        m = _LINE.match(line)
        if m:
            key = (int(m["batch"]), m["shape"], m["preset"], json.dumps(json.loads(m["knobs"])),
                   m["mode"] or "window")
            runs.setdefault(key, []).append(
                {k: float(m[k]) for k in ("win", "nf", "fl", "flush") if m[k] is not None})
    return {key: {**{k: round(sum(r[k] for r in rows) / len(rows), 2) for k in rows[0]},
                  "n": len(rows)} for key, rows in runs.items()}


def compare(old: dict, new: dict) -> str:
    """A Markdown table of the variants both runs timed: time in each (the mean of its
    repeats), the change, and the conventional FP32 step (preset ``fp32`` window, no knobs)
    of the same run over that time: a window's speed-up, or a verify's ratio to one step."""
    def conv(run: dict, b: int, shape: str) -> float | None:
        row = run.get((b, shape, "fp32", "{}", "window"))
        return row["win"] if row else None

    def time_of(row: dict) -> float:
        return row["win"] if "win" in row else row["flush"]

    lines = ["| batch | shape | preset | knobs | mode | old us | new us | change | old x conv "
             "| new x conv |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in [k for k in old if k in new]:
        b, shape, preset, knobs, mode = key
        t0, t1 = time_of(old[key]), time_of(new[key])
        ratios = []
        for run, t in ((old, t0), (new, t1)):
            c = conv(run, b, shape)
            ratios.append(f"{c / t:.2f}x" if c and mode != "flush" else "-")
        lines.append(f"| {b} | {shape} | {preset} | {knobs} | {mode} | {t0:.1f} | {t1:.1f} | "
                     f"{t1 / t0 - 1:+.1%} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def preset_config(name: str):
    """The precision config of a preset name, ``name@L<n>`` for another window length."""
    from dataclasses import replace

    from replayssm_quant.precision import PRESETS

    base, _, tail = name.partition("@L")
    if base not in PRESETS or (tail and not tail.isdigit()):
        raise KeyError(name)
    return replace(PRESETS[base], L=int(tail), name=name) if tail else PRESETS[base]


def _load_decode(root: Path):
    """The decode benchmark module of the checkout at ``root``: this one's, or another's with
    its own ``replayssm_quant`` (the modules already imported from this checkout are dropped
    first, so nothing of this checkout is timed in its place). Older checkouts keep
    ``benchmarks/decode.py`` as a script beside its helpers; newer ones as this package."""
    if root == Path(__file__).resolve().parents[1]:
        import benchmarks.decode as decode

        return decode
    for name in [m for m in sys.modules if m.split(".")[0] in
                 ("replayssm_quant", "benchmarks", "decode", "decode_targets")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    if (root / "benchmarks" / "__init__.py").is_file():
        return importlib.import_module("benchmarks.decode")
    sys.path.insert(0, str(root / "benchmarks"))
    return importlib.import_module("decode")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", help="JSON list of [shape, preset, knobs, mode]")
    ap.add_argument("--compare", nargs=2, metavar=("OLD_LOG", "NEW_LOG"),
                    help="no timing: pair two logs of this script and print a Markdown table")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                    help="checkout whose replayssm_quant and benchmarks/decode.py are timed")
    ap.add_argument("--tag", default="new", help="label printed on every line")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--layers", default="1",
                    help="layers each step runs over in turn, as decode.py --layers ('auto': "
                         "enough that every state comes from HBM); window, stagger and verify "
                         "jobs only")
    ap.add_argument("--resident", action="store_true",
                    help="afterwards, print the resident programs per SM each persistent flush "
                         "kernel was launched with (one line per specialization)")
    args = ap.parse_args(argv)
    if args.compare:
        old, new = (parse_log(p) for p in args.compare)
        if not any(k in new for k in old):
            raise SystemExit(f"{args.compare[0]} and {args.compare[1]} share no timed variant")
        print(compare(old, new))
        return 0
    if not args.jobs:
        ap.error("--jobs is required unless --compare is given")
    jobs = load_jobs(args.jobs)
    layers = args.layers if args.layers == "auto" else (int(args.layers) if args.layers.isdigit() else 0)
    if layers == 0:
        ap.error(f"--layers: expected a positive count or 'auto', not {args.layers!r}")
    lay = {} if layers == 1 else {"layers": layers}  # an older checkout's measure has no layers
    if lay and any(mode == "flush" for *_, mode in jobs):
        ap.error("--layers applies to window, stagger and verify jobs; a flush job times one layer")
    decode = _load_decode(Path(args.root).resolve())
    copy_bandwidth, measure, measure_fla = decode.copy_bandwidth, decode.measure, decode.measure_fla
    measure_flush, measure_verify, precompile = decode.measure_flush, decode.measure_verify, decode.precompile
    SHAPES = decode.SHAPES

    def known(name: str) -> bool:
        try:
            preset_config(name)
        except KeyError:
            return False
        return True

    unknown = [j for j in jobs if j[0] not in SHAPES or not known(j[1])]
    if unknown:
        raise SystemExit(f"unknown shape or preset in {unknown}")
    not_gdn = [j for j in jobs if j[3] == "fla" and SHAPES[j[0]].kind != "gdn"]
    if not_gdn:
        raise SystemExit(f"fla jobs need a GDN shape: {not_gdn}")
    # compiled at the timed batch, whose tiles may differ from batch 1's and 64's; an older
    # checkout's precompile (--root) takes no batches
    at = {"batches": (args.batch,)} if "batches" in signature(precompile).parameters else {}
    precompile([(s, preset_config(c), {"verify": kw} if mode == "verify" else kw,
                 VERIFY_T if mode == "verify" else 0, "cuda") for s, c, kw, mode in jobs
                if mode != "fla"], args.workers, **at)
    print(f"{args.tag} copy {copy_bandwidth() / 1e12:.3f} TB/s", flush=True)
    for s, c, kw, mode in jobs:
        head = f"{args.tag} B={args.batch} {s:22s} {c:20s} {json.dumps(kw):50s}"
        if mode == "flush":
            t = measure_flush(SHAPES[s], args.batch, preset_config(c), args.reps, device="cuda", **kw)
            print(f"{head} flush {t:8.1f}", flush=True)
        elif mode == "verify":
            t = measure_verify(SHAPES[s], args.batch, preset_config(c), VERIFY_T, args.reps,
                               device="cuda", **lay, **kw)
            print(f"{head} verify {t:8.1f}", flush=True)
        elif mode == "fla":
            t = measure_fla(SHAPES[s], args.batch, args.reps, layers=layers)
            if t is None:
                print(f"{head} fla not installed", flush=True)
            else:
                print(f"{head} fla {t:8.1f}", flush=True)
        elif mode == "stagger":
            m = measure(SHAPES[s], args.batch, preset_config(c), args.reps, device="cuda",
                        stagger=True, **lay, **kw)
            print(f"{head} stagger {m['window_us']:8.1f}", flush=True)
        else:
            m = measure(SHAPES[s], args.batch, preset_config(c), args.reps, device="cuda", **lay,
                        **kw)
            print(f"{head} win {m['window_us']:8.1f} nf {m['nonflush_us']:8.1f} "
                  f"fl {m['flush_us']:8.1f}", flush=True)
    if args.resident:
        from replayssm_quant.kernels.core.persistent import resident_table

        for name, knobs, n in resident_table():
            print(f"{args.tag} resident {name} {json.dumps(knobs)} {n}", flush=True)
    return 0

