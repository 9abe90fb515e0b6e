"""The decode kernels' speed targets, checked against ``benchmarks.decode`` results.

Each target is data (``TARGETS``): which rows it reads, the number it forms from them and the
bound that number must meet. ``evaluate`` turns the rows of one or more sweeps into one
verdict per (target, shape, batch), with the numbers behind it, so a report states which
targets hold and by how much the others miss instead of leaving that to a reader:

    python -m benchmarks.decode targets OLD/decode.json NEW/decode.json \\
        --out targets.md --json targets.json --plot targets.png

A target that forms a ratio of two rows (a window against the conventional step, say) takes
both from one file, the latest that holds them, and names it in its detail; a later file's
row replaces an earlier one's elsewhere.

``benchmarks.decode`` appends the same table to every ``decode.md`` it writes. A target only judges the
batch sizes it names (``batch_min`` / ``batch_max``); a sweep without those rows gives no
verdict for it, never a pass.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

WINDOW_L = 16  # the L of the window targets
NVFP4_PRESET = "nvfp4-read/fp16-sr"  # the NVFP4 read + FP16-SR checkpoint preset
FLA_CONFIG = "fla-fused-recurrent"
# A conventional FP32 step below this share of copy bandwidth is a slow baseline: it ran at
# 0.956-0.979 in the H200 sweeps at batch 256 and 512 but for a few processes (0.898-0.92)
# whose ratios to it it flatters
SLOW_BASELINE = 0.95


def _meets(value: float, bound: float, op: str) -> bool:
    if value != value:
        return False
    return value >= bound if op == ">=" else value <= bound


@dataclass(frozen=True)
class Verdict:
    """One target on one (shape, batch): the value formed, whether it meets the bound, and
    what it is made of (``detail``)."""

    target: str
    shape: str
    batch: int
    value: float
    bound: float
    op: str
    met: bool
    detail: str
    adjusted: float | None = None  # the value with a slow baseline at SLOW_BASELINE

    @property
    def trusted(self) -> bool:
        """Met, and still met with a slow conventional step taken at ``SLOW_BASELINE`` of
        copy bandwidth (``adjusted``): a check met only over a slow baseline is not."""
        return self.met if self.adjusted is None else _meets(self.adjusted, self.bound, self.op)

    def as_dict(self) -> dict:
        return dict(self.__dict__, trusted=self.trusted)


@dataclass(frozen=True)
class Target:
    """``measure(rows of one (shape, batch))`` gives (value, detail) or None when the rows it
    needs are missing; ``op`` is ">=" or "<=" against ``bound``. A ``same_run`` target forms a
    ratio of two rows, and the issue asks for both "measured in one run": it reads the latest
    run that holds every row it needs, never one run's window against another's step."""

    name: str
    text: str
    bound: float
    op: str
    measure: Callable[[dict[str, dict]], tuple[float, str] | None]
    batch_min: int = 256
    batch_max: int | None = None
    kinds: tuple[str, ...] = ("mamba2", "gdn")
    same_run: bool = False  # the rows it pairs must come from one run (one decode.json)
    mode: str = ""  # the sweeps it judges: decode.py's row "mode" ("": one layer, aligned
    # cursors; "layers": each step over several layers' states, read from HBM)
    baseline: str = ""  # where the value is a ratio to the conventional FP32 step: "over"
    # (conventional / this: a slow baseline raises it) or "under" (this / conventional)

    def meets(self, value: float) -> bool:
        return _meets(value, self.bound, self.op)

    def at_baseline(self, value: float, rows: dict[str, dict]) -> float | None:
        """``value`` as it would be with the conventional step of ``rows`` at
        ``SLOW_BASELINE`` of copy bandwidth, where that step ran slower (None otherwise)."""
        frac = (rows.get("fp32") or {}).get("bw_frac_window")
        if not self.baseline or not frac or not frac < SLOW_BASELINE:
            return None
        return value * frac / SLOW_BASELINE if self.baseline == "over" else \
            value * SLOW_BASELINE / frac

    def applies(self, batch: int, kind: str, mode: str = "") -> bool:
        return (batch >= self.batch_min and (self.batch_max is None or batch <= self.batch_max)
                and kind in self.kinds and mode == self.mode)


def _window(rows: dict[str, dict], config: str) -> dict | None:
    r = rows.get(config)
    return r if r is not None and r.get("L") == WINDOW_L else None


def _conv_bw(rows):
    r = rows.get("fp32")
    return None if r is None else (r["bw_frac_window"], f"{r['window_us']:.1f} us")


def _ratio_to_conv(config: str):
    def measure(rows):
        r, c = _window(rows, config), rows.get("fp32")
        if r is None or c is None:
            return None
        allow = r.get("byte_bound_vs_conv_fp32")
        frac = c.get("bw_frac_window")  # a slow baseline shows here
        return (c["window_us"] / r["window_us"],
                f"{r['window_us']:.1f} us against {c['window_us']:.1f} us"
                + (f" ({frac:.2f} of copy bandwidth)" if frac else "")
                + (f"; the counted bytes allow {allow:.2f}x" if allow else ""))
    return measure


def _nvfp4_nonflush(rows):
    """Sweeps that time the non-flush step carry ``nonflush_derived_us`` beside it; older
    ones derived it from the window and the flush timed alone."""
    f, n = _window(rows, "replay-fp32"), _window(rows, NVFP4_PRESET)
    if f is None or n is None:
        return None
    how = "timed" if "nonflush_derived_us" in f and "nonflush_derived_us" in n else \
        "derived from the windows and flushes"
    return (f["nonflush_us"] / n["nonflush_us"],
            f"{n['nonflush_us']:.1f} us against {f['nonflush_us']:.1f} us ({how})")


def _every_kernel_bw(rows):
    """The lowest bandwidth fraction of any step kind (conventional, non-flush, flush) of any
    preset; the detail names those below 0.85 (verify rows count no bytes)."""
    fracs = []
    for name, r in rows.items():
        if "bw_frac_nonflush" not in r or name == FLA_CONFIG:
            continue
        if r.get("L", 1) == 1:
            fracs.append((r["bw_frac_window"], name))
        else:
            fracs += [(r["bw_frac_nonflush"], f"{name} non-flush"), (r["bw_frac_flush"], f"{name} flush")]
    if not fracs:
        return None
    short = sorted(f for f in fracs if f[0] < 0.85)
    detail = (f"{len(short)} of {len(fracs)} below: " + ", ".join(f"{n} {v:.2f}" for v, n in short)
              if short else f"all {len(fracs)} at or above")
    return min(v for v, _ in fracs), detail


def _vs_fla(rows):
    r, f = _window(rows, "replay-fp32"), rows.get(FLA_CONFIG)
    if r is None or f is None:
        return None
    return f["window_us"] / r["window_us"], f"FLA {f['window_us']:.1f} us"


def _verify(preset: str):
    def measure(rows):
        r = next((v for k, v in rows.items() if k.startswith("verify ") and k.endswith(" " + preset)),
                 None)
        if r is None or "verify_vs_conv_step" not in r:
            return None
        return r["verify_vs_conv_step"], f"{r['window_us']:.1f} us ({r['config']})"
    return measure


def _batch1(rows):
    """The slowest ReplaySSM window (every preset, every L) against the conventional step."""
    c = rows.get("fp32")
    wins = [(c["window_us"] / r["window_us"], name) for name, r in rows.items()
            if c is not None and r.get("L", 1) > 1 and not name.startswith("verify ")]
    if not wins:
        return None
    short = sorted(w for w in wins if w[0] < 0.9)
    detail = (f"{len(short)} of {len(wins)} below 0.90x: " + ", ".join(f"{n} {v:.2f}" for v, n in short)
              if short else f"all {len(wins)} at or above 0.90x")
    return min(v for v, _ in wins), detail


TARGETS: tuple[Target, ...] = (
    Target("conv-fp32-bandwidth", "conventional FP32 step at >= 85% of copy bandwidth",
           0.85, ">=", _conv_bw),
    Target("replay-fp32-window", "ReplaySSM FP32 window (L = 16) >= 1.75x the conventional FP32 step",
           1.75, ">=", _ratio_to_conv("replay-fp32"), same_run=True, baseline="over"),
    Target("nvfp4-fp16sr-window", "NVFP4 read + FP16-SR window (L = 16) >= 7x the conventional FP32 step",
           7.0, ">=", _ratio_to_conv(NVFP4_PRESET), same_run=True, baseline="over"),
    Target("nvfp4-nonflush", "NVFP4 non-flush step >= 5x the FP32 non-flush step",
           5.0, ">=", _nvfp4_nonflush, same_run=True),
    Target("every-kernel-bandwidth", "every kernel at >= 85% of copy bandwidth on its counted bytes",
           0.85, ">=", _every_kernel_bw),
    Target("replay-fp32-vs-fla", "GDN ReplaySSM FP32 window >= 1.7x FLA's fused recurrent decode",
           1.7, ">=", _vs_fla, kinds=("gdn",), same_run=True),
    Target("verify-replay-fp32", "verify of T drafts (replay-fp32) <= 1.0x one conventional step",
           1.0, "<=", _verify("replay-fp32"), baseline="under"),
    Target("verify-nvfp4", f"verify of T drafts ({NVFP4_PRESET}) <= 1.0x one conventional step",
           1.0, "<=", _verify(NVFP4_PRESET), baseline="under"),
    Target("batch1-no-regression", "batch 1: every ReplaySSM window >= 0.90x the conventional step",
           0.9, ">=", _batch1, batch_min=1, batch_max=1, same_run=True),
    Target("batch1-no-regression-hbm", "batch 1, each step over enough layers that their states "
           "come from HBM (decode.py --layers): every ReplaySSM window >= 0.90x the conventional "
           "step", 0.9, ">=", _batch1, batch_min=1, batch_max=1, same_run=True, mode="layers"),
)


def evaluate(rows: Iterable[dict], targets: Iterable[Target] = TARGETS) -> list[Verdict]:
    """One verdict per target and (shape, batch) of ``rows`` that the target applies to and
    whose rows it needs are present. Rows carry the run they come from (``run``, as
    ``load_rows`` numbers the files; one run without it): a later run's (shape, batch, config)
    replaces an earlier one's, and a ``same_run`` target reads the latest run that holds all
    its rows. Rows of another timing mode (``mode``: several layers per step, staggered
    cursors) stay apart: a target judges its own mode's rows only. A ratio to the
    conventional step whose rows hold a slow one also carries the value with that step at
    ``SLOW_BASELINE`` (``Verdict.adjusted``)."""
    groups: dict[tuple[str, int, str], dict[str, dict]] = {}
    runs: dict[tuple[str, int, str], dict[int, dict[str, dict]]] = {}
    kinds: dict[str, str] = {}
    for r in rows:
        key = (r["shape"], r["batch"], r.get("mode", ""))
        groups.setdefault(key, {})[r["config"]] = r
        runs.setdefault(key, {}).setdefault(r.get("run", 0), {})[r["config"]] = r
        kinds[r["shape"]] = r.get("kind", "")
    out = []
    for t in targets:
        for (shape, batch, mode), grp in sorted(groups.items()):
            if not t.applies(batch, kinds[shape], mode):
                continue
            if t.same_run:
                by_run = runs[(shape, batch, mode)]
                got = next(((g, by_run[k]) for g, k in ((t.measure(by_run[k]), k)
                                                        for k in sorted(by_run, reverse=True))
                            if g is not None), None)
                if got is not None:
                    (value, detail), used = got
                    source = next(iter(used.values())).get("source")
                    got = (value, f"{detail} [{source}]" if source else detail)
            else:
                got, used = t.measure(grp), grp
            if got is None:
                continue
            value, detail = got
            out.append(Verdict(t.name, shape, batch, value, t.bound, t.op, t.meets(value), detail,
                               t.at_baseline(value, used)))
    return out


def _fmt(v: float) -> str:
    return "nan" if v != v or math.isinf(v) else f"{v:.3f}"


def markdown(verdicts: list[Verdict], targets: Iterable[Target] = TARGETS) -> str:
    """A table per target: shape, batch, value against the bound, met or not, and why."""
    texts = {t.name: t.text for t in targets}
    met = sum(v.met for v in verdicts)
    head = f"{met} of {len(verdicts)} (target, shape, batch) checks met."
    slow = sum(v.met and not v.trusted for v in verdicts)
    if slow:
        head += (f" {slow} of them only over a conventional step below {SLOW_BASELINE:g} of "
                 f"copy bandwidth: {met - slow} with that step at {SLOW_BASELINE:g}.")
    lines = ["## Targets", "", head, ""]
    for name in dict.fromkeys(v.target for v in verdicts):
        lines += [f"### {name}: {texts.get(name, name)}", "",
                  "| shape | batch | value | bound | met | detail |", "|---|---:|---:|---|---|---|"]
        for v in (v for v in verdicts if v.target == name):
            ok = "yes" if v.trusted else "yes, over a slow baseline" if v.met else "**no**"
            note = "" if v.adjusted is None else \
                f"; {_fmt(v.adjusted)} with the conventional step at {SLOW_BASELINE:g} of copy bandwidth"
            lines.append(f"| {v.shape} | {v.batch} | {_fmt(v.value)} | {v.op} {v.bound:g} | "
                         f"{ok} | {v.detail}{note} |")
        lines.append("")
    return "\n".join(lines)


def score(v: Verdict) -> float:
    """How far a check is from its bound as one number, >= 1 when met: value / bound for a
    lower bound (">="), bound / value for an upper one ("<=")."""
    if v.value != v.value or v.value <= 0:
        return float("nan")
    return v.value / v.bound if v.op == ">=" else v.bound / v.value


def plot(verdicts: list[Verdict], path: Path, title: str = "") -> None:
    """One row per target, one dot per (shape, batch) at its ``score`` on a log axis, the
    line at 1 separating met (right) from missed (left): where every check stands, and how
    far the missed ones are, in one picture."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(v.target for v in verdicts))
    shapes = sorted({v.shape for v in verdicts})
    batches = sorted({v.batch for v in verdicts})
    markers = dict(zip(shapes, "osD^v<>p", strict=False))
    colors = dict(zip(batches, plt.get_cmap("viridis")([0.15, 0.5, 0.85, 0.3, 0.7][:len(batches)]),
                      strict=False))
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(names) + 1.8))
    offs = {s: (i - (len(shapes) - 1) / 2) * 0.12 for i, s in enumerate(shapes)}
    for v in verdicts:
        x = score(v)
        if x == x:
            ax.scatter(x, names.index(v.target) + offs[v.shape], marker=markers[v.shape],
                       color=colors[v.batch], s=36, zorder=3,
                       edgecolor="black" if v.trusted else "darkorange" if v.met else "none")
    ax.axvline(1.0, color="crimson", lw=1.2, zorder=2)
    ax.set_xscale("log")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("value / bound (>= 1: met; log scale)")
    met = sum(v.met for v in verdicts)
    ax.set_title(title or f"Decode kernel targets: {met} of {len(verdicts)} checks met")
    ax.grid(axis="x", which="both", alpha=0.3)
    handles = [plt.Line2D([], [], ls="", marker=markers[s], color="gray", label=s) for s in shapes]
    handles += [plt.Line2D([], [], ls="", marker="o", color=colors[b], label=f"batch {b}")
                for b in batches]
    handles.append(plt.Line2D([], [], ls="", marker="o", color="white", markeredgecolor="black",
                              label="black edge: met"))
    if any(v.met and not v.trusted for v in verdicts):
        handles.append(plt.Line2D([], [], ls="", marker="o", color="white",
                                  markeredgecolor="darkorange",
                                  label="orange edge: met over a slow baseline"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_rows(paths: Iterable[Path]) -> list[dict]:
    """The rows of ``decode.json`` files in file order, each tagged with its file's index
    (``run``): ``evaluate`` lets a later file's (shape, batch, config) replace an earlier
    one's and pairs rows of one file only where a target forms a ratio."""
    rows: list[dict] = []
    for i, p in enumerate(paths):
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"cannot read {p}: {e}") from e
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise SystemExit(f"{p} is not a decode.py result (no 'rows' list)")
        rows += [{**r, "run": i, "source": Path(p).stem} for r in data["rows"]]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="decode.json files of benchmarks.decode")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown table here")
    ap.add_argument("--json", type=Path, default=None, help="write the verdicts as JSON here")
    ap.add_argument("--plot", type=Path, default=None,
                    help="draw every check's value / bound here (PNG; >= 1: met)")
    args = ap.parse_args(argv)
    verdicts = evaluate(load_rows(args.results))
    md = markdown(verdicts)
    if args.out:
        args.out.write_text(md + "\n")
    if args.json:
        args.json.write_text(json.dumps([v.as_dict() for v in verdicts], indent=1))
    if args.plot:
        plot(verdicts, args.plot)
    print(md)
    return 0

