"""The window-length table of a decode sweep over several L (``python -m benchmarks.decode
--L 8 16 32 64 --window-only``): one row per (preset, L, batch, shape) with the time per step,
the ratio to the conventional FP32 step timed in the same run and the fraction of the copy
bandwidth measured in the same run, and per (preset, shape, batch) the fastest L beside the
L the byte model favours. ``replayssm-quant configs --bench-table`` and ``recommend --bench``
read ``window_l.json`` (or ``.csv``) as they read ``decode.json``.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.harness import write_rows
from replayssm_quant.precision import SHAPES, best_window_by_bytes, parse_config, window_name
from replayssm_quant.results import benchmark_from_rows

COLUMNS = ("shape", "kind", "batch", "preset", "config", "config_string", "L", "window_us",
           "speedup_vs_conv_fp32", "bw_frac_window", "bytes_per_step",
           "byte_bound_vs_conv_fp32", "layers", "mode")


def window_rows(rows: list[dict], shapes=None) -> list[dict]:
    """The step rows of a decode sweep (verify rows and peer kernels left out) with their
    preset's name (``preset``), whether theirs is the fastest L measured for that preset at
    that (shape, batch) (``fastest``) and the L of the same lengths with the fewest modelled
    bytes (``bytes_best_L``); conventional steps keep L = 1 and no marks."""
    shapes = SHAPES if shapes is None else shapes
    steps = [r for r in rows if _config(r) is not None and not str(r["config"]).startswith("verify ")]
    best = _fastest(steps)
    lengths: dict[tuple, list[int]] = {}
    for r in steps:
        if r["L"] > 1:
            lengths.setdefault((r["shape"], window_name(_config(r))), []).append(r["L"])
    out = []
    for r in steps:
        cfg = _config(r)
        row = {k: r[k] for k in COLUMNS if k in r and k != "preset"}
        row["preset"] = window_name(cfg) if cfg.L > 1 else cfg.label
        if cfg.L > 1:
            row["fastest"] = best.get((r["shape"], r["batch"], row["preset"])) == cfg.L
            shape = shapes.get(r["shape"])
            Ls = sorted(set(lengths[(r["shape"], row["preset"])]))
            row["bytes_best_L"] = best_window_by_bytes(cfg, shape, Ls) if shape else None
        out.append(row)
    return out


def _config(row: dict):
    try:
        return parse_config(str(row.get("config_string", "")))
    except ValueError:
        return None


def _fastest(rows: list[dict]) -> dict[tuple, int]:
    """(shape, batch, preset) -> the L of its fastest finite window, through the same
    reader ``recommend`` uses."""
    finite = [r for r in rows if isinstance(r.get("window_us"), (int, float))
              and math.isfinite(r["window_us"])]
    if not finite:
        return {}
    bench = benchmark_from_rows("sweep", ((f"row {i}", r) for i, r in enumerate(finite)))
    return {(e["shape"], e["batch"], e["preset"]): e["best_L"] for e in bench.window_table()}


def window_markdown(rows: list[dict], meta: dict) -> str:
    """Per (shape, batch): each preset's time per step at every L, the fastest in bold, with
    its ratio to the conventional FP32 step and its share of copy bandwidth."""
    Ls = sorted({r["L"] for r in rows if r["L"] > 1})
    lines = [f"# Window length per shape on {meta['device']}", "",
             f"Copy bandwidth measured in the same run: {meta['copy_bandwidth'] / 1e12:.3f} TB/s "
             f"(read + write). Command: `{' '.join(meta['argv'])}`", "",
             "Each cell: µs per step (window average) / speed-up over the conventional FP32 "
             "step of the same run / share of copy bandwidth; the fastest L in bold; "
             "'bytes' is the L of these with the fewest modelled bytes.", ""]
    for shape, batch in sorted({(r["shape"], r["batch"]) for r in rows}):
        block = [r for r in rows if (r["shape"], r["batch"]) == (shape, batch) and r["L"] > 1]
        if not block:
            continue
        lines += [f"## {shape}, batch {batch}", "",
                  "| preset | " + " | ".join(f"L={L}" for L in Ls) + " | fastest | bytes |",
                  "|---|" + "---:|" * (len(Ls) + 2)]
        for preset in dict.fromkeys(r["preset"] for r in block):
            by_L = {r["L"]: r for r in block if r["preset"] == preset}
            cells = []
            for L in Ls:
                r = by_L.get(L)
                if r is None:
                    cells.append("-")
                    continue
                c = (f"{r['window_us']:.1f} / {r.get('speedup_vs_conv_fp32', float('nan')):.2f}x"
                     f" / {r.get('bw_frac_window', float('nan')):.2f}")
                cells.append(f"**{c}**" if r.get("fastest") else c)
            fast = next((L for L, r in by_L.items() if r.get("fastest")), None)
            bytes_L = next(iter(by_L.values())).get("bytes_best_L")
            lines.append(f"| {preset} | " + " | ".join(cells) + f" | {fast or '-'} | "
                         f"{bytes_L or '-'} |")
        lines.append("")
    return "\n".join(lines)


def write_window_table(out: Path, rows: list[dict], meta: dict, shapes=None) -> list[dict]:
    """window_l.json (``meta``, ``rows`` and ``best``: per (shape, batch, preset) the time at
    every L and the fastest), window_l.csv and window_l.md under ``out``."""
    table = window_rows(rows, shapes)
    finite = [r for r in table if isinstance(r.get("window_us"), (int, float))
              and math.isfinite(r["window_us"])]
    best = (benchmark_from_rows(out / "window_l.json", ((f"row {i}", r) for i, r in
                                                        enumerate(finite))).window_table()
            if finite else [])
    write_rows(out, "window_l", table, dict(meta=meta, rows=table, best=best),
               window_markdown(table, meta))
    return table
