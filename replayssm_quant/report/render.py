"""A per-model report from result folders: Markdown with PNG files beside it, and one
self-contained HTML file (plots embedded as base64 PNG, inline CSS, no scripts, a
Content-Security-Policy that forbids loading anything) that can be mailed or attached to a CI run
and still open years later."""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ..results import ModelResults
from . import plots

if TYPE_CHECKING:
    from ..recommend import Benchmark, Budget, Recommendation

__all__ = ["Figure", "Report", "build_report", "recommendation_items", "recommendation_markdown"]


# ---------------------------------------------------------------------------------------- format
def fmt_num(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    if abs(x) < 1e-3 or abs(x) >= 1e5:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def fmt_pct(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}%"


def fmt_points(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}"


def fmt_bytes(b: float | None) -> str:
    if b is None or not math.isfinite(b):
        return "–"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div:
            return f"{b / div:,.2f} {unit}"
    return f"{b:,.0f} B"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


# ---------------------------------------------------------------------------------------- tables
@dataclass
class Table:
    """A table both renderers draw: header, rows of cell text, right-aligned columns."""

    title: str
    header: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)
    note: str = ""

    def markdown(self) -> str:
        out = [f"**{self.title}**", ""] if self.title else []
        out.append("| " + " | ".join(self.header) + " |")
        out.append("|" + "|".join("---:" if i in self.right else "---"
                                  for i in range(len(self.header))) + "|")
        for r in self.rows:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
        if self.note:
            out += ["", self.note]
        return "\n".join(out) + "\n"

    def html(self) -> str:
        e = html.escape
        head = "".join(f"<th>{e(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f'<td class="{"num" if i in self.right else ""}">{e(c)}</td>'
                             for i, c in enumerate(r)) + "</tr>" for r in self.rows)
        cap = f"<caption>{e(self.title)}</caption>" if self.title else ""
        note = f'<p class="note">{e(self.note)}</p>' if self.note else ""
        return (f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}")


@dataclass
class Figure:
    key: str
    title: str
    caption: str
    png: bytes


@dataclass
class Code:
    """A command to copy: a fenced block in Markdown, ``<pre>`` in HTML."""

    text: str


@dataclass
class Bullets:
    items: list[str]


Block = Table | Figure | Code | Bullets | str
"""A report element; a plain string is a paragraph (with `code` and **bold**)."""


@dataclass
class Section:
    title: str
    items: list[Block] = field(default_factory=list)

    def add(self, *items: Block) -> Section:
        self.items += items
        return self


def _block_markdown(b: Block, image_dir: str) -> list[str]:
    if isinstance(b, str):
        return [b, ""]
    if isinstance(b, Table):
        return [b.markdown()]
    if isinstance(b, Figure):
        return [f"![{b.title}]({image_dir}/{b.key}.png)", "", f"_{b.caption}_", ""]
    if isinstance(b, Code):
        return ["```bash", b.text, "```", ""]
    return [f"- {item}" for item in b.items] + [""]


# ---------------------------------------------------------------------------------------- report
@dataclass
class Report:
    """Everything one model's report shows, ready to render."""

    model: str
    results: ModelResults
    recommendation: Recommendation | None
    recommendation_error: str | None
    sections: list[Section]
    generated: str

    @property
    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.items if isinstance(b, Figure)]

    def markdown(self, image_dir: str = "plots") -> str:
        out = [f"# {self.model}: SSM-state precision report", "", f"_Generated {self.generated}._",
               ""]
        for s in self.sections:
            out += [f"## {s.title}", ""]
            for b in s.items:
                out += _block_markdown(b, image_dir)
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        e = html.escape
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'img-src data:; style-src \'unsafe-inline\'">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{e(self.model)}: SSM-state precision report</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>{e(self.model)}: SSM-state precision report</h1>",
            f'<p class="meta">Generated {e(self.generated)}.</p>',
            "<nav><ul>" + "".join(f'<li><a href="#s{i}">{e(s.title)}</a></li>'
                                  for i, s in enumerate(self.sections)) + "</ul></nav>",
        ]
        for i, s in enumerate(self.sections):
            parts.append(f'<section id="s{i}"><h2>{e(s.title)}</h2>')
            for b in s.items:
                if isinstance(b, str):
                    parts.append(f"<p>{_inline_html(b)}</p>")
                elif isinstance(b, Table):
                    parts.append(b.html())
                elif isinstance(b, Figure):
                    data = base64.b64encode(b.png).decode("ascii")
                    parts.append(f'<figure id="fig-{e(b.key)}"><img alt="{e(b.title)}" '
                                 f'src="data:image/png;base64,{data}">'
                                 f"<figcaption>{e(b.caption)}</figcaption></figure>")
                elif isinstance(b, Code):
                    parts.append(f"<pre>{e(b.text)}</pre>")
                else:
                    parts.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items)
                                 + "</ul>")
            parts.append("</section>")
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"

    def write(self, out: str | Path) -> dict[str, Path]:
        """``report.html``, ``report.md`` and ``plots/*.png`` in ``out``."""
        d = Path(out)
        (d / "plots").mkdir(parents=True, exist_ok=True)
        for old in (d / "plots").glob("*.png"):  # a rerun must not keep plots of another
            old.unlink()
        files = {"html": d / "report.html", "markdown": d / "report.md"}
        for f in self.figures:
            p = d / "plots" / f"{f.key}.png"
            p.write_bytes(f.png)
            files[f"plot:{f.key}"] = p
        files["html"].write_text(self.html())
        files["markdown"].write_text(self.markdown())
        return files


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:.85em}
caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #ddd;padding:.25em .55em;vertical-align:top}
th{background:#f4f4f4;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}
code{background:#f4f4f4;padding:.05em .3em;border-radius:3px}
pre{background:#f4f4f4;padding:.6em;overflow-x:auto}
.meta,.note{color:#555;font-size:.85em}
nav ul{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:1em;font-size:.9em}
.ok{color:#0a7a2f;font-weight:600}.bad{color:#b00020;font-weight:600}
"""


def _inline_html(text: str) -> str:
    """Markdown-lite for paragraphs: `code` and **bold**, everything else escaped."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


# ---------------------------------------------------------------------------------------- content
def _plugin_line(rec: Recommendation) -> str:
    assert rec.serve_command is not None
    return rec.serve_command


def _budget_text(b: Budget, bucket: str | None = None) -> str:
    drift = []
    if b.max_kl is not None:
        drift.append(f"{b.kl_stat} ≤ {b.max_kl:g} nats")
    if b.min_same_top1 is not None:
        drift.append(f"same top-1 ≥ {100 * b.min_same_top1:g}%")
    if b.max_ppl_ratio is not None:
        drift.append(f"PPL ratio ≤ {b.max_ppl_ratio:g}")
    parts = []
    if drift:
        where = b.bucket + (f" = {bucket}" if bucket and bucket != b.bucket else "")
        parts.append(", ".join(drift) + f" in position bucket `{where}`")
    if b.max_accuracy_drop is not None:
        parts.append(f"upper 95% bound of the paired accuracy drop ≤ {b.max_accuracy_drop:g} "
                     "point(s) on every task")
    for task, v in b.task_max_accuracy_drop.items():
        parts.append(f"{task}: drop ≤ {v:g} point(s)" if v is not None else f"{task}: unchecked")
    shares = [f"{what} answers ≤ {100 * v:g}%" for what, v in
              (("truncated", b.max_truncation_rate), ("invalid", b.max_invalid_rate))
              if v is not None]
    if parts and shares and (b.max_accuracy_drop is not None or b.task_max_accuracy_drop):
        parts.append("task checks decided only with " + " and ".join(shares))
    return "; ".join(parts) or "no limits"


def _cost_cell(rec: Recommendation, c) -> str:
    if rec.cost_basis == "time":
        return f"{c.cost.value:,.1f} µs" if c.cost.value is not None else "–"
    if rec.cost_basis == "memory":
        return fmt_bytes(c.cost.state_bytes)
    return fmt_bytes(c.cost.bytes_per_step)


def _candidate_table(rec: Recommendation) -> Table:
    head = ["rank", "config", "config string", f"cost ({rec.cost_basis})", "vs FP32 traffic",
            "verdict", "why not"]
    rows = []
    chosen = rec.chosen.config if rec.chosen else None
    for i, c in enumerate(rec.candidates, 1):
        if c.config == chosen:
            verdict = "recommended"
        elif c.qualifies:
            verdict = "qualifies (costs more)"
        elif c.undecided:
            verdict = "undecided"
        else:
            verdict = "rejected"
        rows.append([str(i), c.name, str(c.config), _cost_cell(rec, c),
                     f"{c.cost.traffic_vs_fp32:.3f}", verdict,
                     "; ".join(c.reasons()) if not c.qualifies else ""])
    return Table("Candidates, cheapest first", head, rows, right={0, 3, 4})


def recommendation_items(rec: Recommendation) -> list[Block]:
    """The recommendation as report items, shared by ``recommendation.md`` and the report."""
    items: list[Block] = []
    unit = {"bytes": "state bytes moved per decode step from the cost model",
            "time": "measured step time",
            "memory": "state bytes held per sequence"}[rec.cost_basis]
    bench = rec.evidence.get("bench")
    basis = f"Cost: {unit}"
    if rec.cost_basis != "time":
        basis += (f" for the SSM layer shape {rec.shape.kind} {rec.shape.heads}×"
                  f"{rec.shape.head_dim}×{rec.shape.d_state} ({rec.shape.groups} groups)")
    if bench:
        basis += (f"; measured times from `{bench['path']}` ({bench['shape']}, batch "
                  f"{bench['batch']})")
    if rec.chosen is not None:
        c = rec.chosen
        items.append(f"**Recommended: `{c.name}`** (`{c.config}`), the cheapest config inside "
                     f"the budget: {c.cost.traffic_vs_fp32:.3f}× the state traffic of "
                     "conventional FP32 decoding. Serve it with:")
        items.append(Code(_plugin_line(rec)))
    else:
        items.append("**No config qualifies or is decided.**" if rec.undecided else
                     "**No config qualifies.**")
        if rec.closest is not None:
            items.append(f"Closest: `{rec.closest.name}` (`{rec.closest.config}`), the config "
                         "whose worst limit is missed by the least: "
                         + "; ".join(rec.closest.reasons()) + ".")
    items.append(f"Budget: {_budget_text(rec.budget, rec.evidence.get('drift_bucket'))}.")
    items.append(basis + ".")
    if rec.not_checked:
        items.append("Not checked: " + "; ".join(rec.not_checked) + ".")
    if rec.undecided:
        items.append("Undecided (task evidence too thin to pass or fail; never recommended):")
        items.append(Bullets([f"`{c.name}` (`{c.config}`): " + "; ".join(c.reasons())
                              for c in rec.undecided]))
    cheaper = rec.rejected_cheaper if rec.chosen is not None else []
    if cheaper:
        items.append("Cheaper configs, and why they were rejected:")
        items.append(Bullets([f"`{c.name}` (`{c.config}`): " + "; ".join(c.reasons())
                              for c in cheaper]))
    items.append(_candidate_table(rec))
    if rec.windows:
        items += _window_items(rec)
    return items


def _window_items(rec: Recommendation) -> list[Block]:
    """Each split's window length chosen from the measured times, with the L that were timed
    but have no accuracy results named (never chosen)."""
    bench = rec.evidence.get("bench") or {}
    Ls = sorted({L for w in rec.windows for L in (*w.times_us, *w.verdicts)})
    head = ["split", *(f"L={L}" for L in Ls), "chosen L", "notes"]
    rows = []
    for w in rec.windows:
        cells = []
        for L in Ls:
            t = w.times_us.get(L)
            v = w.verdicts.get(L, "no results")
            cells.append(("–" if t is None else f"{t:,.1f} µs") + f" ({v})")
        rows.append([w.name, *cells, str(w.chosen) if w.chosen else "–", "; ".join(w.notes)])
    return [f"Window length per split: the fastest L measured ({bench.get('shape')}, batch "
            f"{bench.get('batch')}) whose own accuracy results pass; an L without results "
            "is not chosen.",
            Table("Window length per split", head, rows, right=set(range(1, len(Ls) + 2)))]


def recommendation_markdown(rec: Recommendation) -> str:
    out = [f"# Recommendation for {rec.model}", ""]
    for b in recommendation_items(rec):
        out += _block_markdown(b, ".")
    return "\n".join(out).rstrip() + "\n"


def _drift_sections(m: ModelResults, rec: Recommendation | None,
                    budget: Budget) -> list[Section]:
    d = m.drift
    assert d is not None
    s = Section("Drift: KL vs position")
    docs = d.raw.get("documents") or []
    s.add(
        f"Teacher-forced on `{d.data}`: {len(docs)} document(s), {d.tokens or 0:,} tokens "
        f"(max {d.max_tokens or 0:,} each), prefill {d.prefill} tokens, seed {d.seed}; "
        f"reference: {'the exact FP32 forward' if d.reference == 'exact' else d.reference}; "
        f"{d.positions_per_config or 0:,} scored positions per config.")
    s.add(Figure("kl_vs_position", "KL vs position",
                           "Mean KL(ref ‖ config) per log-spaced position bucket; bands: 95% CI "
                           "(batch means). Dashed: the budget.",
                           plots.kl_vs_position(d, budget.max_kl, budget.kl_stat)))
    labels = [b.bucket for b in d.buckets]
    rows = []
    for c in d.configs:
        cells = [c.name]
        for lab in labels:
            st = c.stats(lab)
            if st is None:
                cells.append("–")
                continue
            cells.append(f"{fmt_num(st.get('kl_mean'))} [{fmt_num(st.get('kl_ci_lo'))}, "
                         f"{fmt_num(st.get('kl_ci_hi'))}]")
        rows.append(cells)
    s.add(Table("Mean KL [95% CI] in nats per position bucket", ["config"] + labels,
                          rows, right=set(range(1, len(labels) + 1))))
    head = ["config", "mean KL [95% CI]", "median", "p90", "p99", "max", "same top-1",
            "PPL ratio"]
    rows = []
    for c in d.configs:
        o = c.overall
        if o is None:
            rows.append([c.name] + ["–"] * (len(head) - 1))
            continue
        rows.append([c.name, f"{fmt_num(o.get('kl_mean'))} [{fmt_num(o.get('kl_ci_lo'))}, "
                             f"{fmt_num(o.get('kl_ci_hi'))}]",
                     fmt_num(o.get("kl_median")), fmt_num(o.get("kl_p90")),
                     fmt_num(o.get("kl_p99")), fmt_num(o.get("kl_max")),
                     fmt_pct(o.get("same_top1")), fmt_num(o.get("ppl_ratio"), 5)])
    s.add(Table("All positions", head, rows, right=set(range(1, len(head)))))
    last = labels[-1] if labels else None
    if last:
        rows = []
        for c in d.configs:
            st = c.stats(last)
            rows.append([c.name] + ([fmt_num(st.get("kl_median")), fmt_num(st.get("kl_p90")),
                                     fmt_num(st.get("kl_p99")), fmt_num(st.get("kl_max")),
                                     fmt_pct(st.get("same_top1")),
                                     fmt_num(st.get("ppl_ratio"), 5)]
                                    if st else ["–"] * 6))
        s.add(Table(f"Longest positions {last}",
                              ["config", "median KL", "p90", "p99", "max", "same top-1",
                               "PPL ratio"], rows, right=set(range(1, 7))))
    out = [s]
    spectrum = d.decay_spectrum
    if spectrum:
        sp = Section("Decay spectrum")
        frac = ", ".join(f"{k}: {100 * v:.1f}%" for k, v in
                         (spectrum.get("fraction_of_heads") or {}).items())
        sp.add(
            f"Mean per-token decay of each of the {spectrum.get('heads', '?')} SSM heads on this "
            f"text (fraction of heads with mean decay {frac or '–'}). A shared narrow state feeds "
            "its rounding error back through the decay, so long-memory heads (decay near 1) "
            "drift most; a read copy's error never re-enters the recurrence.")
        png = plots.decay_spectrum(d)
        if png is not None:
            sp.add(Figure("decay_spectrum", "Decay spectrum",
                                    "Per-head memory 1/(1 − mean decay) in tokens, per SSM "
                                    "layer; dotted: decay 0.99 and 0.999; dashed: the "
                                    "sequence length.", png))
        rows = []
        for layer in spectrum.get("layers", []):
            mean = [x for x in layer.get("mean_decay", []) if x is not None]
            mem = [x for x in layer.get("memory_tokens", []) if x is not None]
            if not mean:
                continue
            srt = sorted(mean)
            rows.append([str(layer.get("layer")), str(layer.get("kind", "")), str(len(mean)),
                         f"{srt[0]:.4f}", f"{srt[len(srt) // 2]:.4f}", f"{srt[-1]:.4f}",
                         f"{max(mem):,.0f}" if mem else "–"])
        sp.add(Table("Per layer", ["layer", "kind", "heads", "min decay",
                                             "median", "max", "longest memory (tokens)"],
                               rows, right={0, 2, 3, 4, 5, 6}))
        out.append(sp)
    return out


def _task_section(m: ModelResults, budget: Budget) -> Section:
    t = m.tasks
    assert t is not None
    s = Section("Task accuracy")
    s.add(
        f"Paired against `{m.label(t.reference)}` on the same items and seeds: accuracy with a "
        "95% Wilson interval, the paired change with Tango's score 95% interval, McNemar's p, "
        "and the rates of answers that flipped, were cut off at the generation limit "
        "(truncated) or could not be parsed (invalid).")
    s.add(Figure("task_accuracy", "Task accuracy",
                           "Left: accuracy (95% CI). Right: paired change against the reference "
                           "in points (95% CI); dashed: the budget.",
                           plots.task_accuracy(t, budget.max_accuracy_drop)))
    head = ["task", "config", "n", "accuracy [95% CI]", "Δ points [95% CI]", "McNemar p",
            "flipped", "truncated", "invalid"]
    rows = []
    order = {c: i for i, c in enumerate(m.configs())}
    for task in t.tasks:
        rows_t = sorted((r for r in t.rows if r.task == task),
                        key=lambda r: (not t.is_reference(r.config), order.get(r.config, 1 << 30)))
        for r in rows_t:
            ref = t.is_reference(r.config)
            rows.append([
                task, r.name + (" (reference)" if ref else ""), str(r.n),
                f"{fmt_pct(r.accuracy, 1)} [{fmt_pct(r.accuracy_lo, 1)}, "
                f"{fmt_pct(r.accuracy_hi, 1)}]",
                "–" if ref else f"{fmt_points(r.delta)} [{fmt_points(r.delta_lo)}, "
                                f"{fmt_points(r.delta_hi)}]",
                "–" if ref else fmt_num(r.mcnemar_p),
                "–" if ref else fmt_pct(r.flip_rate, 1),
                fmt_pct(r.truncation_rate, 1), fmt_pct(r.invalid_rate, 1)])
    s.add(Table("Per task and config", head, rows, right={2, 3, 4, 5, 6, 7, 8}))
    trunc = [r for r in t.rows if math.isfinite(r.truncation_rate) and r.truncation_rate > 0.05]
    if trunc:
        s.add("**Truncation above 5%**: " + ", ".join(
            f"{r.task}/{r.name} {fmt_pct(r.truncation_rate, 1)}" for r in trunc) +
            ". A truncated chain of thought is scored as an answer; raise max_gen_toks before "
            "trusting these accuracies.")
    return s


def _cost_section(rec: Recommendation, bench: Benchmark | None) -> Section:
    s = Section("Cost")
    layers = rec.shape.layers
    s.add(
        f"State bytes one SSM layer moves per decode step for one sequence (window average "
        f"over L steps), shape {rec.shape.kind} {rec.shape.heads} heads × {rec.shape.head_dim} "
        f"× {rec.shape.d_state}, {rec.shape.groups} groups"
        + (f", × {layers} SSM layers per token" if layers else "") +
        "; traffic relative to conventional FP32 decoding; state held per sequence "
        "(checkpoint + read copy + ring).")
    bench_info = rec.evidence.get("bench")
    head = ["config", "config string", "bytes/step/layer"]
    if layers:
        head.append(f"bytes/step × {layers} layers")
    head += ["vs FP32 traffic", "state held/seq/layer"]
    if bench_info:
        head += [f"measured µs/step (batch {bench_info['batch']})", "speed-up vs conv. FP32"]
    rows = []
    for c in sorted(rec.candidates, key=lambda c: c.cost.bytes_per_step):
        row = [c.name, str(c.config), fmt_bytes(c.cost.bytes_per_step)]
        if layers:
            row.append(fmt_bytes(c.cost.bytes_per_step * layers))
        row += [f"{c.cost.traffic_vs_fp32:.3f}", fmt_bytes(c.cost.state_bytes)]
        if bench_info:
            row += [fmt_num(c.cost.window_us, 4) if c.cost.window_us is not None else "–",
                    f"{c.cost.speedup_vs_conv_fp32:.2f}×"
                    if c.cost.speedup_vs_conv_fp32 is not None
                    and math.isfinite(c.cost.speedup_vs_conv_fp32) else "–"]
        rows.append(row)
    s.add(Table("Cost per config", head, rows, right=set(range(2, len(head)))))
    if bench is not None and bench_info:
        peers = bench.peers(bench_info["shape"], bench_info["batch"])
        if peers:
            s.add("Peer kernels measured in the same run: " + ", ".join(
                f"{p.name} {p.window_us:,.1f} µs" for p in peers) + ".")
    png = plots.cost_tradeoff(rec)
    if png is not None:
        s.add(Figure("cost_vs_drift", "Cost vs drift",
                               "Each config's cost against its drift in the budget's bucket; "
                               "green: inside the whole budget, star: the recommendation.", png))
    return s


def build_report(results: ModelResults, budget: Budget | None = None, *,
                 bench: Benchmark | None = None, batch: int | None = None,
                 shape: str | None = None, cost_basis: str = "auto",
                 now: datetime | None = None) -> Report:
    """Recommend with ``budget`` (default budget when None) and lay out the report. A
    recommendation that cannot be made (no SSM shape, no drift) is reported, not raised."""
    from ..recommend import DEFAULT_BUDGET, InputError, recommend

    budget = budget or DEFAULT_BUDGET
    rec = None
    error = None
    try:
        rec = recommend(results, budget, shape=shape, bench=bench, batch=batch,
                        cost_basis=cost_basis)
    except InputError as e:
        error = str(e)
    sections: list[Section] = []
    rs = Section("Recommendation")
    if rec is not None:
        rs.add(*recommendation_items(rec))
    else:
        rs.add(f"No recommendation: {error}")
    sections.append(rs)
    if results.drift is not None:
        sections += _drift_sections(results, rec, budget)
    if results.tasks is not None:
        sections.append(_task_section(results, budget))
    if rec is not None:
        sections.append(_cost_section(rec, bench))
    issues = results.issues
    prov = Section("Provenance")
    if results.drift is not None:
        d = results.drift
        v = d.raw.get("versions") or {}
        prov.add(
            f"Drift: `{d.path}`; model type {d.model_type or '?'}; device "
            f"{d.raw.get('device', '?')}, {d.raw.get('dtype', '?')}; "
            + (", ".join(f"{k} {val}" for k, val in v.items()) or "versions not recorded") + ".")
    if results.tasks is not None:
        prov.add(f"Tasks: `{results.tasks.path}`.")
    if issues:
        prov.add("**Problems in the results** (configs affected are rejected):")
        prov.add(Bullets([str(i) for i in issues]))
    sections.append(prov)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    return Report(results.model, results, rec, error, sections, stamp)
