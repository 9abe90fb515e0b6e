"""The report's figures, drawn with matplotlib's Agg backend and returned as PNG bytes so the
HTML report can embed them and the Markdown report can sit next to them as files."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..recommend import Recommendation
    from ..results import DriftResults, TaskResults

__all__ = ["cost_tradeoff", "decay_spectrum", "kl_vs_position", "task_accuracy"]

_DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    _pyplot().close(fig)
    return buf.getvalue()


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def kl_vs_position(drift: DriftResults, max_kl: float | None = None,
                   kl_stat: str = "kl_mean") -> bytes:
    """Mean KL per position bucket for every config, log-log, with the 95% CI as a band: the
    shape of the curve shows whether a config's error grows with context."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    positive = [b.get("kl_mean") for c in drift.configs for b in c.buckets
                if _finite(b.get("kl_mean")) and b.get("kl_mean") > 0]
    floor = min(positive) / 10 if positive else 1e-12
    zero: list[str] = []
    for c in drift.configs:
        blocks = sorted((b for b in c.buckets if b.lo is not None and b.hi is not None),
                        key=lambda b: b.lo)
        y = np.array([b.get("kl_mean") for b in blocks], dtype=float)
        if not blocks or not np.any(np.nan_to_num(y) > 0):
            zero.append(c.name)
            continue
        x = np.sqrt(np.array([max(b.lo, 1) for b in blocks], float) *
                    np.array([b.hi for b in blocks], float))
        ok = np.isfinite(y) & (y > 0)
        (line,) = ax.plot(x, np.where(ok, y, np.nan), marker="o", label=c.name)
        lo = np.array([b.get("kl_ci_lo") for b in blocks], dtype=float)
        hi = np.array([b.get("kl_ci_hi") for b in blocks], dtype=float)
        lo = np.nan_to_num(lo, nan=floor).clip(min=floor)
        hi = np.nan_to_num(hi, nan=floor).clip(min=floor)
        ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan),
                        color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xscale("log")
    if positive:
        ax.set_yscale("log")
    if max_kl is not None and max_kl > 0 and kl_stat == "kl_mean":
        ax.axhline(max_kl, color="crimson", linestyle="--", linewidth=1,
                   label=f"budget: mean KL ≤ {max_kl:g}")
    ax.set_xlabel("token position (bucket centre)")
    ax.set_ylabel("mean KL(ref ‖ config) [nats]")
    ax.set_title(f"{drift.model}: KL vs position", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if zero:
        ax.plot([], [], " ", label="KL = 0: " + ", ".join(zero))
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _png(fig)


def decay_spectrum(drift: DriftResults) -> bytes | None:
    """Memory length ``1 / (1 - mean decay)`` of every SSM head, per layer: long-memory heads
    are where a shared narrow state accumulates its rounding error."""
    spec = drift.decay_spectrum
    if not spec or not spec.get("layers"):
        return None
    plt = _pyplot()
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    rng = np.random.default_rng(0)
    mems_all: list[float] = []
    for i, layer in enumerate(spec["layers"]):
        mem = np.asarray(layer.get("memory_tokens") or [], dtype=float)
        mem = mem[np.isfinite(mem) & (mem > 0)]
        if mem.size == 0:
            continue
        mems_all += mem.tolist()
        x = i + rng.uniform(-0.25, 0.25, mem.size)
        ax.scatter(x, mem, s=10, alpha=0.7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(spec["layers"])))
    ax.set_xticklabels([str(layer.get("layer")) for layer in spec["layers"]], fontsize=7)
    ax.set_xlabel("SSM layer")
    ax.set_ylabel("head memory 1/(1−decay) [tokens]")
    for tokens, label in ((100, "decay 0.99"), (1000, "decay 0.999")):
        ax.axhline(tokens, color="grey", linestyle=":", linewidth=1)
        ax.text(len(spec["layers"]) - 0.5, tokens, label, fontsize=7, va="bottom", ha="right")
    if drift.max_tokens:
        ax.axhline(drift.max_tokens, color="crimson", linestyle="--", linewidth=1)
        ax.text(-0.4, drift.max_tokens, "sequence length", fontsize=7, va="bottom",
                color="crimson")
    ax.set_title(f"{drift.model}: per-head memory", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    if mems_all:
        logs = np.log10(np.asarray(mems_all))
        hx.hist(logs, bins=min(30, max(5, len(mems_all) // 3)), color="tab:blue", alpha=0.8)
    hx.set_xlabel("log10 memory [tokens]")
    hx.set_ylabel("heads")
    hx.set_title("all heads", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def task_accuracy(tasks: TaskResults, max_drop: float | None = None) -> bytes:
    """Accuracy per task and config with 95% CIs, and the paired accuracy change against the
    reference with its paired 95% interval (what the budget limits)."""
    plt = _pyplot()
    names = tasks.tasks
    configs = list(dict.fromkeys(r.name for r in tasks.rows))
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(10, 0.9 + 0.45 * max(4, len(configs) *
                                                                      len(names) / 1.5)))
    height = 0.8 / max(1, len(names))
    for t_i, task in enumerate(names):
        rows = {r.name: r for r in tasks.rows if r.task == task}
        ys = np.arange(len(configs)) + (t_i - (len(names) - 1) / 2) * height
        acc, lo, hi, d, dlo, dhi = ([] for _ in range(6))
        for c in configs:
            r = rows.get(c)
            acc.append(100 * r.accuracy if r else np.nan)
            lo.append(100 * r.accuracy_lo if r else np.nan)
            hi.append(100 * r.accuracy_hi if r else np.nan)
            ref = r is not None and tasks.is_reference(r.config)
            d.append(0.0 if ref else (100 * r.delta if r else np.nan))
            dlo.append(0.0 if ref else (100 * r.delta_lo if r else np.nan))
            dhi.append(0.0 if ref else (100 * r.delta_hi if r else np.nan))
        acc, lo, hi = map(np.asarray, (acc, lo, hi))
        d, dlo, dhi = map(np.asarray, (d, dlo, dhi))
        ax.errorbar(acc, ys, xerr=[np.nan_to_num(acc - lo), np.nan_to_num(hi - acc)], fmt="o",
                    capsize=3, label=task)
        dx.errorbar(d, ys, xerr=[np.nan_to_num(d - dlo), np.nan_to_num(dhi - d)], fmt="o",
                    capsize=3, label=task)
    for a in (ax, dx):
        a.set_yticks(range(len(configs)))
        a.set_yticklabels(configs, fontsize=7)
        a.invert_yaxis()
        a.grid(True, axis="x", alpha=0.3)
    ax.set_xlabel("accuracy [%] (95% CI)")
    dx.set_xlabel("paired change vs reference [points] (95% CI)")
    dx.axvline(0, color="grey", linewidth=1)
    if max_drop is not None:
        dx.axvline(-max_drop, color="crimson", linestyle="--", linewidth=1,
                   label=f"budget: drop ≤ {max_drop:g} pt")
    dx.set_yticklabels([])
    ax.legend(fontsize=7, loc="best")
    dx.legend(fontsize=7, loc="best")
    ax.set_title(f"{tasks.model}: task accuracy", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def cost_tradeoff(rec: Recommendation) -> bytes | None:
    """Each config's cost (relative to conventional FP32) against its drift in the budget's
    bucket: the frontier the recommender walks along."""
    from ..recommend import Candidate

    points: list[tuple[Candidate, float, float]] = []
    for c in rec.candidates:
        kl = next((k.value for k in c.checks if k.metric == rec.budget.kl_stat), None)
        x = c.cost.traffic_vs_fp32 if rec.cost_basis != "time" else c.cost.value
        if x is None or kl is None or not math.isfinite(kl):
            continue
        points.append((c, x, kl))
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    positive = [p[2] for p in points if p[2] > 0]
    floor = min(positive) / 10 if positive else 1e-12
    for c, x, kl in points:
        chosen = rec.chosen is not None and c.config == rec.chosen.config
        color = "tab:green" if c.qualifies else "tab:orange" if c.undecided else "tab:red"
        ax.scatter([x], [max(kl, floor)], s=90 if chosen else 40, color=color,
                   marker="*" if chosen else "o", zorder=3)
    if positive:
        ax.set_yscale("log")
    if rec.budget.max_kl is not None and rec.budget.max_kl > 0:
        ax.axhline(rec.budget.max_kl, color="crimson", linestyle="--", linewidth=1)
    ax.set_xlabel("state traffic per step vs conventional FP32" if rec.cost_basis != "time"
                  else "measured step time [µs]")
    ax.set_ylabel(f"{rec.budget.kl_stat} in {rec.evidence.get('drift_bucket', '?')} [nats]")
    ax.set_title(f"{rec.model}: cost vs drift (green: inside the budget, orange: undecided)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    place_labels(ax, [(c.name, x, max(kl, floor)) for c, x, kl in points])
    return _png(fig)


_RINGS = (7.0, 16.0, 28.0, 42.0, 58.0, 76.0)
"""Distances (points) at which a label is tried around its marker, nearest first."""
_DIRECTIONS = ((1, 0.4), (1, -0.9), (-1, 0.4), (-1, -0.9), (0.3, 1), (0.3, -1.4), (-0.3, 1),
               (-0.3, -1.4))


def place_labels(ax, labels: list[tuple[str, float, float]], fontsize: float = 7) -> None:
    """Label data points so that no label overlaps another label or a marker: each label, in
    x order, takes the nearest free spot on rings around its point (a thin leader line joins
    it to the point when it sits away from it); the figure's layout must be final."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    fbox = ax.bbox  # inside the axes: clear of the tick and axis labels
    marks = [ax.transData.transform((x, y)) for _, x, y in labels]
    taken = [(mx - 5, my - 5, mx + 5, my + 5) for mx, my in marks]

    def free(b) -> bool:
        inside = (b.x0 >= fbox.x0 + 2 and b.x1 <= fbox.x1 - 2 and b.y0 >= fbox.y0 + 2
                  and b.y1 <= fbox.y1 - 2)
        return inside and not any(b.x0 < t[2] and b.x1 > t[0] and b.y0 < t[3] and b.y1 > t[1]
                                  for t in taken)

    for i in sorted(range(len(labels)), key=lambda k: (marks[k][0], marks[k][1])):
        name, x, y = labels[i]
        best = None
        for ring in _RINGS:
            for dx, dy in _DIRECTIONS:
                off = (ring * dx, ring * dy)
                ann = ax.annotate(name, (x, y), xytext=off, textcoords="offset points",
                                  fontsize=fontsize, ha="left" if dx >= 0 else "right",
                                  va="bottom" if dy >= 0 else "top")
                b = ann.get_window_extent(renderer)
                if free(b):
                    best = (ann, b, ring)
                    break
                ann.remove()
            if best is not None:
                break
        if best is None:  # nowhere free: the nearest spot, drawn anyway
            ann = ax.annotate(name, (x, y), xytext=(_RINGS[0], 3), textcoords="offset points",
                              fontsize=fontsize)
            best = (ann, ann.get_window_extent(renderer), _RINGS[0])
        ann, b, ring = best
        if ring > _RINGS[0]:
            ax.annotate("", (x, y), xytext=ann.xyann, textcoords="offset points",
                        arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6,
                                    "shrinkA": 0, "shrinkB": 3})
        taken.append((b.x0 - 1, b.y0 - 1, b.x1 + 1, b.y1 + 1))
